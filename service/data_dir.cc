#include "service/data_dir.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace modelstate::data_dir {
namespace {

constexpr absl::string_view kAuditLog = "audit.log";
constexpr absl::string_view kAuditHashes = "audit.hashes";
constexpr absl::string_view kAuditIndex = "audit.index";
constexpr absl::string_view kAuditCheckpoint = "audit.checkpoint";
constexpr absl::string_view kAuditKey = "audit.key";
constexpr absl::string_view kClusterVolume = "cluster.volume";
constexpr absl::string_view kStaging = "staging";
constexpr absl::string_view kModules = "modules";
constexpr absl::string_view kSetAside = "set-aside";
constexpr absl::string_view kManifest = "manifest.json";
constexpr absl::string_view kTombstone = "deleted.json";
constexpr absl::string_view kUncommitted = "uncommitted";
constexpr absl::string_view kMoveMark = "moving.json";
constexpr absl::string_view kDataPrefix = "data-";
constexpr absl::string_view kDataSuffix = ".safetensors";
// What base/file_util's TempPathFor appends.
constexpr absl::string_view kTempInfix = ".tmp.";

}  // namespace

std::string SharedMemorySocketPath(absl::string_view data_dir) {
  return absl::StrCat(data_dir, "/shm.sock");
}

std::string AuditLogPath(absl::string_view data_dir) {
  return absl::StrCat(data_dir, "/", kAuditLog);
}

std::string AuditHashesPath(absl::string_view data_dir) {
  return absl::StrCat(data_dir, "/", kAuditHashes);
}

std::string AuditIndexPath(absl::string_view data_dir) {
  return absl::StrCat(data_dir, "/", kAuditIndex);
}

std::string AuditCheckpointPath(absl::string_view data_dir) {
  return absl::StrCat(data_dir, "/", kAuditCheckpoint);
}

std::string AuditKeyPath(absl::string_view data_dir) {
  return absl::StrCat(data_dir, "/", kAuditKey);
}

std::string ClusterVolumePath(absl::string_view data_dir) {
  return absl::StrCat(data_dir, "/", kClusterVolume);
}

std::string StagingDir(absl::string_view data_dir) {
  return absl::StrCat(data_dir, "/", kStaging);
}

std::string ModulesDir(absl::string_view data_dir) {
  return absl::StrCat(data_dir, "/", kModules);
}

std::string SetAsidePath(absl::string_view data_dir, const ModuleName& name,
                         absl::string_view stamp) {
  return absl::StrCat(data_dir, "/", kSetAside, "/", name.ns, "/", name.name,
                      ".", stamp);
}

std::string NamespaceDir(absl::string_view modules_dir, absl::string_view ns) {
  return absl::StrCat(modules_dir, "/", ns);
}

std::string ModuleDir(absl::string_view modules_dir, const ModuleName& name) {
  return absl::StrCat(modules_dir, "/", name.ns, "/", name.name);
}

std::string ManifestPath(absl::string_view module_dir) {
  return FilePath(module_dir, kManifest);
}

std::string TombstonePath(absl::string_view module_dir) {
  return FilePath(module_dir, kTombstone);
}

std::string UncommittedPath(absl::string_view module_dir) {
  return FilePath(module_dir, kUncommitted);
}

std::string MoveMarkPath(absl::string_view module_dir) {
  return FilePath(module_dir, kMoveMark);
}

std::string FilePath(absl::string_view module_dir, absl::string_view file) {
  return absl::StrCat(module_dir, "/", file);
}

std::string DataFileName(uint64_t number) {
  return absl::StrCat(kDataPrefix, number, kDataSuffix);
}

uint64_t DataFileNumber(absl::string_view file_name) {
  if (!absl::ConsumePrefix(&file_name, kDataPrefix) ||
      !absl::ConsumeSuffix(&file_name, kDataSuffix)) {
    return 0;
  }
  uint64_t number = 0;
  return absl::SimpleAtoi(file_name, &number) ? number : 0;
}

absl::string_view TempFileTarget(absl::string_view file_name) {
  return file_name.substr(0, file_name.find(kTempInfix));
}

}  // namespace modelstate::data_dir
