// libFuzzer target for module specs, along the two ways one reaches the
// core: the first input byte picks the format of the rest.
//   even: a binary modelstate.v1.BuildModuleRequest, as the server receives
//         it over gRPC;
//   odd:  a JSON spec file, as `modelstatectl build` reads it (a bare
//         ModuleSpec, or a BuildModuleRequest when it has a "spec" key).
// Both then take the server's path: convert::SpecFromProto, the request's
// device and dtype fields, BuildModule, and the description of the result.
// A module built on cpu must also take back its own state_dict after a trip
// through the state stream; anything else aborts.
//
// The build runs under small limits (the server's own knobs, set low), so
// that no input can make it allocate or initialise more than a few MiB;
// "meta" builds allocate nothing at all and may describe huge modules.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/module.h"
#include "core/state_stream.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/json_util.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "nn/module_spec.h"
#include "proto/service_convert.h"
#include "tests/fuzz/fuzz_support.h"

namespace modelstate {
namespace {

using fuzz::DiscardProtobufLog;
using fuzz::Passed;
using fuzz::Verbose;

[[noreturn]] void Broken(const std::string& what) {
  std::fprintf(stderr, "spec_fuzz: invariant broken: %s\n", what.c_str());
  std::abort();
}

// The message is only built when the check fails: it is on the hot path.
#define REQUIRE(cond, message)    \
  do {                            \
    if (!(cond)) Broken(message); \
  } while (0)

// The bytes of every tensor of `sd`, in order; nullopt if one has none
// (meta).
std::optional<std::string> StreamOf(const StateDict& sd) {
  absl::StatusOr<std::unique_ptr<StateDictReader>> reader =
      StateDictReader::Create(sd, std::nullopt);
  REQUIRE(reader.ok(), absl::StrCat("StateDictReader::Create: ",
                                    reader.status().ToString()));
  std::string bytes;
  while (true) {
    absl::StatusOr<size_t> n = (*reader)->Read(size_t{1} << 16, &bytes);
    if (!n.ok()) return std::nullopt;
    if (*n == 0) return bytes;
  }
}

// Any module built on cpu takes back its own state_dict, sent through the
// service's stream (StateDictReader, then StateDictAssembler as the client
// rebuilds it) and loaded strictly, as a download followed by an upload
// does; and the load changes no byte.
void CheckRoundTrip(Module& root) {
  const StateDict before = root.GetStateDict();
  std::optional<std::string> bytes = StreamOf(before);
  if (!bytes) return;  // a layer put something on meta
  absl::StatusOr<std::unique_ptr<StateDictAssembler>> assembler =
      StateDictAssembler::Create(LayoutOf(before), StreamLimits{});
  REQUIRE(assembler.ok(), absl::StrCat("StateDictAssembler::Create: ",
                                       assembler.status().ToString()));
  absl::Status appended = (*assembler)->Append(*bytes);
  REQUIRE(appended.ok(), absl::StrCat("Append: ", appended.ToString()));
  absl::StatusOr<StateDict> copy = (*assembler)->Finish();
  REQUIRE(copy.ok(), absl::StrCat("Finish: ", copy.status().ToString()));
  RegistrationContext no_hooks;
  no_hooks.hooks = nullptr;
  absl::StatusOr<LoadResult> loaded =
      root.LoadStateDict(*copy, LoadOptions{}, no_hooks);
  REQUIRE(loaded.ok(), absl::StrCat("a module does not load its own "
                                    "state_dict: ",
                                    loaded.status().ToString()));
  REQUIRE(
      loaded->keys.missing_keys.empty() && loaded->keys.unexpected_keys.empty(),
      absl::StrCat("loading its own state_dict: ", loaded->keys.ToString()));
  REQUIRE(StreamOf(root.GetStateDict()) == bytes,
          "loading its own state_dict changed the module");
}

// A JSON parser verdict as an absl::Status (protobuf 3.21 has its own).
absl::Status JsonStatus(const google::protobuf::util::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(status.ToString());
}

// The CLI's parse: a bare spec unless the document has a "spec" key.
std::optional<v1::BuildModuleRequest> ParseJsonRequest(
    const std::string& text) {
  google::protobuf::Struct probe;
  if (!Passed("json", JsonStatus(google::protobuf::util::JsonStringToMessage(
                          text, &probe)))) {
    return std::nullopt;
  }
  v1::BuildModuleRequest request;
  google::protobuf::Message* target =
      probe.fields().count("spec") > 0
          ? static_cast<google::protobuf::Message*>(&request)
          : request.mutable_spec();
  if (!Passed("json", JsonStatus(google::protobuf::util::JsonStringToMessage(
                          text, target)))) {
    return std::nullopt;
  }
  return request;
}

BuildLimits FuzzLimits() {
  BuildLimits limits;
  limits.max_depth = 64;  // the server's default
  limits.max_entries = 4096;
  limits.max_tensor_bytes = 256 << 10;
  limits.max_total_bytes = 1 << 20;
  return limits;
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const bool json = (data[0] & 1) != 0;
  absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::optional<v1::BuildModuleRequest> parsed;
  if (json) {
    parsed = ParseJsonRequest(std::string(rest));
  } else if (v1::BuildModuleRequest binary; binary.ParseFromArray(
                 rest.data(), static_cast<int>(rest.size()))) {
    parsed = std::move(binary);
  }
  if (!parsed) {
    Passed("binary", absl::InvalidArgumentError("not a BuildModuleRequest"));
    return;
  }
  const v1::BuildModuleRequest& request = *parsed;

  // The server rejects a bad module name before it looks at the spec; the
  // name parser gets the input too, but the build goes on either way.
  Passed("module", convert::ParseModuleField(request.module()).status());
  absl::StatusOr<ModuleSpec> spec = convert::SpecFromProto(request.spec());
  if (!Passed("spec", spec.status())) return;
  BuildOptions options;
  options.seed = request.seed();
  options.hooks = nullptr;
  options.limits = FuzzLimits();
  absl::StatusOr<Device> device =
      convert::ParseDeviceField(request.device(), "device", Device::Cpu());
  absl::StatusOr<DType> dtype =
      convert::ParseDTypeField(request.dtype(), "dtype", DType::kFloat32);
  if (!Passed("device", device.status()) || !Passed("dtype", dtype.status())) {
    return;
  }
  options.device = *device;
  options.dtype = *dtype;
  absl::StatusOr<BuildResult> built = BuildModule(*spec, options);
  if (!Passed("build", built.status())) return;

  // What the service does with a module: describe it (with content hashes,
  // as GetModuleInfo can) and hand out its state_dict.
  v1::ModuleInfo info;
  convert::ModuleInfoToProto(*built->root, /*with_hashes=*/true, &info);
  StateDict state_dict = built->root->GetStateDict();
  if (!options.device.is_meta()) CheckRoundTrip(*built->root);
  if (Verbose()) {
    std::fprintf(stderr, "spec_fuzz: built %s on %s, %zu state_dict entries\n",
                 built->root->type_name().c_str(),
                 options.device.ToString().c_str(), state_dict.tensors.size());
  }
}

}  // namespace
}  // namespace modelstate

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(&modelstate::DiscardProtobufLog);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  modelstate::FuzzOne(data, size);
  return 0;
}
