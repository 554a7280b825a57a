// File: module_repository.h
// Durable module trees in a data directory, so that a restarted server comes
// back with every module exactly as it was: tree, key order, values bit for
// bit, dtypes, devices, requires_grad, persistence flags, training modes,
// plain attributes, shared submodules and tied tensors.
//
// Layout, one directory per module (service/data_dir.h names every file):
//   <dir>/<namespace>/<name>/manifest.json         the tree (the commit)
//   <dir>/<namespace>/<name>/data-<N>.safetensors  tensor bytes
//   <dir>/<namespace>/<name>/deleted.json          a deletion in progress
// The manifest describes every module and tensor of the tree and names, for
// every tensor with bytes, a data file, a key in it and the bytes' CRC-32C;
// it carries the SHA-256 of its own body, so a damaged manifest is caught
// too.
//
// A restart maps the data files instead of reading them (Storage::
// MapFileBytes): the bytes are served from the page cache, so a server can
// host more than its memory and restarts in the time its manifests take to
// parse, whatever the bytes hosted. Each storage's CRC-32C is checked the
// first time its bytes are needed (a GetStateDict, a forward, a to(), a
// digest) and again by the scrub (service/scrubber.h); damaged bytes are
// never served, and the error (DATA_LOSS) names the module, the key and the
// file.
//
// Save() writes only storages whose bytes changed since the last save (a
// storage's write version says so) into one new data file, then replaces the
// manifest: temporary file, fsync, rename, directory fsync. The manifest's
// rename is the commit point, so a crash at any moment leaves the old or the
// new state, never a mix. Data files the manifest no longer names are
// deleted after the commit (and at start-up); when the files still in use
// hold mostly dead bytes or grow many, the next save rewrites everything into
// one file.
//
// Every saved state carries a ChangeNote naming the change that produced
// it, so that start-up can check the audit log recorded it (a crash between
// the commit and the audit record would otherwise leave a change nobody
// recorded; see ModelStore::Restore).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<ModuleRepository> repo,
//                               ModuleRepository::Open("data/modules"));
//   ModuleRepository::LoadReport report = repo->LoadAll();
//   MODELSTATE_RETURN_IF_ERROR(repo->Save(name, *root, note));
#ifndef MODELSTATE_SERVICE_MODULE_REPOSITORY_H_
#define MODELSTATE_SERVICE_MODULE_REPOSITORY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/sync.h"
#include "core/module.h"
#include "service/module_name.h"

namespace modelstate {

// The change that produced a saved state (or a deletion).
struct ChangeNote {
  std::string type;  // the audit record type: "build", "register", ...
  std::string identity;
  std::string correlation_id;
  // The audit log's last sequence number before the change was recorded:
  // the change's own record, if any, comes after it.
  uint64_t audit_seq = 0;
};

// Bytes of one storage that are already in one of the module's data files,
// written there by someone else (a streamed load adopts its staging file):
// Save names them instead of writing them again.
struct PrewrittenBytes {
  std::shared_ptr<Storage> storage;  // holds exactly these bytes now
  DType dtype;
  std::string file;  // a data file name in the module's directory
  std::string key;
  uint32_t crc32c = 0;
};

class ModuleRepository;

// The bytes of a tree not saved yet, being written into a new data file of
// its module on a thread of their own (ModuleRepository::StartPrewrite), so
// that a build's durable write runs while its registrations are decided
// instead of after. Save adopts what did not change since; the file goes
// unless Keep() is called once a Save that adopted it succeeded.
//
//   MODELSTATE_ASSIGN_OR_RETURN(auto prewrite,
//                               repo->StartPrewrite(name, root));
//   ... decide; nothing changes the tree ...
//   prewrite->Wait();
//   ... apply the decisions ...
//   if (repo->Save(name, *root, note, prewrite->Unchanged()).ok()) {
//     prewrite->Keep();
//   }
class Prewrite {
 public:
  ~Prewrite();
  // Waits until the bytes are written (the tree may change from then on).
  void Wait();
  // After Wait: the bytes written whose storage has not changed since, for
  // Save. Empty when the write failed: Save then writes every byte itself
  // (and reports the disk's error if it fails again).
  std::vector<PrewrittenBytes> Unchanged() const;
  void Keep() { keep_ = true; }

 private:
  friend class ModuleRepository;
  Prewrite() = default;
  // The thread's work; its result goes to written_ and versions_.
  absl::Status Write(const Module& root);

  ModuleRepository* repo_ = nullptr;
  ModuleName name_;
  std::string path_;
  std::thread thread_;
  std::vector<PrewrittenBytes> written_;
  std::vector<uint64_t> versions_;  // each storage's version when written
  bool ok_ = false;
  bool keep_ = false;
};

// Thread-safe. Saves and removals of one module must not run concurrently
// (the ModelStore's per-module gate ensures it); different modules may.
class ModuleRepository {
 public:
  // Opens `dir`, creating it if needed.
  static absl::StatusOr<std::unique_ptr<ModuleRepository>> Open(
      std::string dir);

  // Makes `root` the durable state of `name`; returns once it is on disk.
  // `root` must not change during the call (with set_map_saved_bytes, its
  // tensors switch to views of the saved bytes at the end, same values).
  // FAILED_PRECONDITION for a module whose files could not be loaded at
  // start-up (they are kept for repair, never overwritten); other errors name
  // the file.
  absl::Status Save(const ModuleName& name, const Module& root,
                    const ChangeNote& note,
                    const std::vector<PrewrittenBytes>& prewritten = {});

  // A path for a new data file of `name` (in its directory, created if
  // needed), for a writer that Save will then adopt through
  // PrewrittenBytes. Same errors as Save.
  absl::StatusOr<std::string> ReserveDataFile(const ModuleName& name);
  // Ends a reservation: from now on the file is deleted unless a saved
  // manifest names it.
  void ReleaseDataFile(const ModuleName& name, const std::string& path);

  // Starts writing every storage of `root`, a tree that `name` does not
  // hold yet, into a new data file of `name` (see Prewrite). `root` must
  // not change until Prewrite::Wait returns. Same errors as
  // ReserveDataFile.
  absl::StatusOr<std::unique_ptr<Prewrite>> StartPrewrite(
      const ModuleName& name, std::shared_ptr<const Module> root);

  // What a cluster move sends of `name`: the paths of every data file its
  // committed manifest names, then the manifest's. Same concurrency rule as
  // Save: nothing may save `name` until the files have been read.
  absl::StatusOr<std::vector<std::string>> CommittedFiles(
      const ModuleName& name);

  // Returns once every file queued for deletion is gone (files nothing names
  // any more are deleted on a thread of their own: unlinking a large file
  // takes a while, and nobody needs to wait for it).
  void WaitForDeletions();
  ~ModuleRepository();

  // FAILED_PRECONDITION if `name` has files that could not be loaded at
  // start-up (Save refuses to overwrite them).
  absl::Status CheckUsable(const ModuleName& name);
  // For a module whose files could not be loaded (at start-up, or read
  // back after a failed save): DATA_LOSS naming why when bytes are damaged
  // or missing, FAILED_PRECONDITION for any other cause (a device this
  // server lacks); OK otherwise.
  absl::Status Damaged(const ModuleName& name);

  // Reads the state of `name` that is committed on disk, after a Save that
  // failed: the caller puts it in place of the tree it could not save, so
  // that memory and disk agree again. What was left of the failed save is
  // deleted. If the saved state cannot be read either, the module is marked
  // damaged, as at start-up (its files are kept for repair), and the error
  // names the file. Same concurrency rule as Save.
  absl::StatusOr<std::shared_ptr<Module>> Reload(const ModuleName& name);

  // Removes `name` durably: a tombstone holding `note` is committed first,
  // then the files go. OK if it was never saved. The tombstone stays until
  // DropTombstone, so that a crash before the deletion is recorded elsewhere
  // shows up in the next LoadAll; DropTombstone removes it after the
  // module's files queued for deletion.
  absl::Status Remove(const ModuleName& name, const ChangeNote& note);
  void DropTombstone(const ModuleName& name);
  // Moves the directory of `name` to `destination` (a path outside this
  // repository; its parents are created) and forgets it: the files are kept
  // for an operator, and no later LoadAll finds them. FAILED_PRECONDITION
  // while a save or a reserved file of the name is under way. When the
  // move fails, the files stay and the name is refused as damaged ones are
  // (Damaged, CheckUsable) until a restart.
  absl::Status SetAside(const ModuleName& name, const std::string& destination);

  struct Loaded {
    ModuleName name;
    std::shared_ptr<Module> root;
    ChangeNote note;  // what produced the saved state
    uint64_t bytes = 0;
  };
  struct Removed {
    ModuleName name;
    ChangeNote note;
  };
  struct LoadReport {
    std::vector<Loaded> modules;
    // Deletions whose tombstone was still there (see Remove).
    std::vector<Removed> removed;
    // One per module that could not be loaded, naming the file and why;
    // those modules' files are left as they are.
    std::vector<absl::Status> errors;
  };
  // Reads every saved module's manifest and maps its data files (their
  // bytes are checked later: see above), and clears what crashed saves and
  // removals left behind. Tensors come back on their saved device (read,
  // and so checked, now when that is not the cpu); a device this
  // process does not have is an error for that module unless
  // `fallback_to_cpu`. Call once, before any Save.
  LoadReport LoadAll(bool fallback_to_cpu = false);

  // Takes in a module moved here from another replica: `manifest` is the
  // text of its manifest there; the data files it names were written to
  // paths ReserveDataFile gave (`received`: the sender's file name -> the
  // path here). Commits the manifest, with `note` in place of the sender's
  // change, and loads the module from it, every byte checked against its
  // CRC-32C. ALREADY_EXISTS when `name` has a manifest here; INVALID_ARGUMENT
  // when the manifest names a file not received, or another module. Ends
  // the reservations either way; on failure nothing of the import is left.
  //
  // The module carries a move mark ("in", from `from_replica`; see
  // MarkMove) from before its manifest commits.
  absl::StatusOr<Loaded> Import(
      const ModuleName& name, absl::string_view manifest,
      const std::map<std::string, std::string>& received,
      const ChangeNote& note, absl::string_view from_replica);

  // Cluster moves (data_dir::MoveMarkPath). Marks `name` durably as moving
  // (`direction` "out" or "in"; `peer` the other replica): from now on a
  // restart hosts it only if the cluster names this replica its owner.
  // FAILED_PRECONDITION when `name` has no committed manifest. The mark
  // goes with the module (Remove) or by SettleMove.
  absl::Status MarkMove(const ModuleName& name, absl::string_view direction,
                        absl::string_view peer);
  // Ends a move mark: the cluster names this replica the owner. OK when
  // there is none.
  absl::Status SettleMove(const ModuleName& name);
  // Whether `name` carries a move mark.
  bool InMove(const ModuleName& name) const;

  const std::string& dir() const { return dir_; }

  // With `on`, every save ends by switching the saved tree's CPU tensors to
  // views of the data files that now hold their bytes (as a restart would
  // map them), so that bytes built or loaded since the start live in the
  // page cache, not in this process's memory, and a server never needs
  // more memory than the module it is changing. Off by default: reads from
  // the page cache take 4 KiB page faults where process memory has huge
  // pages. Call before any Save.
  void set_map_saved_bytes(bool on) { map_saved_bytes_ = on; }

 private:
  explicit ModuleRepository(std::string dir);

  // Where one storage's bytes are on disk.
  struct StoredBytes {
    std::string file;
    std::string key;
    uint32_t crc32c = 0;
  };
  // What is on disk for one module: the stored bytes of every storage the
  // manifest names, by (write version, dtype), and the data files in use.
  struct ModuleFiles {
    // Used by Save and LoadAll only (one at a time per module).
    absl::flat_hash_map<std::string, StoredBytes> by_version;
    std::map<std::string, uint64_t> file_bytes;  // file name -> size
    // Guarded by the repository's mu_: reservations come from outside the
    // module's writer gate (a load streams before it takes the gate).
    uint64_t next_file = 1;
    absl::flat_hash_set<std::string> reserved;  // data files being written
    int saves = 0;                              // Saves running
  };

  std::string ModuleDir(const ModuleName& name) const;
  // A write into a module's directory (a Save, an Import's manifest),
  // counted while it lives, as a reservation is: no release or deletion
  // removes the directory it ensured under it (ReleaseDataFile,
  // DeleteQueued).
  class SaveInProgress {
   public:
    SaveInProgress(ModuleRepository& repo, ModuleFiles& files);
    ~SaveInProgress();
    SaveInProgress(const SaveInProgress&) = delete;
    SaveInProgress& operator=(const SaveInProgress&) = delete;

   private:
    ModuleRepository& repo_;
    ModuleFiles& files_;
  };
  // Creates the module's directory (durably) if it is not there, and
  // marks it uncommitted until its first manifest (CommittedFirstSave).
  absl::Status EnsureModuleDir(const ModuleName& name);
  void CommittedFirstSave(const std::string& dir);
  // Remembers that `name`'s files could not be loaded (`why`).
  void MarkDamaged(const ModuleName& name, const absl::Status& why);
  // The module's file record, created from the directory's contents the
  // first time.
  std::shared_ptr<ModuleFiles> FilesOf(const ModuleName& name);
  ModuleFiles& FilesOfLocked(const ModuleName& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a removal or a failed import: forgets what `name` had committed
  // and deletes its files (queued, at once, or not at all), but keeps its
  // record and the files it reserves while there are any (a build held by
  // its hooks, a load receiving): a deletion must not take the file a save
  // of the name will adopt once that build goes on.
  enum class Deletion { kNone, kQueued, kNow };
  void ForgetCommitted(const ModuleName& name, Deletion deletion);
  // `verify_now`: check every byte's CRC while loading (an import), not
  // when first needed (a restart, which must not read what it hosts).
  absl::StatusOr<Loaded> LoadOne(const ModuleName& name, bool fallback_to_cpu,
                                 bool verify_now, ModuleFiles& files);

  // Deletes the data and temporary files in `dir` that `files` (nullptr:
  // nothing) neither names nor reserves: queued, or at once when `now`.
  void DeleteUnused(const std::string& dir, const ModuleFiles* files,
                    bool now = false);
  // A new data file name for `files` (REQUIRES: mu_ held). Numbers never
  // repeat within the process, so a queued deletion can never hit a newer
  // file of the same name.
  std::string NextDataFile(ModuleFiles& files)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeleteQueued();
  void QueueDeletions(std::vector<std::string> paths)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  bool map_saved_bytes_ = false;
  Mutex mu_;
  CondVar deletions_changed_;
  std::deque<std::string> deletions_ ABSL_GUARDED_BY(mu_);
  bool deleting_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t min_next_file_ ABSL_GUARDED_BY(mu_) = 1;
  std::thread deleter_;
  std::map<std::string, std::shared_ptr<ModuleFiles>> files_
      ABSL_GUARDED_BY(mu_);
  // Modules whose files failed to load (full names).
  // Modules whose files could not be loaded, with why.
  absl::flat_hash_map<std::string, absl::Status> damaged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_MODULE_REPOSITORY_H_
