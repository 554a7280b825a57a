// File: model_service.h
// The service the RPC handlers call, free of any transport type: one method
// per RPC, taking an authenticated Caller and plain request values. It
// decides who may do what (through the AccessGate), counts each identity's
// streams, refuses changes while the audit log is failing, pages listings
// and audit queries and hides what a caller may not see, admits
// subscriptions, and decides how a streamed load is staged; the work itself
// is ModelStore's, SubscriberHub's and AuditLog's.
//
// A handler converts its request (proto/service_convert.h), authenticates
// the call, calls one method and converts the result back:
//
// Example:
//   ModelService service(&store, &hub, audit, auth, options);
//   MODELSTATE_ASSIGN_OR_RETURN(Caller caller,
//                               service.Authenticate(credentials, "Delete"));
//   MODELSTATE_RETURN_IF_ERROR(service.DeleteModule(caller, name));
#ifndef MODELSTATE_SERVICE_MODEL_SERVICE_H_
#define MODELSTATE_SERVICE_MODEL_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "core/device.h"
#include "core/module.h"
#include "core/state_digest.h"
#include "core/state_stream.h"
#include "nn/module_spec.h"
#include "service/access_gate.h"
#include "service/audit_log.h"
#include "service/authenticator.h"
#include "service/checkpoint_signer.h"
#include "service/limits.h"
#include "service/model_store.h"
#include "service/module_name.h"
#include "service/stream_limiter.h"
#include "service/subscriber_hub.h"

namespace modelstate {

class ModelService;
class StagedStateDict;

// Called with a module while its tree is locked for reading.
using ModuleVisitor = absl::FunctionRef<void(const Module&)>;

struct BuildModuleArgs {
  ModuleName module;
  ModuleSpec spec;
  uint64_t seed = 0;
  Device device = Device::Cpu();
  DType dtype = DType::kFloat32;
  // Store nothing if any registration is blocked.
  bool all_or_nothing = false;
};

// RegisterParameter / RegisterBuffer: a tensor, an initialiser, or None.
struct RegisterTensorArgs {
  ModuleName module;
  std::string path;  // the submodule to register into ("" = the root)
  std::string name;
  EntryKind kind = EntryKind::kParameter;
  Tensor tensor;                   // when given
  std::optional<TensorSpec> init;  // drawn with `seed` instead
  uint64_t seed = 0;
  bool persistent = true;     // buffers
  bool requires_grad = true;  // parameters
};

// RegisterSubmodule: a spec to build, a module already in the tree, or
// None (neither).
struct RegisterSubmoduleArgs {
  ModuleName module;
  std::string path;
  std::string name;
  std::optional<ModuleSpec> spec;
  uint64_t seed = 0;
  Device device = Device::Cpu();
  DType dtype = DType::kFloat32;
  std::optional<std::string> existing_path;
};

struct RemoveEntryArgs {
  ModuleName module;
  std::string path;
  std::string name;
};

struct ListModulesArgs {
  std::string ns;          // "" = every namespace the caller may read
  int32_t page_size = 0;   // 0 = the default (100); at most 1000
  std::string page_token;  // a previous page's next_page_token
};

struct ModulePage {
  std::vector<ModuleSummary> modules;
  std::string next_page_token;  // "" on the last page
};

struct GetStateDictArgs {
  ModuleName module;
  uint32_t chunk_bytes = 0;           // 0 = Limits::default_chunk_bytes
  std::optional<DType> target_dtype;  // floating point only
  SnapshotFilter filter;
};

// A state_dict on its way out: its header and bytes in chunks. Holds one of
// the caller's stream slots while it lives.
// A GetStateDict or LoadStateDict under way, known to its service so that
// a reload of the token file that revokes its caller stops it
// (ModelService::RecheckTransfers): a leaked token revoked must not go on
// taking state out, or putting it in. Untracked when destroyed.
// Thread-safe.
class Transfer {
 public:
  ~Transfer();
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  // OK, or why a reload revoked the transfer (UNAUTHENTICATED or
  // PERMISSION_DENIED): the stream ends with it at its next message.
  absl::Status status() const;
  // A load's point of no return: its status, and from then on a reload
  // leaves it alone (it is already applying, as if the reload came after
  // it), neither revoking it nor recording a denial for it.
  absl::Status Commit();
  // Called when a revoked transfer is still under way after a grace
  // period (a client that stalls sends or reads no next message), while
  // the transfer is still tracked: the handler cancels its call there.
  void set_stop(std::function<void()> stop);

 private:
  friend class ModelService;
  Transfer() = default;

  ModelService* service_ = nullptr;
  uint64_t id_ = 0;
  Caller caller_;
  const char* rpc_ = "";
  Permission permission_ = Permission::kRead;
  ModuleName module_;
  // Waits while a reload's denial of this transfer is decided but not yet
  // in the audit log, so that whoever is told of it can find it there.
  void AwaitDenialLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
  bool denial_unrecorded_ ABSL_GUARDED_BY(mu_) = false;
  mutable CondVar denial_recorded_;
  std::function<void()> stop_ ABSL_GUARDED_BY(mu_);
};

struct StateDictDownload {
  std::unique_ptr<StateDictReader> reader;
  uint32_t chunk_bytes = 0;
  std::unique_ptr<StreamLimiter::Slot> slot;
  std::unique_ptr<Transfer> transfer;  // never null
};

struct LoadStateDictArgs {
  ModuleName module;
  StateDictLayout layout;
  LoadOptions options;
};

// One streamed load_state_dict: the bytes the layout announced, then
// Finish. Nothing touches the module before Finish, and nothing at all if
// the session is dropped first. A copying load stages its bytes on disk
// and reads each entry straight into the module's tensor; an assigning load
// installs new tensors, which must be in memory anyway. Thread-compatible.
class LoadSession {
 public:
  ~LoadSession();
  // The next bytes of the stream; errors (too many bytes, ...) end it.
  absl::Status Append(std::string bytes);
  // Loads the state_dict: INVALID_ARGUMENT if bytes are missing, the
  // store's errors otherwise. A load that fails before the store applies it
  // (bytes missing) is recorded in the audit log like one that fails there.
  absl::StatusOr<LoadResult> Finish();
  // The stream ended early (cancelled, or a message out of place): records
  // the failed load and returns `why`.
  absl::Status Fail(absl::Status why);
  // Append and Finish fail with its status once it is revoked: a revoked
  // load applies nothing.
  Transfer& transfer() { return *transfer_; }

 private:
  friend class ModelService;
  LoadSession() = default;

  ModelStore* store_ = nullptr;
  OperationContext ctx_;
  ModuleName module_;
  uint64_t incarnation_ = 0;  // the module the load began on
  LoadOptions options_;
  // What arrived, entry by entry: the audit record's digest. Declared
  // before staged_, whose observer thread updates it, so that it outlives
  // that thread.
  std::unique_ptr<StateDictStreamDigest> digest_;
  std::unique_ptr<StagedStateDict> staged_;        // copying loads
  std::unique_ptr<StateDictAssembler> assembler_;  // assigning loads
  std::unique_ptr<StreamLimiter::Slot> slot_;
  std::unique_ptr<Transfer> transfer_;
};

struct MoveModuleArgs {
  ModuleName module;
  std::optional<Device> device;
  std::optional<DType> dtype;
  // Module.type(): `dtype` (set) converts every tensor, not only floating
  // ones.
  bool convert_all = false;
};

struct ForwardArgs {
  ModuleName module;
  std::string path;
  std::vector<Tensor> inputs;  // undefined tensors are None
  // Unset: each module's own mode. Only an eval-mode call only reads.
  std::optional<bool> training;
  uint64_t seed = 0;
};

// One subscriber's stream, admitted: attaches the subscription the stream
// asks for (once the caller's rights allow it) and passes its answers on.
// Holds one of the caller's stream slots while it lives. Thread-compatible
// (a stream's reads come one at a time).
class SubscriberSession {
 public:
  ~SubscriberSession();
  // Checks `spec` against the caller's rights (namespaces it may review,
  // the largest data it may ask for), narrows what it sees, binds its name
  // to the caller's identity when callers are authenticated, and attaches
  // it to the hub. Returns the subscriber id.
  absl::StatusOr<uint64_t> Attach(SubscriptionSpec spec,
                                  std::shared_ptr<SubscriberChannel> channel);
  // An answer of the attached subscriber (ignored before Attach).
  void Answer(SubscriberAnswer answer);
  // The stream ended: the hub forgets the subscriber (no-op if none).
  void Detach();

 private:
  friend class ModelService;
  SubscriberSession() = default;

  ModelService* service_ = nullptr;
  uint64_t id_ = 0;
  Caller caller_;
  std::unique_ptr<StreamLimiter::Slot> slot_;
  uint64_t subscriber_id_ = 0;
};

struct AuditPage {
  std::vector<AuditRecord> records;
  // Set when more records may follow: the next query's after_seq.
  std::optional<uint64_t> next_after_seq;
};

// A WatchAudit stream: the records that match, as they are appended. Holds
// one of the caller's stream slots while it lives. Thread-compatible.
class AuditWatch {
 public:
  // The next matching records the caller may see; waits up to `wait` for
  // new ones, so may return none.
  absl::StatusOr<std::vector<AuditRecord>> Next(absl::Duration wait);

 private:
  friend class ModelService;
  AuditWatch() = default;

  AuditLog* audit_ = nullptr;
  AuditQuery query_;
  std::vector<std::string> visible_;
  uint64_t after_ = 0;
  std::unique_ptr<StreamLimiter::Slot> slot_;
  // Who watches, asked again when the token file's generation moves.
  AccessGate* gate_ = nullptr;
  Caller caller_;
  uint64_t generation_ = 0;
};

struct ModelServiceOptions {
  Limits limits;
  // Where copying loads stage their bytes in unlinked files when the store
  // has no repository (an existing directory).
  std::string staging_dir;
  // The audit log's file, for VerifyAudit.
  std::string audit_path;
  // Signs the audit log's checkpoints (not owned); null: the checkpoint
  // RPCs fail with FAILED_PRECONDITION.
  CheckpointSigner* checkpoints = nullptr;
};

// GetCheckpoint's answer.
struct AuditCheckpoint {
  std::string note;          // the signed checkpoint, with cosignatures
  std::string verifier_key;  // the log's, in signed-note form
};

// GetInclusionProof's answer.
struct AuditInclusion {
  uint64_t seq = 0;
  uint64_t tree_size = 0;
  MerkleHash leaf_hash{};
  std::vector<MerkleHash> proof;
  // The record's stored line (the leaf itself), when the caller may see
  // the record's namespace; "" otherwise.
  std::string record_line;
};

// AttestModule's answer.
struct ModuleAttestation {
  // A DSSE envelope (JSON form) over an in-toto Statement v1 with a SLSA
  // Provenance v1 predicate (service/attestation.h), signed with the audit
  // log's key.
  std::string envelope_json;
  std::string verifier_key;  // the log's, which verifies the envelope
  std::string checkpoint;    // the signed checkpoint the statement cites
};

// SignStateFile's answer.
struct SignedStateFile {
  // An OpenSSF Model Signing v1.0 bundle (base/attestation.h SignOmsBundle)
  // for the one file, signed with the audit log's key.
  std::string bundle_json;
  FileDigest file;           // the file's SHA-256 and size
  std::string verifier_key;  // the log's, which verifies the bundle
};

// Thread-safe.
class ModelService {
 public:
  // Nothing is owned; all must outlive the service. `audit` null: no audit
  // log (audit RPCs fail with FAILED_PRECONDITION). `auth` null: every
  // caller is an admin.
  ModelService(ModelStore* store, SubscriberHub* hub, AuditLog* audit,
               const Authenticator* auth, ModelServiceOptions options);

  const Limits& limits() const { return options_.limits; }

  // The caller of `rpc`: UNAUTHENTICATED / PERMISSION_DENIED (recorded as
  // "denied") without valid credentials.
  absl::StatusOr<Caller> Authenticate(const Credentials& credentials,
                                      absl::string_view rpc);
  // Whether `name` is hosted here (no caller: the cluster's bookkeeping).
  bool Hosts(const ModuleName& name) const { return store_->Contains(name); }
  // OK for an admin of every namespace (calls about the server or the
  // cluster as a whole); PERMISSION_DENIED (recorded) otherwise.
  absl::Status AllowAdmin(const Caller& caller, absl::string_view rpc) {
    return gate_.AllowAdmin(caller, rpc);
  }

  // Every method: PERMISSION_DENIED (recorded) when the caller may not, and
  // for changes UNAVAILABLE while the audit log is failing; the store's
  // errors otherwise. `describe` sees the module after the change.
  absl::StatusOr<BuildOutcome> BuildModule(const Caller& caller,
                                           const BuildModuleArgs& args,
                                           ModuleVisitor describe);
  absl::StatusOr<std::vector<RegistrationResult>> RegisterTensor(
      const Caller& caller, RegisterTensorArgs args);
  absl::StatusOr<std::vector<RegistrationResult>> RegisterSubmodule(
      const Caller& caller, RegisterSubmoduleArgs args);
  absl::StatusOr<std::vector<RegistrationResult>> RemoveEntry(
      const Caller& caller, const RemoveEntryArgs& args);
  // Describes the submodule at `path`: NOT_FOUND naming the path. When
  // `describe` reads the bytes (`reads_bytes`: hashes), they are checked
  // first (core/module.h CheckHeldBytes).
  absl::Status GetModule(const Caller& caller, const ModuleName& module,
                         const std::string& path, bool reads_bytes,
                         ModuleVisitor describe);
  // The devices this server has.
  std::vector<Device> ServerDevices() const;
  // INVALID_ARGUMENT naming the field for a bad namespace, page size or
  // token. A caller who may read only some namespaces sees only those.
  absl::StatusOr<ModulePage> ListModules(const Caller& caller,
                                         const ListModulesArgs& args);
  absl::Status DeleteModule(const Caller& caller, const ModuleName& module);
  // The two halves of a cluster move (ModelStore::MoveOut, ::MoveIn), for
  // admins only: MoveModuleToReplica's on the owner, ImportModule's on the
  // replica that takes the module.
  absl::Status MoveModuleOut(
      const Caller& caller, const ModuleName& module,
      const std::string& to_replica,
      absl::FunctionRef<
          absl::StatusOr<uint64_t>(const std::vector<std::string>& files)>
          send,
      const std::function<bool(const absl::Status&)>& still_owner);
  absl::StatusOr<std::string> ReserveImportFile(const Caller& caller,
                                                const ModuleName& module);
  void AbandonImport(const ModuleName& module,
                     const std::map<std::string, std::string>& received) {
    store_->AbandonImport(module, received);
  }
  absl::Status MoveModuleIn(const Caller& caller, const ModuleName& module,
                            const std::string& from_replica,
                            absl::string_view manifest,
                            const std::map<std::string, std::string>& received,
                            uint64_t bytes,
                            absl::FunctionRef<absl::Status()> take_ownership);
  // RESOURCE_EXHAUSTED for a chunk above Limits::max_chunk_bytes or too many
  // open streams; INVALID_ARGUMENT for a target dtype that is not floating.
  absl::StatusOr<StateDictDownload> GetStateDict(const Caller& caller,
                                                 GetStateDictArgs args);
  // A load stream as it opens, before its start message is read: the
  // caller must be allowed to write somewhere, and the stream takes one of
  // its identity's stream slots (RESOURCE_EXHAUSTED when none is left), so
  // stalled streams are refused and counted from the start.
  absl::StatusOr<std::unique_ptr<StreamLimiter::Slot>> OpenLoad(
      const Caller& caller);
  // A load that must fail (an atomic load whose layout does not fit) fails
  // here, before its bytes travel. `slot`: OpenLoad's (null: taken here).
  absl::StatusOr<std::unique_ptr<LoadSession>> LoadStateDict(
      const Caller& caller, LoadStateDictArgs args,
      std::unique_ptr<StreamLimiter::Slot> slot = nullptr);
  absl::Status MoveModule(const Caller& caller, const MoveModuleArgs& args,
                          ModuleVisitor describe);
  absl::Status SetTraining(const Caller& caller, const ModuleName& module,
                           bool training);
  // Needs read permission for an eval-mode call that changes nothing, write
  // otherwise (training mode, or an Embedding with max_norm).
  absl::StatusOr<std::vector<Tensor>> Forward(const Caller& caller,
                                              ForwardArgs args);

  // A subscriber stream: needs subscribe permission in some namespace and a
  // free stream slot.
  absl::StatusOr<std::unique_ptr<SubscriberSession>> OpenSubscription(
      const Caller& caller);
  absl::StatusOr<std::vector<SubscriberInfo>> ListSubscribers(
      const Caller& caller);
  // After the token file was reloaded: ends every subscription whose
  // caller's credentials no longer name a principal that may review all
  // the namespaces it could when it subscribed (UNAUTHENTICATED or
  // PERMISSION_DENIED, recorded once). Audit watches ask on their own.
  // Not reentrant: the server calls it from one thread at a time.
  void RecheckSubscribers();
  // After the token file was reloaded: revokes every GetStateDict and
  // LoadStateDict under way whose caller's credentials no longer name a
  // principal with its permission in the module's namespace (recorded as
  // denied); each ends with that status at its next message. Those still
  // under way after `grace` are stopped (Transfer::set_stop).
  void RecheckTransfers(absl::Duration grace = absl::Seconds(1));
  // Frees a subscriber name for any identity: admins only; the hub's
  // errors otherwise (SubscriberHub::ReleaseName); INVALID_ARGUMENT naming
  // the field for an empty name.
  absl::StatusOr<NameRelease> ReleaseSubscriberName(const Caller& caller,
                                                    const std::string& name,
                                                    bool force);

  // Audit reading needs audit permission in `query.ns` (or in some
  // namespace when it is ""), and shows only records of namespaces the
  // caller may audit. FAILED_PRECONDITION without an audit log.
  absl::StatusOr<AuditPage> QueryAudit(const Caller& caller, AuditQuery query);
  // Records after query.after_seq, as they come.
  absl::StatusOr<std::unique_ptr<AuditWatch>> WatchAudit(const Caller& caller,
                                                         AuditQuery query);
  absl::StatusOr<AuditVerification> VerifyAudit(const Caller& caller);

  // The verifiable log (service/model_service_audit.cc). Reading
  // checkpoints and consistency proofs needs audit or witness permission
  // somewhere, inclusion proofs audit permission; errors name the field.
  // `fresh`: sign one now when records came since the latest.
  absl::StatusOr<AuditCheckpoint> GetCheckpoint(const Caller& caller,
                                                bool fresh);
  // tree_size 0: the latest checkpoint's.
  absl::StatusOr<AuditInclusion> GetInclusionProof(const Caller& caller,
                                                   uint64_t seq,
                                                   uint64_t tree_size);
  absl::StatusOr<std::vector<MerkleHash>> GetConsistencyProof(
      const Caller& caller, uint64_t old_size, uint64_t new_size);
  // The audit records `caller`'s call writes between the two, in seq
  // order (every one, however many): what its response names. Records are
  // told apart by the call (OperationContext::call_id), not by the
  // client-chosen correlation id. Call EndAuditCall once for each
  // BeginAuditCall; without an audit log, nothing.
  void BeginAuditCall(const Caller& caller);
  std::vector<uint64_t> EndAuditCall(const Caller& caller);
  // Needs the witness role; see CheckpointSigner::AddCosignature.
  absl::StatusOr<std::string> AddCosignature(const Caller& caller,
                                             const std::string& note);

  std::vector<DeviceDescription> ListDevices(const Caller& caller);

  // Writes the refusals counted so far to the audit log (at shutdown, once
  // no call runs any more; see DenialRecorder::Stop).
  void FlushDenials() { gate_.FlushDenials(); }

  // Signs what `module` is and how it came to be (service/attestation.h).
  // Needs read and audit permission in its namespace; NOT_FOUND naming the
  // module; FAILED_PRECONDITION without a checkpoint signer, or for a
  // tensor on meta; RESOURCE_EXHAUSTED naming max_message_bytes when the
  // envelope would not fit in one response. In model_service_audit.cc.
  absl::StatusOr<ModuleAttestation> AttestModule(const Caller& caller,
                                                 const ModuleName& module);

  // Signs the file `modelstatectl get-state` writes for `args` (the state
  // file of core/state_digest.h) under the name `file_name`, hashing the
  // state as that file without writing it. Needs what GetStateDict and
  // AttestModule need; INVALID_ARGUMENT naming `file_name` when it is empty
  // or has a '/' or control character. In model_service_audit.cc.
  absl::StatusOr<SignedStateFile> SignStateFile(const Caller& caller,
                                                GetStateDictArgs args,
                                                absl::string_view file_name);

 private:
  friend class SubscriberSession;
  friend class Transfer;

  // A transfer of `module` by `caller`, tracked; refused as
  // RecheckTransfers would when a reload came since `caller` was
  // authenticated.
  absl::StatusOr<std::unique_ptr<Transfer>> TrackTransfer(
      const Caller& caller, const char* rpc, Permission permission,
      const ModuleName& module);

  // The subscribers attached now, by hub id, with the callers that opened
  // them (RecheckSubscribers).
  void TrackSubscriber(uint64_t id, const Caller& caller);
  // OK unless a reload narrowed the subscribers `caller` may learn of
  // (MayLearnOf), which its chains would otherwise go on naming; then
  // PERMISSION_DENIED, recorded (AccessGate::Revoke).
  absl::Status StillLearnsOf(const Caller& caller);
  void ForgetSubscriber(uint64_t id);

  absl::StatusOr<std::vector<RegistrationResult>> Register(
      const Caller& caller, const ModuleName& module,
      RegistrationRequest request);
  absl::Status Admit(const Caller& caller, SubscriptionSpec& spec);
  // What of `spec` the caller's principal decides: the namespaces it sees
  // and whom its chains name.
  void ScopeToPrincipal(const Caller& caller, SubscriptionSpec& spec);
  absl::Status HasAudit() const;
  absl::Status HasCheckpoints() const;
  // Audit permission somewhere, or witness permission somewhere when
  // `witness_too`; the denial is recorded as `rpc`'s.
  absl::Status AllowAuditRead(const Caller& caller, absl::string_view rpc,
                              bool witness_too);

  // Constant after construction.
  ModelStore* const store_;
  SubscriberHub* const hub_;
  AuditLog* const audit_;
  const ModelServiceOptions options_;
  AccessGate gate_;
  StreamLimiter streams_;
  // Held shared by a subscription from its policy check until it is
  // tracked, and exclusively by RecheckSubscribers to take its list: a
  // reload then either is seen by the check (the subscription is refused
  // before the hub sends it anything) or finds the subscription tracked.
  Mutex attach_mu_;
  mutable Mutex subscribers_mu_;
  absl::flat_hash_map<uint64_t, Caller> subscribers_
      ABSL_GUARDED_BY(subscribers_mu_);
  // Held while a transfer is tracked or untracked, and by RecheckTransfers
  // while it looks at them: a tracked transfer's call is still under way.
  Mutex transfers_mu_;
  // By an id of their own (an address may be reused by the next one).
  absl::flat_hash_map<uint64_t, Transfer*> transfers_
      ABSL_GUARDED_BY(transfers_mu_);
  uint64_t next_transfer_id_ ABSL_GUARDED_BY(transfers_mu_) = 0;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_MODEL_SERVICE_H_
