// File: golden.h
// Loads the golden vectors produced by real PyTorch 1.13 (shared/golden/),
// for tests that must agree with them.
//
// Example:
//   const nlohmann::json& cases = Golden("modules.json")["cases"];
#ifndef MODELSTATE_TESTS_TESTING_GOLDEN_H_
#define MODELSTATE_TESTS_TESTING_GOLDEN_H_

#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace modelstate::testing {

// The parsed file `name` from the golden directory (cached). Fails the test
// (and returns null) when it cannot be read.
inline const nlohmann::json& Golden(const std::string& name) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, nlohmann::json>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(name);
  if (it != cache->end()) return it->second;
  std::string path = std::string(MODELSTATE_GOLDEN_DIR) + "/" + name;
  std::ifstream in(path);
  nlohmann::json parsed;
  if (!in) {
    ADD_FAILURE() << "cannot open golden file " << path;
  } else {
    parsed = nlohmann::json::parse(in);
  }
  return cache->emplace(name, std::move(parsed)).first->second;
}

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_GOLDEN_H_
