// File: module_transfer.h
// A cluster move's files on either side of the wire (server/cluster_service.h
// carries them). The sender lists a module's committed files
// (ModelStore::MoveOut gives their paths, manifest last) and reads them in
// chunks; the receiver, a ModuleImport, writes each data file to a fresh
// name in its own data directory and syncs it, keeps the manifest in
// memory, and commits the module with ModelService::MoveModuleIn. An
// import that ends before its commit leaves nothing behind.
//
// Example (both sides in one place):
//   MODELSTATE_ASSIGN_OR_RETURN(std::vector<TransferFile> files,
//                               DescribeTransferFiles(paths));
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::unique_ptr<ModuleImport> import,
//       ModuleImport::Begin(service, caller, name, "modelstate-0", files));
//   MODELSTATE_RETURN_IF_ERROR(ReadTransferFiles(
//       paths, 1 << 20, [&](std::string& chunk) {
//         return import->Append(chunk).ok();
//       }));
//   MODELSTATE_RETURN_IF_ERROR(import->Commit([] { return absl::OkStatus();
//   }));
#ifndef MODELSTATE_SERVICE_MODULE_TRANSFER_H_
#define MODELSTATE_SERVICE_MODULE_TRANSFER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/file_util.h"
#include "service/model_service.h"
#include "service/module_name.h"

namespace modelstate {

// One file of a move: its name in the module's directory and its size.
struct TransferFile {
  std::string name;
  uint64_t bytes = 0;
};

// The names and sizes of `paths`, in order.
absl::StatusOr<std::vector<TransferFile>> DescribeTransferFiles(
    const std::vector<std::string>& paths);

// Reads `paths` in order, one after another, in chunks of at most
// `chunk_bytes`, each passed to `send` in a buffer it may keep the capacity
// of; stops early (OK) when `send` returns false. The files must not change
// meanwhile (ModelStore::MoveOut holds the module's writers off).
absl::Status ReadTransferFiles(const std::vector<std::string>& paths,
                               size_t chunk_bytes,
                               absl::FunctionRef<bool(std::string&)> send);

// The receiving half of a move. Not thread-safe.
class ModuleImport {
 public:
  // Checks the file list (data files "data-<N>.safetensors", then
  // "manifest.json", whose size is bounded: INVALID_ARGUMENT or
  // RESOURCE_EXHAUSTED naming `files`) and reserves a path for each data
  // file: the caller must be an admin, and `module` not hosted here
  // (ALREADY_EXISTS).
  static absl::StatusOr<std::unique_ptr<ModuleImport>> Begin(
      ModelService& service, const Caller& caller, ModuleName module,
      std::string from_replica, std::vector<TransferFile> files);
  // Abandons the import (its files go) unless it was committed.
  ~ModuleImport();

  // The next bytes of the files, in the list's order.
  absl::Status Append(absl::string_view data);
  // Once every byte came: the data files are synced, then the module is
  // committed, `take_ownership` asked, and the module hosted
  // (ModelService::MoveModuleIn). INVALID_ARGUMENT when bytes are missing.
  absl::Status Commit(absl::FunctionRef<absl::Status()> take_ownership);

  static constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

 private:
  ModuleImport(ModelService& service, const Caller& caller, ModuleName module,
               std::string from_replica, std::vector<TransferFile> files)
      : service_(service),
        caller_(caller),
        module_(std::move(module)),
        from_replica_(std::move(from_replica)),
        files_(std::move(files)) {}
  absl::Status Write(absl::string_view data);
  // The current file is complete: a data file is synced and closed.
  absl::Status NextFile();
  bool InManifest() const { return file_ + 1 == files_.size(); }

  ModelService& service_;
  const Caller caller_;
  const ModuleName module_;
  const std::string from_replica_;
  const std::vector<TransferFile> files_;
  // The sender's data file names -> the reserved paths; handed to
  // MoveModuleIn by Commit, abandoned otherwise.
  std::map<std::string, std::string> received_;
  std::vector<std::string> paths_;  // in file order
  std::string manifest_;
  size_t file_ = 0;
  uint64_t offset_ = 0;
  std::unique_ptr<ScopedFd> fd_;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_MODULE_TRANSFER_H_
