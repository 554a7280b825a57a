// File: data_dir.h
// The data directory's layout, named in one place (as leveldb's
// db/filename.h names a database's files):
//
//   <data_dir>/audit.log                              the audit log
//   <data_dir>/audit.hashes                           its Merkle tree's
//                                                     hashes (derived data)
//   <data_dir>/audit.index (+ -wal, -shm)             its SQLite index
//                                                     (derived data)
//   <data_dir>/audit.checkpoint                       the last checkpoint
//                                                     the server signed
//   <data_dir>/audit.key                              the log's signing key
//                                                     when --audit_key_file
//                                                     names no other file
//   <data_dir>/cluster.volume                         names this data
//                                                     directory to a
//                                                     cluster (random id)
//   <data_dir>/shm.sock                               the Unix socket
//                                                     same-host clients
//                                                     register shared
//                                                     memory at (unless
//                                                     --shm_socket names
//                                                     another)
//   <data_dir>/staging/                               unlinked files of
//                                                     loads being received
//   <data_dir>/modules/                               the ModuleRepository
//   <data_dir>/modules/<namespace>/<name>/            one module
//       manifest.json          the tree (its rename commits a save)
//       data-<N>.safetensors   tensor bytes (N counts up, never reused)
//       deleted.json           a deletion in progress (tombstone)
//       uncommitted            a first save not committed yet
//       moving.json            a cluster move of the module under way
//       <file>.tmp.<pid>.<n>   a temporary file of an interrupted write
//   <data_dir>/set-aside/<namespace>/<name>.<time>/   a module directory
//                                                     a cluster replica
//                                                     found it does not
//                                                     own (kept, never
//                                                     served)
//
// Example:
//   AuditLog::Open(data_dir::AuditLogPath("/var/lib/modelstate"));
//   ModuleRepository::Open(data_dir::ModulesDir("/var/lib/modelstate"));
#ifndef MODELSTATE_SERVICE_DATA_DIR_H_
#define MODELSTATE_SERVICE_DATA_DIR_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "service/module_name.h"

namespace modelstate::data_dir {

// Under the data directory.
std::string AuditLogPath(absl::string_view data_dir);
std::string AuditHashesPath(absl::string_view data_dir);
std::string AuditIndexPath(absl::string_view data_dir);
std::string AuditCheckpointPath(absl::string_view data_dir);
std::string AuditKeyPath(absl::string_view data_dir);
std::string ClusterVolumePath(absl::string_view data_dir);
std::string StagingDir(absl::string_view data_dir);
std::string ModulesDir(absl::string_view data_dir);
std::string SharedMemorySocketPath(absl::string_view data_dir);
// Where the module directory of `name` goes when it is set aside; `stamp`
// tells apart several copies of one name ("20261129T182501Z").
std::string SetAsidePath(absl::string_view data_dir, const ModuleName& name,
                         absl::string_view stamp);

// Under the modules directory.
std::string NamespaceDir(absl::string_view modules_dir, absl::string_view ns);
std::string ModuleDir(absl::string_view modules_dir, const ModuleName& name);

// In a module's directory.
std::string ManifestPath(absl::string_view module_dir);
std::string TombstonePath(absl::string_view module_dir);
// Present while a module's first save has not committed its manifest: data
// files there without a manifest are then leftovers of a crash, not a
// module whose manifest was lost.
std::string UncommittedPath(absl::string_view module_dir);
// Present while a cluster move of the module is under way, from before its
// files leave (the sender) or arrive (the receiver) until the cluster names
// its owner: a restart then hosts the copy only if etcd names this replica
// (a crash half-way would otherwise leave a copy no replica owns, served
// again after its owner deleted it).
std::string MoveMarkPath(absl::string_view module_dir);
// `file` (a data file name) in `module_dir`.
std::string FilePath(absl::string_view module_dir, absl::string_view file);
// "data-12.safetensors" for 12.
std::string DataFileName(uint64_t number);
// 12 for "data-12.safetensors"; 0 for any other name.
uint64_t DataFileNumber(absl::string_view file_name);
// The file a temporary file is written for ("manifest.json" for
// "manifest.json.tmp.77.3"); the name itself when it is no temporary file.
absl::string_view TempFileTarget(absl::string_view file_name);

}  // namespace modelstate::data_dir

#endif  // MODELSTATE_SERVICE_DATA_DIR_H_
