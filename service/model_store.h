// File: model_store.h
// The service's state: module trees stored under "namespace/name", shared by
// many threads. Every operation a client can ask for is here, free of any
// RPC type, so that server/ only converts protos.
//
// Concurrency: operations on different modules run in parallel; readers of
// one module (describe, state_dict snapshots) share a lock and never block
// each other; writers of one module are serialised by a per-module gate,
// which they hold while registration decisions are pending, and take the
// module's lock exclusively only to apply a fully decided change and save
// it, so a reader never sees a half-applied or an unsaved state.
//
// Example:
//   ModelStore store;
//   MODELSTATE_ASSIGN_OR_RETURN(ModuleName name, ParseModuleName("team/mlp"));
//   MODELSTATE_ASSIGN_OR_RETURN(BuildOutcome built,
//                               store.Build({}, name, spec, BuildOptions{},
//                               false));
//   MODELSTATE_ASSIGN_OR_RETURN(StateDict snapshot, store.Snapshot(name, {}));
#ifndef MODELSTATE_SERVICE_MODEL_STORE_H_
#define MODELSTATE_SERVICE_MODEL_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/sync.h"
#include "core/hooks.h"
#include "core/module.h"
#include "core/staged_state_dict.h"
#include "core/state_stream.h"
#include "nn/module_spec.h"
#include "service/audit_events.h"
#include "service/audit_log.h"
#include "service/module_name.h"
#include "service/module_repository.h"
#include "service/operation_context.h"
#include "service/quota.h"

namespace modelstate {

// One registration as decided in the end: the record (event, in-process
// decision, prior slot) and the final decision after every hook.
struct RegistrationResult {
  RegistrationRecord record;
  HookDecision final;
};

// Decides registrations after the in-process hooks (the service's remote
// subscribers). Returns one final decision per record, in order; a record
// whose in-process decision was a block must stay blocked.
class RegistrationDecider {
 public:
  virtual ~RegistrationDecider() = default;
  virtual std::vector<HookDecision> Decide(
      const OperationContext& ctx, const ModuleName& module,
      absl::Span<const RegistrationRecord> records) = 0;
};

struct BuildOutcome {
  std::vector<RegistrationResult> registrations;
};

// A module's summary for listings.
struct ModuleSummary {
  ModuleName name;
  std::string type;
  uint64_t num_parameters = 0;  // elements
  uint64_t total_bytes = 0;
  std::vector<std::string> devices;
};

// Which tensors a snapshot holds.
struct SnapshotFilter {
  std::string key_prefix;
  std::string key_glob;  // * and ?; empty matches everything
  enum class Selection {
    kStateDict,   // state_dict(), with its metadata
    kParameters,  // named_parameters()
    kBuffers,     // named_buffers(), non-persistent buffers included
  };
  Selection selection = Selection::kStateDict;
};

// A consistent copy of a module's state_dict (or parameters, or buffers):
// detached tensors sharing storage (later writes never change them) and
// what each entry is.
struct StateDictSnapshot {
  StateDict state;
  std::vector<EntryKind> kinds;  // parameter or buffer, in state order
};

// What a registration into an existing module carries.
struct RegistrationRequest {
  std::string path;  // dotted path of the module to register into
  std::string name;
  EntryKind kind = EntryKind::kParameter;
  // The value: a tensor (parameters, buffers), a module, or None.
  SlotValue value;
  bool removal = false;  // RemoveEntry instead of a registration
  // The spec of a submodule to build first (its own registrations come
  // before the module event); value.module is ignored then.
  std::optional<ModuleSpec> spec;
  BuildOptions build_options;  // for `spec`
  // Register the module already at this path of the same tree.
  std::optional<std::string> existing_path;
};

// Thread-safe.
class ModelStore {
 public:
  ModelStore() = default;
  ModelStore(const ModelStore&) = delete;
  ModelStore& operator=(const ModelStore&) = delete;

  // Sets who decides after the in-process hooks (nullptr: nobody; the
  // in-process decisions are final). Not owned; must outlive its use.
  void set_decider(RegistrationDecider* decider);
  // Every state change is recorded in `audit` (nullptr: none) and synced
  // before the operation returns. Not owned; must outlive its use.
  void set_audit_log(AuditLog* audit);
  // Every state change is saved in `repository` (nullptr: kept in memory
  // only) before it is recorded and the operation returns. A change that
  // cannot be saved is reported as an INTERNAL error naming the file, and
  // the module is read back from disk, so memory never holds what the disk
  // does not; if that fails too, the module is withdrawn (its files are
  // kept for repair). Not owned; must outlive its use.
  void set_repository(ModuleRepository* repository);
  // Asked just before every change is saved, and before a deletion (with a
  // repository): a change it refuses is not made, and the caller gets its
  // status (UNAVAILABLE) with the module read back as it was. A cluster
  // replica fences itself with it, so that a write that began while its
  // lease was live and then waited (a stream, a hook) does not land after
  // the lease lapsed. Empty (the default): every change may land.
  void set_write_fence(std::function<absl::Status()> fence);
  // How many builds may wait at once for another build of the same name
  // (Limits::max_build_waiters; 0, the default: any number). Each waiter
  // holds its caller's thread for as long as that build's hooks take.
  void set_max_build_waiters(int max_waiters);
  // How many builds wait for another build of `name` now; of any name,
  // without one (the modelstate_builds_waiting gauge).
  int BuildsWaiting(const ModuleName& name) const;
  int BuildsWaiting() const;

  // Per-namespace limits on modules and tensor bytes held (on devices with
  // storage; meta tensors hold none), checked before a build, registration
  // or move that would exceed one (RESOURCE_EXHAUSTED naming the limit).
  // May be replaced at any time (the server does on SIGHUP).
  void set_quotas(QuotaPolicy quotas);

  struct RestoreReport {
    size_t modules = 0;
    uint64_t bytes = 0;
    // Modules whose files could not be loaded (see ModuleRepository).
    std::vector<absl::Status> errors;
    // Changes found on disk that the audit log had not recorded (the
    // server stopped between saving and recording them); each now has a
    // "recovered" record.
    size_t recovered = 0;
    // Not OK when the audit log is shorter than a module's manifest says
    // it was (records were cut off): nothing was restored or recorded, and
    // the server must not start.
    absl::Status refused;
  };
  // Loads every module the repository holds (call once, before serving),
  // then makes sure the audit log recorded the change behind each saved
  // state and each finished deletion. Failures to load are recorded as
  // "restore" errors in the audit log too. A log shorter than the last
  // sequence number a manifest recorded is refused (report.refused), never
  // papered over with "recovered" records.
  RestoreReport Restore(bool fallback_to_cpu = false);

  // Builds `spec` and stores it as `name`. ALREADY_EXISTS if the name is
  // taken; with `all_or_nothing`, FAILED_PRECONDITION (nothing stored) if any
  // registration was blocked. Other errors from BuildModule.
  absl::StatusOr<BuildOutcome> Build(const OperationContext& ctx,
                                     const ModuleName& name,
                                     const ModuleSpec& spec,
                                     const BuildOptions& options,
                                     bool all_or_nothing);

  // One registration (or removal) inside an existing module. NOT_FOUND for
  // an unknown module or path; FAILED_PRECONDITION naming who blocked it.
  absl::StatusOr<std::vector<RegistrationResult>> Register(
      const OperationContext& ctx, const ModuleName& name,
      RegistrationRequest request);

  // Runs `fn` on the module under a shared lock. NOT_FOUND if unknown.
  absl::Status Read(const ModuleName& name,
                    absl::FunctionRef<absl::Status(const Module&)> fn) const;

  // A consistent snapshot of the module's state_dict, filtered.
  absl::StatusOr<StateDictSnapshot> Snapshot(
      const ModuleName& name, const SnapshotFilter& filter) const;

  // load_state_dict on the module. FAILED_PRECONDITION with PyTorch's text
  // when it fails (nothing changed when atomic). With options.assign the
  // installations go through the hooks and the decider. `sha256` (what
  // was loaded, core/state_digest.h StateSha256) goes into the audit
  // record when given.
  // `incarnation` (from Incarnation; 0: whichever module `name` names now)
  // holds a streamed load to the module it began on.
  absl::StatusOr<LoadResult> Load(const OperationContext& ctx,
                                  const ModuleName& name,
                                  const StateDict& state_dict,
                                  const LoadOptions& options,
                                  absl::string_view sha256 = {},
                                  uint64_t incarnation = 0);

  // Which module `name` names now: an id that is new each time a module is
  // built, restored or moved in under a name. A streamed load takes it when
  // it begins, so that a module deleted and built again while its bytes
  // came is not the one they land in (ABORTED, nothing loaded).
  absl::StatusOr<uint64_t> Incarnation(const ModuleName& name) const;

  // A load whose bytes are still to come (LoadStateDict over the wire, copy
  // mode): checks the module exists and, when atomic, that the layout fits
  // it (a load that must fail fails before its bytes travel, recorded like
  // Load's failures), then stages the bytes in a new data file of the
  // module (with a repository) or an anonymous file in `staging_dir`.
  absl::StatusOr<std::unique_ptr<StagedStateDict>> StageLoad(
      const OperationContext& ctx, const ModuleName& name,
      StateDictLayout layout, const StreamLimits& limits,
      const LoadOptions& options, const std::string& staging_dir);
  // Load() of a staged state_dict once all its bytes were appended. The
  // entries copied unchanged are not written to disk again: the staged
  // file becomes one of the module's data files.
  absl::StatusOr<LoadResult> LoadStaged(const OperationContext& ctx,
                                        const ModuleName& name,
                                        StagedStateDict& staged,
                                        LoadOptions options,
                                        absl::string_view sha256 = {},
                                        uint64_t incarnation = 0);

  // Records a load that failed before it could be applied (its stream
  // ended early, or bytes were missing); returns `why` (or the audit
  // failure).
  absl::Status RecordLoadFailure(const OperationContext& ctx,
                                 const ModuleName& name,
                                 const LoadOptions& options, absl::Status why);

  // module.to(device, dtype). Errors as Module::To. With `convert_all`
  // (and `dtype`): module.type(dtype) on `device`, every tensor converted,
  // integer and bool ones too; errors as Module::Type.
  absl::Status Move(const OperationContext& ctx, const ModuleName& name,
                    std::optional<Device> device, std::optional<DType> dtype,
                    bool convert_all = false);

  absl::Status SetTraining(const OperationContext& ctx, const ModuleName& name,
                           bool training);

  // module(*inputs) for the submodule at `path` (core/forward.h), in
  // `training` mode for this call if given (every module's own mode is
  // restored after). A training-mode call may change buffers (BatchNorm's
  // running statistics), and any call through an Embedding or EmbeddingBag
  // with max_norm renormalises the weight rows it looks up (as PyTorch
  // does, in eval mode too): such a call is saved and recorded ("forward").
  // Any other eval call changes nothing and is not recorded; it is a reader
  // (shared lock, no wait behind a writer's pending decisions) unless it
  // must switch modes. NOT_FOUND for an unknown module or path; Forward's
  // errors otherwise.
  //
  // A call that will change the module first asks `allow_change` (the
  // caller's write permission): its error is returned and nothing runs.
  absl::StatusOr<std::vector<Tensor>> Forward(
      const OperationContext& ctx, const ModuleName& name,
      const std::string& path, std::vector<Tensor> inputs,
      std::optional<bool> training, uint64_t seed,
      absl::FunctionRef<absl::Status()> allow_change);

  // NOT_FOUND if unknown.
  absl::Status Delete(const OperationContext& ctx, const ModuleName& name);

  // The sending half of a cluster move (server/cluster_service.h). Holds
  // `name`'s writers off (readers go on) while `send` passes its committed
  // files (paths, manifest last) to `to_replica` and returns the bytes
  // sent; once `send` says the module is hosted there (OK), deletes it
  // here, and writers that were waiting get UNAVAILABLE naming
  // `to_replica`. Recorded ("move_out") either way. FAILED_PRECONDITION
  // without a repository.
  absl::Status MoveOut(const OperationContext& ctx, const ModuleName& name,
                       const std::string& to_replica,
                       absl::FunctionRef<absl::StatusOr<uint64_t>(
                           const std::vector<std::string>& files)>
                           send,
                       const std::function<bool(const absl::Status& failure)>&
                           still_owner = nullptr);
  //
  // The files carry a move mark (ModuleRepository::MarkMove) from before
  // `send` runs; it goes with them. When `send` fails, `still_owner` (if
  // given) is asked with the failure, writers still held off, whether the
  // move certainly did not happen: true drops the mark; otherwise (the
  // other replica may have taken the module over, or may yet) it stays
  // until SettleMove.
  //
  // The receiving half. A path for one received data file of `name`:
  // ALREADY_EXISTS when `name` is hosted here.
  absl::StatusOr<std::string> ReserveImportFile(const ModuleName& name);
  // An import that ended before MoveIn: its files go.
  void AbandonImport(const ModuleName& name,
                     const std::map<std::string, std::string>& received);
  // Commits the received module (ModuleRepository::Import: `received` maps
  // the sender's data file names to the reserved paths) within its
  // namespace's quota, asks `take_ownership` (the cluster's record) and
  // hosts it. Nothing of the import is left when any step fails. Recorded
  // ("move_in", with `bytes`).
  absl::Status MoveIn(const OperationContext& ctx, const ModuleName& name,
                      const std::string& from_replica,
                      absl::string_view manifest,
                      const std::map<std::string, std::string>& received,
                      uint64_t bytes,
                      absl::FunctionRef<absl::Status()> take_ownership);

  // Whether `name`'s files carry a move mark: a cluster move of it was
  // under way, so the copy here is the module only if the cluster names
  // this replica its owner.
  bool InMove(const ModuleName& name) const;
  // Ends the mark, once the cluster names this replica the owner.
  absl::Status SettleMove(const ModuleName& name);

  // A hosted module this replica does not own (a copy left by a cluster
  // move that crashed half-way; `owner` the replica that does, "" when
  // none does): no longer served, its directory moved to `destination`
  // (kept for an operator; no restart loads it again). Recorded
  // ("set_aside", naming `owner` and `destination`).
  absl::Status SetAside(const ModuleName& name, const std::string& owner,
                        const std::string& destination);

  // Modules in name order, of namespace `ns` (all if empty), starting after
  // `after` (full name; "" = from the start), at most `limit`.
  std::vector<ModuleSummary> List(absl::string_view ns, absl::string_view after,
                                  size_t limit) const;

  // Number of modules.
  size_t size() const;
  // Whether `name` is hosted.
  bool Contains(const ModuleName& name) const { return Find(name).ok(); }

  // One namespace's modules and the tensor bytes they hold in memory (what
  // quotas count), with its quota: what the metrics report.
  struct DeviceUsage {
    std::string device;    // "cpu", "cuda:0", "meta"
    uint64_t modules = 0;  // modules with a tensor on it
    uint64_t bytes = 0;    // their tensor bytes held there
  };
  struct NamespaceUsage {
    std::string ns;
    uint64_t modules = 0;
    uint64_t bytes = 0;
    NamespaceQuota quota;
    std::vector<DeviceUsage> devices;  // in device name order
  };
  // Every namespace holding a module, in name order.
  std::vector<NamespaceUsage> Usage() const;

  // What one scrub pass found (see Scrub).
  struct ScrubReport {
    uint64_t modules = 0;   // modules visited
    uint64_t storages = 0;  // mapped storages checked
    uint64_t bytes = 0;     // their bytes
    // One DATA_LOSS per damaged storage ("'fc.weight': module 'a/b', ...").
    std::vector<absl::Status> damaged;
    uint64_t newly_damaged = 0;  // of those, found damaged by this pass
  };
  // Reads every byte the hosted modules map from their data files and
  // checks it against its CRC-32C again (Storage::CheckIntegrity), one
  // storage at a time and without holding any module's lock while reading:
  // damage found is reported here and by every later read of those bytes
  // (DATA_LOSS), so they are never served. Stops early once `stopping`
  // says so. Thread-safe.
  ScrubReport Scrub(absl::FunctionRef<bool()> stopping) const;

 private:
  // One hosted module.
  struct Entry {
    Entry(ModuleName n, std::shared_ptr<Module> r, uint64_t i)
        : name(std::move(n)), incarnation(i), root(std::move(r)) {}
    const ModuleName name;
    const uint64_t incarnation;  // see Incarnation()
    // Held by a writer for its whole operation, pending decisions included.
    Mutex gate;
    // Guards the tree: shared for readers, exclusive to apply a change.
    mutable Mutex mu ABSL_ACQUIRED_AFTER(gate);
    std::shared_ptr<Module> root ABSL_GUARDED_BY(mu);
    bool deleted ABSL_GUARDED_BY(mu) = false;
    // Set when it was deleted by a cluster move: where it went.
    std::string moved_to ABSL_GUARDED_BY(mu);
  };
  // Takes `entry` out of the store (deleted, or moved to `moved_to`):
  // callers that hold it see it gone. REQUIRES: the caller holds
  // entry.gate, and neither entry.mu nor mu_.
  void Withdraw(Entry& entry, const std::string& moved_to)
      ABSL_LOCKS_EXCLUDED(mu_, entry.mu);
  // What a caller of a deleted entry gets: NOT_FOUND, or UNAVAILABLE
  // naming the replica it moved to (a retry reaches it there).
  static absl::Status Gone(const Entry& entry)
      ABSL_SHARED_LOCKS_REQUIRED(entry.mu);

  // Modules and bytes a namespace has been promised by changes still under
  // way: counted by every quota check until the change lands or fails.
  struct Reserved {
    uint64_t modules = 0;
    uint64_t bytes = 0;
  };
  // One change's share of reserved_, given back when it is destroyed (the
  // change failed, or landed and is counted in entries_ from then on).
  class QuotaHold {
   public:
    QuotaHold() = default;
    QuotaHold(QuotaHold&& other) noexcept;
    QuotaHold& operator=(QuotaHold&&) = delete;
    ~QuotaHold();
    uint64_t bytes() const { return held_.bytes; }

   private:
    friend class ModelStore;
    ModelStore* store_ = nullptr;
    std::string ns_;
    Reserved held_;
  };

  absl::StatusOr<std::shared_ptr<Entry>> Find(const ModuleName& name) const;
  // Reserves `added_modules` more modules and `added_bytes` more bytes for
  // `name`'s namespace in `hold` if its quota allows them, counting what
  // its modules hold and what other changes reserved; RESOURCE_EXHAUSTED
  // naming the limit otherwise. `excluded` (may be null) is a module whose
  // current bytes do not count (it is being resized). The check and the
  // reservation are one step, so concurrent changes cannot both pass it.
  absl::Status Reserve(const ModuleName& name, uint64_t added_modules,
                       uint64_t added_bytes, const Entry* excluded,
                       QuotaHold& hold) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives `hold`'s reservation back (it lands in entries_ in the same step,
  // or the change is over).
  void ReleaseLocked(QuotaHold& hold) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes a build of `spec` will hold, from the shapes and dtypes of a
  // build on the meta device (nothing allocated, no hooks run); 0 when
  // `name`'s namespace has no byte quota, so nothing needs sizing.
  absl::StatusOr<uint64_t> BuildBytes(const ModuleName& name,
                                      const ModuleSpec& spec,
                                      BuildOptions options) const;
  // Reserves what an assigning load of `state_dict` adds to `entry`.
  absl::Status ReserveAssigned(const ModuleName& name, const Entry& entry,
                               const StateDict& state_dict, QuotaHold& hold)
      ABSL_LOCKS_EXCLUDED(entry.mu);
  // Final decisions for `records` (the in-process ones if no decider).
  std::vector<HookDecision> Decide(
      const OperationContext& ctx, const ModuleName& name,
      absl::Span<const RegistrationRecord> records);
  // Appends `record` (of an operation that ended with `result`) and syncs
  // the audit log. Returns `result`, or the audit failure when the record
  // cannot be made durable.
  absl::Status Record(const absl::Status& result, AuditRecord record);
  // FAILED_PRECONDITION naming both sizes when a manifest recorded more
  // audit records than the log has.
  absl::Status CheckAuditCoversManifests(
      const ModuleRepository::LoadReport& loaded) const;
  // The note a saved state (or deletion) carries: the change's type and
  // request, and where in the audit log its record must follow.
  ChangeNote NoteFor(const OperationContext& ctx, AuditType type) const;
  AuditLog* audit() const;
  ModuleRepository* repository() const;
  // The write fence's answer (OK without one).
  absl::Status CheckWriteFence() const;
  // Saves `entry`'s tree after a change of `type`; if that fails, puts the
  // saved tree back in place of the unsaved one (or withdraws the module)
  // and says so. REQUIRES: the caller holds entry.gate and entry.mu
  // exclusively, so nobody changes or reads the tree meanwhile.
  absl::Status Persist(const OperationContext& ctx, Entry& entry,
                       AuditType type,
                       const std::vector<PrewrittenBytes>& prewritten = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(entry.mu);
  absl::StatusOr<LoadResult> LoadImpl(
      const OperationContext& ctx, const ModuleName& name,
      const StateDict& state_dict, const LoadOptions& options,
      StagedStateDict* staged, absl::string_view sha256, uint64_t incarnation);
  // Claims `name` for a build (building_). While another build holds it,
  // waits for that one's outcome, up to ctx's deadline or cancellation
  // (DEADLINE_EXCEEDED, CANCELLED), unless max_build_waiters builds wait
  // already (RESOURCE_EXHAUSTED); after a wait, asks ctx.still_allowed
  // (its status if not OK); ALREADY_EXISTS if the name is hosted.
  absl::Status ClaimName(const OperationContext& ctx, const ModuleName& name)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A new entry, with the next incarnation.
  std::shared_ptr<Entry> NewEntry(const ModuleName& name,
                                  std::shared_ptr<Module> root);
  // The entry a load begun on `incarnation` (0: any) applies to; ABORTED
  // when the name now holds another module.
  absl::StatusOr<std::shared_ptr<Entry>> FindLoadTarget(
      const ModuleName& name, uint64_t incarnation) const;
  // Appends a "recovered" record for `note` unless the audit log has a
  // record of the change it names. Returns whether it appended one.
  absl::StatusOr<bool> RecordIfUnrecorded(const ModuleName& name,
                                          const ChangeNote& note);

  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> next_incarnation_{1};
  QuotaPolicy quotas_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Reserved, std::less<>> reserved_ ABSL_GUARDED_BY(mu_);
  // Names a Build has claimed and not yet hosted or given up: a second
  // build of one meanwhile waits, before it reserves quota, for the claim
  // to be released (claim_released_).
  std::set<std::string, std::less<>> building_ ABSL_GUARDED_BY(mu_);
  CondVar claim_released_;
  // Builds waiting for each claimed name, and how many may.
  std::map<std::string, int, std::less<>> build_waiters_ ABSL_GUARDED_BY(mu_);
  int max_build_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  // Moves whenever a namespace's modules or reservations change: a quota
  // check that summed the bytes of a namespace at an older epoch sums again.
  uint64_t quota_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  RegistrationDecider* decider_ ABSL_GUARDED_BY(mu_) = nullptr;
  AuditLog* audit_ ABSL_GUARDED_BY(mu_) = nullptr;
  ModuleRepository* repository_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::function<absl::Status()> write_fence_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_MODEL_STORE_H_
