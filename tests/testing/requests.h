// File: requests.h
// Test helpers for the service's requests: a ModuleSpec proto from its JSON
// mapping, a BuildModuleRequest, and the same spec built in-process to
// compare against.
//
// Example:
//   client->BuildModule(BuildRequest("team/lin", R"({"type": "Linear",
//                                    "args": [2, 2]})", 5));
//   StateDict want = LocalBuild(json, 5)->GetStateDict();
#ifndef MODELSTATE_TESTS_TESTING_REQUESTS_H_
#define MODELSTATE_TESTS_TESTING_REQUESTS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "nn/module_spec.h"
#include "proto/service_convert.h"

namespace modelstate::testing {

// Any request message from its JSON mapping.
template <typename Message>
Message ParseJson(const std::string& json) {
  Message message;
  auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << " in " << json;
  return message;
}

inline v1::ModuleSpec SpecProto(const std::string& json) {
  return ParseJson<v1::ModuleSpec>(json);
}

inline v1::BuildModuleRequest BuildRequest(const std::string& module,
                                           const std::string& json,
                                           uint64_t seed = 0) {
  v1::BuildModuleRequest r;
  r.set_module(module);
  *r.mutable_spec() = SpecProto(json);
  r.set_seed(seed);
  return r;
}

// The same spec built in this process, without hooks.
inline std::shared_ptr<Module> LocalBuild(const std::string& json,
                                          uint64_t seed = 0) {
  absl::StatusOr<ModuleSpec> spec = convert::SpecFromProto(SpecProto(json));
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return nullptr;
  BuildOptions options;
  options.seed = seed;
  options.hooks = nullptr;
  absl::StatusOr<BuildResult> built = BuildModule(*spec, options);
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? built->root : nullptr;
}

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_REQUESTS_H_
