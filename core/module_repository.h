// File: module_repository.h
// Durable module trees in a data directory, so that a restarted server comes
// back with every module exactly as it was: tree, order, values bit for bit,
// dtypes, devices, requires_grad, persistence flags, training mode, shared
// submodules and tied tensors.
//
// Layout: <dir>/<namespace>/<name>/manifest.json describes the tree and
// names, for every tensor, a safetensors data file and key in the same
// directory. Save() writes only tensors whose bytes changed since the last
// save into a new data file (temporary file, fsync, rename, directory fsync),
// then replaces the manifest the same way: the rename of the manifest is the
// commit point, so a crash at any moment leaves either the old or the new
// state, never a mix. Data files no manifest refers to are deleted after the
// commit and at start-up.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(auto repo,
//   ModuleRepository::Open("data/modules")); ModuleRepository::LoadReport
//   report = repo->LoadAll(); MODELSTATE_RETURN_IF_ERROR(repo->Save(name,
//   *root));
#ifndef MODELSTATE_CORE_MODULE_REPOSITORY_H_
#define MODELSTATE_CORE_MODULE_REPOSITORY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model_store.h"
#include "core/module.h"
#include "core/sync.h"

namespace modelstate {

// Thread-safe; Save/Remove of one module must not run concurrently (the
// ModelStore's per-module writer gate ensures it).
class ModuleRepository {
 public:
  // Opens (creating) `dir`.
  static absl::StatusOr<std::unique_ptr<ModuleRepository>> Open(
      std::string dir);

  // Makes `root` the durable state of `name`. Returns once it is on disk.
  absl::Status Save(const ModuleName& name, const Module& root);
  // Removes `name` (durably). OK if it was never saved.
  absl::Status Remove(const ModuleName& name);

  struct Loaded {
    ModuleName name;
    std::shared_ptr<Module> root;
  };
  struct LoadReport {
    std::vector<Loaded> modules;
    // One per module that could not be loaded, naming the file and why.
    std::vector<absl::Status> errors;
  };
  // Reads every saved module (tensors on their saved device; a device this
  // process does not have is an error for that module unless
  // `fallback_to_cpu`).
  LoadReport LoadAll(bool fallback_to_cpu = false);

  const std::string& dir() const { return dir_; }

 private:
  explicit ModuleRepository(std::string dir) : dir_(std::move(dir)) {}

  // Per module: where each storage version's bytes already are on disk.
  struct Saved {
    absl::flat_hash_map<uint64_t, std::pair<std::string, std::string>>
        by_version;
    uint64_t next_file = 1;
  };
  absl::StatusOr<std::shared_ptr<Module>> LoadOne(const ModuleName& name,
                                                  bool fallback_to_cpu,
                                                  Saved& saved);

  const std::string dir_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<Saved>> saved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_MODULE_REPOSITORY_H_
