#include "service/model_service.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/quote.h"
#include "base/status_macros.h"
#include "core/staged_state_dict.h"

namespace modelstate {
namespace {

// ListModules' page size when the request leaves it 0, and its largest.
constexpr size_t kDefaultListPageSize = 100;
constexpr int32_t kMaxListPageSize = 1000;
// The records one WatchAudit wake-up reads at most.
constexpr size_t kWatchBatch = 1000;

// Everything wrong with a ListModules request, before any listing: a bad
// namespace, page size or page token is INVALID_ARGUMENT naming the field.
absl::Status CheckListModulesArgs(const ListModulesArgs& args) {
  const std::string& ns = args.ns;
  if (!ns.empty() && !IsValidModuleNamePart(ns)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace: ", Quote(ns),
        " is not a valid namespace (1-128 characters of [A-Za-z0-9_.-])"));
  }
  if (args.page_size < 0 || args.page_size > kMaxListPageSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: ", args.page_size,
        " is out of range (0 for the default of ", kDefaultListPageSize,
        ", at most ", kMaxListPageSize, ")"));
  }
  // A token is the last module name of the previous page (of the same
  // namespace when one is asked for).
  const std::string& token = args.page_token;
  if (token.empty()) return absl::OkStatus();
  absl::StatusOr<ModuleName> last = ParseModuleName(token);
  if (!last.ok() || last->full() != token || (!ns.empty() && last->ns != ns)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: ", Quote(token),
                     " is not a next_page_token of a ListModules response",
                     ns.empty() ? "" : " for this namespace"));
  }
  return absl::OkStatus();
}

bool Everywhere(const std::vector<std::string>& namespaces) {
  return namespaces.size() == 1 && namespaces.front() == kAnyNamespace;
}

// The namespaces whose subscribers `caller` may learn of (MayLearnOf): those
// it may review or audit.
std::vector<std::string> MayLearnOfNamespaces(const Caller& caller) {
  std::vector<std::string> mine =
      caller.principal.NamespacesFor(Permission::kSubscribe);
  for (std::string& ns : caller.principal.NamespacesFor(Permission::kAudit)) {
    mine.push_back(std::move(ns));
  }
  return mine;
}

}  // namespace

ModelService::ModelService(ModelStore* store, SubscriberHub* hub,
                           AuditLog* audit, const Authenticator* auth,
                           ModelServiceOptions options)
    : store_(store),
      hub_(hub),
      audit_(audit),
      options_(std::move(options)),
      gate_(auth, audit, options_.limits),
      // Without authentication there are no identities to count, only peer
      // addresses, which channels share.
      streams_(gate_.authenticates() ? options_.limits.max_streams_per_identity
                                     : 0) {
  store_->set_max_build_waiters(options_.limits.max_build_waiters);
}

absl::StatusOr<Caller> ModelService::Authenticate(
    const Credentials& credentials, absl::string_view rpc) {
  return gate_.Authenticate(credentials, rpc);
}

absl::StatusOr<BuildOutcome> ModelService::BuildModule(
    const Caller& caller, const BuildModuleArgs& args, ModuleVisitor describe) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "BuildModule", Permission::kWrite, args.module));
  BuildOptions options;
  options.seed = args.seed;
  options.device = args.device;
  options.dtype = args.dtype;
  options.limits = BuildLimitsFrom(options_.limits);
  // A build that waited for another of its name goes on only if a reload
  // during the wait left the caller its rights (ModelStore::ClaimName).
  OperationContext ctx = caller.ctx;
  ctx.still_allowed = [this, &caller, &args]() -> absl::Status {
    if (gate_.policy_generation() == caller.policy_generation) {
      return absl::OkStatus();
    }
    return gate_.StillAllowsIn(caller, "BuildModule", Permission::kWrite,
                               args.module);
  };
  MODELSTATE_ASSIGN_OR_RETURN(
      BuildOutcome outcome,
      store_->Build(ctx, args.module, args.spec, options, args.all_or_nothing));
  MODELSTATE_RETURN_IF_ERROR(store_->Read(args.module, [&](const Module& m) {
    describe(m);
    return absl::OkStatus();
  }));
  return outcome;
}

absl::StatusOr<std::vector<RegistrationResult>> ModelService::Register(
    const Caller& caller, const ModuleName& module,
    RegistrationRequest request) {
  return store_->Register(caller.ctx, module, std::move(request));
}

absl::StatusOr<std::vector<RegistrationResult>> ModelService::RegisterTensor(
    const Caller& caller, RegisterTensorArgs args) {
  const bool parameter = args.kind == EntryKind::kParameter;
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, parameter ? "RegisterParameter" : "RegisterBuffer",
                  Permission::kWrite, args.module));
  RegistrationRequest r;
  r.path = std::move(args.path);
  r.name = std::move(args.name);
  r.kind = args.kind;
  r.value.persistent = args.persistent;
  Tensor tensor = std::move(args.tensor);
  // Drawn only now that the caller may: an initialiser may be large.
  if (args.init.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        tensor, CreateTensor(*args.init, args.seed, DType::kFloat32,
                             Device::Cpu(), BuildLimitsFrom(options_.limits)));
  }
  if (tensor.defined() && parameter) {
    MODELSTATE_ASSIGN_OR_RETURN(tensor,
                                MakeParameter(tensor, args.requires_grad));
  }
  r.value.tensor = std::move(tensor);
  r.build_options.limits = BuildLimitsFrom(options_.limits);  // max_entries
  return Register(caller, args.module, std::move(r));
}

absl::StatusOr<std::vector<RegistrationResult>> ModelService::RegisterSubmodule(
    const Caller& caller, RegisterSubmoduleArgs args) {
  MODELSTATE_RETURN_IF_ERROR(gate_.Allow(caller, "RegisterSubmodule",
                                         Permission::kWrite, args.module));
  RegistrationRequest r;
  r.path = std::move(args.path);
  r.name = std::move(args.name);
  r.kind = EntryKind::kModule;
  r.spec = std::move(args.spec);
  r.existing_path = std::move(args.existing_path);
  r.build_options.seed = args.seed;
  r.build_options.device = args.device;
  r.build_options.dtype = args.dtype;
  r.build_options.limits = BuildLimitsFrom(options_.limits);
  return Register(caller, args.module, std::move(r));
}

absl::StatusOr<std::vector<RegistrationResult>> ModelService::RemoveEntry(
    const Caller& caller, const RemoveEntryArgs& args) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "RemoveEntry", Permission::kWrite, args.module));
  RegistrationRequest r;
  r.path = args.path;
  r.name = args.name;
  r.removal = true;
  return Register(caller, args.module, std::move(r));
}

absl::Status ModelService::GetModule(const Caller& caller,
                                     const ModuleName& module,
                                     const std::string& path, bool reads_bytes,
                                     ModuleVisitor describe) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "GetModule", Permission::kRead, module));
  return store_->Read(module, [&](const Module& root) -> absl::Status {
    absl::StatusOr<std::shared_ptr<Module>> sub = root.GetSubmodule(path);
    if (!sub.ok()) {
      return absl::NotFoundError(absl::StrCat("path ", Quote(path), " in '",
                                              module.full(),
                                              "': ", sub.status().message()));
    }
    if (reads_bytes) MODELSTATE_RETURN_IF_ERROR(CheckHeldBytes(**sub));
    describe(**sub);
    return absl::OkStatus();
  });
}

std::vector<Device> ModelService::ServerDevices() const {
  return AvailableDevices();
}

absl::StatusOr<ModulePage> ModelService::ListModules(
    const Caller& caller, const ListModulesArgs& args) {
  MODELSTATE_RETURN_IF_ERROR(CheckListModulesArgs(args));
  const std::vector<std::string> readable =
      caller.principal.NamespacesFor(Permission::kRead);
  const bool everything = !args.ns.empty() || Everywhere(readable);
  if (!args.ns.empty() || !everything) {
    MODELSTATE_RETURN_IF_ERROR(
        gate_.AllowIn(caller, "ListModules", Permission::kRead, args.ns));
  }
  const size_t page = args.page_size == 0 ? kDefaultListPageSize
                                          : static_cast<size_t>(args.page_size);
  // The token is the last name of the previous page. A caller who may read
  // some namespaces only sees those: listing goes on past the others.
  std::vector<ModuleSummary> modules;
  std::string after = args.page_token;
  while (modules.size() <= page) {
    std::vector<ModuleSummary> batch = store_->List(args.ns, after, page + 1);
    for (ModuleSummary& m : batch) {
      if (everything || std::find(readable.begin(), readable.end(),
                                  m.name.ns) != readable.end()) {
        modules.push_back(std::move(m));
      }
    }
    if (batch.size() < page + 1) break;
    after = batch.back().name.full();
  }
  ModulePage out;
  if (modules.size() > page) {
    modules.resize(page);
    out.next_page_token = modules.back().name.full();
  }
  out.modules = std::move(modules);
  return out;
}

absl::Status ModelService::DeleteModule(const Caller& caller,
                                        const ModuleName& module) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "DeleteModule", Permission::kWrite, module));
  return store_->Delete(caller.ctx, module);
}

absl::Status ModelService::MoveModuleOut(
    const Caller& caller, const ModuleName& module,
    const std::string& to_replica,
    absl::FunctionRef<
        absl::StatusOr<uint64_t>(const std::vector<std::string>& files)>
        send,
    const std::function<bool(const absl::Status&)>& still_owner) {
  MODELSTATE_RETURN_IF_ERROR(gate_.AllowAdmin(caller, "MoveModuleToReplica"));
  MODELSTATE_RETURN_IF_ERROR(gate_.AuditWritable());
  return store_->MoveOut(caller.ctx, module, to_replica, send, still_owner);
}

absl::StatusOr<std::string> ModelService::ReserveImportFile(
    const Caller& caller, const ModuleName& module) {
  MODELSTATE_RETURN_IF_ERROR(gate_.AllowAdmin(caller, "ImportModule"));
  MODELSTATE_RETURN_IF_ERROR(gate_.AuditWritable());
  return store_->ReserveImportFile(module);
}

absl::Status ModelService::MoveModuleIn(
    const Caller& caller, const ModuleName& module,
    const std::string& from_replica, absl::string_view manifest,
    const std::map<std::string, std::string>& received, uint64_t bytes,
    absl::FunctionRef<absl::Status()> take_ownership) {
  absl::Status allowed = gate_.AllowAdmin(caller, "ImportModule");
  if (allowed.ok()) allowed = gate_.AuditWritable();
  if (!allowed.ok()) {
    store_->AbandonImport(module, received);
    return allowed;
  }
  return store_->MoveIn(caller.ctx, module, from_replica, manifest, received,
                        bytes, take_ownership);
}

absl::StatusOr<StateDictDownload> ModelService::GetStateDict(
    const Caller& caller, GetStateDictArgs args) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "GetStateDict", Permission::kRead, args.module));
  StateDictDownload download;
  MODELSTATE_ASSIGN_OR_RETURN(
      download.transfer,
      TrackTransfer(caller, "GetStateDict", Permission::kRead, args.module));
  MODELSTATE_ASSIGN_OR_RETURN(download.slot,
                              streams_.Acquire(caller.ctx.identity));
  const Limits& limits = options_.limits;
  download.chunk_bytes =
      args.chunk_bytes == 0 ? limits.default_chunk_bytes : args.chunk_bytes;
  if (download.chunk_bytes > limits.max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "chunk_bytes: ", download.chunk_bytes,
        " exceeds the server's max_chunk_bytes of ", limits.max_chunk_bytes));
  }
  if (args.target_dtype.has_value() && !IsFloatingPoint(*args.target_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_dtype: must be a floating point dtype, got ",
                     DTypeName(*args.target_dtype)));
  }
  MODELSTATE_ASSIGN_OR_RETURN(StateDictSnapshot snapshot,
                              store_->Snapshot(args.module, args.filter));
  MODELSTATE_ASSIGN_OR_RETURN(
      download.reader,
      StateDictReader::Create(std::move(snapshot.state), args.target_dtype,
                              std::move(snapshot.kinds)));
  return download;
}

absl::StatusOr<std::unique_ptr<StreamLimiter::Slot>> ModelService::OpenLoad(
    const Caller& caller) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.AllowSomewhere(caller, "LoadStateDict", Permission::kWrite));
  return streams_.Acquire(caller.ctx.identity);
}

absl::StatusOr<std::unique_ptr<LoadSession>> ModelService::LoadStateDict(
    const Caller& caller, LoadStateDictArgs args,
    std::unique_ptr<StreamLimiter::Slot> slot) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "LoadStateDict", Permission::kWrite, args.module));
  std::unique_ptr<LoadSession> session(new LoadSession());
  MODELSTATE_ASSIGN_OR_RETURN(
      session->transfer_,
      TrackTransfer(caller, "LoadStateDict", Permission::kWrite, args.module));
  if (slot == nullptr) {
    MODELSTATE_ASSIGN_OR_RETURN(slot, streams_.Acquire(caller.ctx.identity));
  }
  session->slot_ = std::move(slot);
  session->store_ = store_;
  session->ctx_ = caller.ctx;
  session->module_ = args.module;
  session->options_ = args.options;
  // The bytes land in this module, not in one built under its name after
  // it was deleted while they came.
  MODELSTATE_ASSIGN_OR_RETURN(session->incarnation_,
                              store_->Incarnation(args.module));
  const StreamLimits limits = StreamLimitsFrom(options_.limits);
  session->digest_ = std::make_unique<StateDictStreamDigest>(args.layout);
  if (args.options.assign) {
    MODELSTATE_ASSIGN_OR_RETURN(
        session->assembler_,
        StateDictAssembler::Create(std::move(args.layout), limits));
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(
        session->staged_,
        store_->StageLoad(caller.ctx, args.module, std::move(args.layout),
                          limits, args.options, options_.staging_dir));
    // Hashed beside the staging writer, not on the receiving thread:
    // SHA-256 (about 1.8 GB/s) would otherwise slow every receive.
    MODELSTATE_RETURN_IF_ERROR(session->staged_->Observe(
        [digest = session->digest_.get()](absl::string_view bytes) {
          digest->Update(bytes);
        }));
  }
  return session;
}

LoadSession::~LoadSession() = default;

absl::Status LoadSession::Append(std::string bytes) {
  MODELSTATE_RETURN_IF_ERROR(transfer_->status());
  if (staged_ != nullptr) return staged_->Append(std::move(bytes));
  digest_->Update(bytes);
  return assembler_->Append(bytes);
}

absl::StatusOr<LoadResult> LoadSession::Finish() {
  // Revoked after its last bytes came: nothing is applied. (A reload after
  // this commit finds the load already applying, as if it came after it:
  // it is neither revoked nor recorded as denied, even while it waits for
  // the module's gate.)
  if (absl::Status revoked = transfer_->Commit(); !revoked.ok()) {
    return Fail(std::move(revoked));
  }
  // The staged bytes' digest is complete once they are all observed; a
  // write error is the load's, reported by LoadStaged.
  if (staged_ != nullptr) staged_->Drain().IgnoreError();
  // Empty while bytes are missing: the load then fails for that.
  const std::string sha256 = digest_->StateSha256().value_or("");
  if (staged_ != nullptr) {
    return store_->LoadStaged(ctx_, module_, *staged_, options_, sha256,
                              incarnation_);
  }
  absl::StatusOr<StateDict> state_dict = assembler_->Finish();
  if (!state_dict.ok()) return Fail(state_dict.status());
  return store_->Load(ctx_, module_, *state_dict, options_, sha256,
                      incarnation_);
}

absl::Status LoadSession::Fail(absl::Status why) {
  // A revoked load that stalled is cancelled by the reload
  // (RecheckTransfers), so what ends its stream reads as the client's
  // cancellation: the revocation is why it failed, and what is recorded.
  if (absl::Status revoked = transfer_->status(); !revoked.ok()) {
    why = std::move(revoked);
  }
  return store_->RecordLoadFailure(ctx_, module_, options_, std::move(why));
}

absl::Status ModelService::MoveModule(const Caller& caller,
                                      const MoveModuleArgs& args,
                                      ModuleVisitor describe) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "MoveModule", Permission::kWrite, args.module));
  MODELSTATE_RETURN_IF_ERROR(store_->Move(caller.ctx, args.module, args.device,
                                          args.dtype, args.convert_all));
  return store_->Read(args.module, [&](const Module& root) {
    describe(root);
    return absl::OkStatus();
  });
}

absl::Status ModelService::SetTraining(const Caller& caller,
                                       const ModuleName& module,
                                       bool training) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "SetTraining", Permission::kWrite, module));
  return store_->SetTraining(caller.ctx, module, training);
}

absl::StatusOr<std::vector<Tensor>> ModelService::Forward(const Caller& caller,
                                                          ForwardArgs args) {
  // An eval-mode call needs the reader's permission, and the writer's only
  // if the store finds it will change the module (an Embedding with
  // max_norm renormalises). For an unknown module or path the reader's
  // permission is asked, and Forward says NOT_FOUND.
  const bool eval = args.training.has_value() && !*args.training;
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "Forward",
                  eval ? Permission::kRead : Permission::kWrite, args.module));
  auto allow_change = [&]() -> absl::Status {
    if (!eval) return absl::OkStatus();
    return gate_.Allow(caller, "Forward", Permission::kWrite, args.module);
  };
  // The inputs' shapes size every tensor the call creates (a Linear(1, n)
  // turns 4 bytes per row into 4n): each is held to the limit of a tensor
  // a client sends, before it is allocated.
  ScopedTensorBytesLimit limit(limits().max_tensor_bytes);
  MODELSTATE_ASSIGN_OR_RETURN(
      std::vector<Tensor> outputs,
      store_->Forward(caller.ctx, args.module, args.path,
                      std::move(args.inputs), args.training, args.seed,
                      allow_change));
  // One response carries them all.
  uint64_t bytes = 0;
  for (const Tensor& t : outputs) bytes += t.nbytes();
  if (bytes > limits().max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "outputs: ", bytes,
        " bytes in all, over the max_message_bytes limit "
        "of ",
        limits().max_message_bytes, " (one response carries them)"));
  }
  return outputs;
}

absl::StatusOr<std::unique_ptr<SubscriberSession>>
ModelService::OpenSubscription(const Caller& caller) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.AllowSomewhere(caller, "Subscribe", Permission::kSubscribe));
  std::unique_ptr<SubscriberSession> session(new SubscriberSession());
  MODELSTATE_ASSIGN_OR_RETURN(session->slot_,
                              streams_.Acquire(caller.ctx.identity));
  session->service_ = this;
  session->caller_ = caller;
  return session;
}

absl::Status ModelService::Admit(const Caller& caller, SubscriptionSpec& spec) {
  // Events with data travel in one message each.
  const uint64_t message = options_.limits.max_message_bytes;
  const uint64_t max_data_bytes = message > (1 << 20) ? message - (1 << 20) : 0;
  MODELSTATE_RETURN_IF_ERROR(gate_.AuditWritable());
  if (spec.include_data && spec.max_data_bytes > max_data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_data_bytes: ", spec.max_data_bytes,
        " is more than this server's largest message minus 1 MiB (",
        max_data_bytes, ")"));
  }
  // Only authenticated identities can own a name; without authentication
  // every caller is the same anonymous admin.
  if (gate_.authenticates()) spec.owner_identity = caller.principal.identity;
  // A subscriber sees only the namespaces it may review, and may not ask
  // for one it may not.
  for (const std::string& wanted : spec.filter.namespaces) {
    MODELSTATE_RETURN_IF_ERROR(
        gate_.AllowIn(caller, "Subscribe", Permission::kSubscribe, wanted));
  }
  ScopeToPrincipal(caller, spec);
  return absl::OkStatus();
}

void ModelService::ScopeToPrincipal(const Caller& caller,
                                    SubscriptionSpec& spec) {
  std::vector<std::string> visible =
      caller.principal.NamespacesFor(Permission::kSubscribe);
  spec.visible_namespaces.clear();
  if (!Everywhere(visible)) spec.visible_namespaces = std::move(visible);
  // Whom the chains it is sent name: those ListSubscribers shows it.
  spec.learns_of = MayLearnOfNamespaces(caller);
}

SubscriberSession::~SubscriberSession() { Detach(); }

absl::StatusOr<uint64_t> SubscriberSession::Attach(
    SubscriptionSpec spec, std::shared_ptr<SubscriberChannel> channel) {
  MODELSTATE_RETURN_IF_ERROR(service_->Admit(caller_, spec));
  // A reload since the caller was authenticated is asked about before the
  // hub attaches it, which may hand it held events at once; a reload after
  // this check waits for the tracking below (attach_mu_), so that its
  // RecheckSubscribers finds this subscriber. Checked after the attach, a
  // revoked interceptor was sent events (and could decide them) first.
  ReaderMutexLock attaching(&service_->attach_mu_);
  if (const uint64_t generation = service_->gate_.policy_generation();
      generation != caller_.policy_generation) {
    // One look-up: the principal kept is the one checked, even if another
    // reload comes meanwhile (its recheck then finds this subscriber).
    MODELSTATE_ASSIGN_OR_RETURN(
        Principal now, service_->gate_.StillAllowed(caller_, "Subscribe",
                                                    Permission::kSubscribe));
    // It subscribes under the reloaded file: it sees the namespaces that
    // file lets it review, its chains name whom it lets it learn of, and
    // later reloads are compared with it (with the old principal, a
    // reload that changed nothing of the caller's would find its learn-of
    // namespaces narrowed and end it; one that had widened them would
    // neither send it their events nor let a later narrowing pass).
    caller_.principal = std::move(now);
    caller_.policy_generation = generation;
    service_->ScopeToPrincipal(caller_, spec);
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      subscriber_id_,
      service_->hub_->Attach(std::move(spec), std::move(channel), caller_.ctx));
  service_->TrackSubscriber(subscriber_id_, caller_);
  return subscriber_id_;
}

void SubscriberSession::Answer(SubscriberAnswer answer) {
  if (subscriber_id_ != 0) {
    service_->hub_->Answer(subscriber_id_, std::move(answer));
  }
}

void SubscriberSession::Detach() {
  // Detached, and its stream slot given back, before the stream ends: once
  // the client sees the end, no request waits for or is seen by this
  // subscriber any more, and the caller may open another stream at once.
  slot_.reset();
  if (subscriber_id_ == 0) return;
  service_->ForgetSubscriber(subscriber_id_);
  service_->hub_->Detach(subscriber_id_, caller_.ctx);
  subscriber_id_ = 0;
}

void ModelService::TrackSubscriber(uint64_t id, const Caller& caller) {
  MutexLock lock(&subscribers_mu_);
  subscribers_.insert_or_assign(id, caller);
}

void ModelService::ForgetSubscriber(uint64_t id) {
  MutexLock lock(&subscribers_mu_);
  subscribers_.erase(id);
}

absl::Status ModelService::StillLearnsOf(const Caller& caller) {
  if (!gate_.authenticates()) return absl::OkStatus();
  absl::StatusOr<Principal> now = gate_.StillNamed(caller, "Subscribe");
  if (!now.ok()) return now.status();
  Caller reloaded = caller;
  reloaded.principal = *std::move(now);
  // Its chains name the subscribers it could list when it attached; once
  // it may list fewer, they would go on naming them (and their reasons).
  if (MayLearnOf(MayLearnOfNamespaces(reloaded),
                 MayLearnOfNamespaces(caller))) {
    return absl::OkStatus();
  }
  return gate_.Refuse(
      caller, "Subscribe",
      AccessGate::Refusal{
          ModuleName{},
          absl::PermissionDeniedError(absl::StrCat(
              "the reloaded token file narrows the subscribers '",
              caller.principal.identity,
              "' may learn of (its review and audit namespaces); subscribe "
              "again"))});
}

void ModelService::RecheckSubscribers() {
  std::vector<std::pair<uint64_t, Caller>> open;
  {
    // After every subscription that checked the old policy is tracked.
    MutexLock attaching(&attach_mu_);
    MutexLock lock(&subscribers_mu_);
    open.assign(subscribers_.begin(), subscribers_.end());
  }
  for (const auto& [id, caller] : open) {
    absl::Status still =
        gate_.StillAllows(caller, "Subscribe", Permission::kSubscribe);
    if (still.ok()) still = StillLearnsOf(caller);
    if (still.ok()) continue;
    // Forgotten at once, not when its stream ends: a client that reads
    // nothing holds the stream open, and the next reload must not revoke
    // (and record) it again. Reloads run one at a time (the server's
    // reload thread), so none records it twice meanwhile.
    ForgetSubscriber(id);
    // Detached before its stream ends, like any subscriber that leaves:
    // what it held fails by its policy, and it decides nothing more.
    hub_->Disconnect(id, still, caller.ctx);
  }
}

Transfer::~Transfer() {
  MutexLock lock(&service_->transfers_mu_);
  service_->transfers_.erase(id_);
}

absl::Status Transfer::status() const {
  MutexLock lock(&mu_);
  AwaitDenialLocked();
  return status_;
}

absl::Status Transfer::Commit() {
  MutexLock lock(&mu_);
  AwaitDenialLocked();
  committed_ = status_.ok();
  return status_;
}

void Transfer::AwaitDenialLocked() const {
  while (denial_unrecorded_) denial_recorded_.Wait(&mu_);
}

void Transfer::set_stop(std::function<void()> stop) {
  MutexLock lock(&mu_);
  stop_ = std::move(stop);
}

absl::StatusOr<std::unique_ptr<Transfer>> ModelService::TrackTransfer(
    const Caller& caller, const char* rpc, Permission permission,
    const ModuleName& module) {
  std::unique_ptr<Transfer> transfer(new Transfer());
  transfer->service_ = this;
  transfer->caller_ = caller;
  transfer->rpc_ = rpc;
  transfer->permission_ = permission;
  transfer->module_ = module;
  std::optional<AccessGate::Refusal> refusal;
  {
    MutexLock lock(&transfers_mu_);
    // A reload that came before this lock (its generation is the current
    // one) may have rechecked the transfers already: asked here. One that
    // comes after finds this transfer tracked. Recorded after the lock: an
    // audit append may sync to disk.
    if (gate_.policy_generation() != caller.policy_generation) {
      refusal = gate_.StillAllowsInUnrecorded(caller, rpc, permission, module);
    }
    if (!refusal.has_value()) {
      transfer->id_ = ++next_transfer_id_;
      transfers_.emplace(transfer->id_, transfer.get());
      return transfer;
    }
  }
  // Never tracked: its destructor erases nothing.
  return gate_.Refuse(caller, rpc, *std::move(refusal));
}

void ModelService::RecheckTransfers(absl::Duration grace) {
  std::vector<uint64_t> revoked;
  // Recorded once the locks are let go: an audit append may sync to disk,
  // and every transfer starting or ending would wait for it.
  struct Denial {
    uint64_t transfer_id;
    Caller caller;
    const char* rpc;
    AccessGate::Refusal refusal;
  };
  std::vector<Denial> denials;
  {
    MutexLock lock(&transfers_mu_);
    for (const auto& [id, transfer] : transfers_) {
      // Held across the decision, so that a load cannot commit in between
      // and apply after it was revoked (its denial is recorded below).
      MutexLock revoking(&transfer->mu_);
      // Committed, or revoked by an earlier reload: nothing to decide.
      if (transfer->committed_ || !transfer->status_.ok()) continue;
      std::optional<AccessGate::Refusal> refusal =
          gate_.StillAllowsInUnrecorded(transfer->caller_, transfer->rpc_,
                                        transfer->permission_,
                                        transfer->module_);
      if (!refusal.has_value()) continue;
      transfer->status_ = refusal->status;
      // Its handler, at its next message, waits for the record below.
      transfer->denial_unrecorded_ = true;
      revoked.push_back(id);
      denials.push_back(
          Denial{id, transfer->caller_, transfer->rpc_, *std::move(refusal)});
    }
  }
  for (Denial& denial : denials) {
    gate_.Revoke(denial.caller, denial.rpc, denial.refusal);
    // Looked up again: a transfer that ended meanwhile (its client went
    // away) is no longer tracked, nor alive.
    MutexLock lock(&transfers_mu_);
    auto it = transfers_.find(denial.transfer_id);
    if (it == transfers_.end()) continue;
    Transfer* transfer = it->second;
    MutexLock recorded(&transfer->mu_);
    transfer->denial_unrecorded_ = false;
    transfer->denial_recorded_.SignalAll();
  }
  // Most end at their next message; a stalled one would hold its call (and
  // a GetStateDict its snapshot) until its deadline.
  const absl::Time deadline = absl::Now() + grace;
  while (!revoked.empty()) {
    {
      MutexLock lock(&transfers_mu_);
      std::vector<uint64_t> running;
      for (uint64_t id : revoked) {
        if (transfers_.contains(id)) running.push_back(id);
      }
      revoked.swap(running);
      if (absl::Now() >= deadline) {
        for (uint64_t id : revoked) {
          Transfer* transfer = transfers_.at(id);
          MutexLock stopping(&transfer->mu_);
          if (transfer->stop_) transfer->stop_();
        }
        return;
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::vector<SubscriberInfo>> ModelService::ListSubscribers(
    const Caller& caller) {
  if (!caller.principal.AllowsAnywhere(Permission::kAudit)) {
    MODELSTATE_RETURN_IF_ERROR(gate_.AllowSomewhere(caller, "ListSubscribers",
                                                    Permission::kSubscribe));
  }
  // A subscriber is listed, with its filters, only to a caller who may
  // review or audit every namespace it may see (MayLearnOf), the rule
  // chains name earlier interceptors by.
  const std::vector<std::string> mine = MayLearnOfNamespaces(caller);
  std::vector<SubscriberInfo> listed;
  for (SubscriberInfo& info : hub_->List()) {
    if (MayLearnOf(mine, NamespacesSeenBy(info.spec))) {
      listed.push_back(std::move(info));
    }
  }
  return listed;
}

absl::StatusOr<NameRelease> ModelService::ReleaseSubscriberName(
    const Caller& caller, const std::string& name, bool force) {
  MODELSTATE_RETURN_IF_ERROR(gate_.AllowAdmin(caller, "ReleaseSubscriberName"));
  if (name.empty()) {
    return absl::InvalidArgumentError("name: the subscriber name is empty");
  }
  // The release must be recorded, or a restart would bind the name again.
  MODELSTATE_RETURN_IF_ERROR(gate_.AuditWritable());
  return hub_->ReleaseName(name, force, caller.ctx);
}

absl::Status ModelService::HasAudit() const {
  if (audit_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError("this server keeps no audit log");
}

absl::StatusOr<AuditPage> ModelService::QueryAudit(const Caller& caller,
                                                   AuditQuery query) {
  MODELSTATE_RETURN_IF_ERROR(HasAudit());
  MODELSTATE_RETURN_IF_ERROR(
      gate_.AllowIn(caller, "QueryAudit", Permission::kAudit, query.ns));
  const std::vector<std::string> visible =
      caller.principal.NamespacesFor(Permission::kAudit);
  // Records of namespaces the auditor may not see are skipped, so a page
  // may take several queries.
  AuditPage page;
  uint64_t last = query.after_seq;
  bool more = true;
  while (page.records.size() < query.limit && more) {
    query.after_seq = last;
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> records,
                                audit_->Query(query));
    more = records.size() == query.limit;
    for (AuditRecord& r : records) {
      if (page.records.size() == query.limit) {
        more = true;
        break;
      }
      last = r.seq;
      if (AuditRecordVisible(visible, r)) page.records.push_back(std::move(r));
    }
  }
  if (more) page.next_after_seq = last;
  return page;
}

absl::StatusOr<std::unique_ptr<AuditWatch>> ModelService::WatchAudit(
    const Caller& caller, AuditQuery query) {
  MODELSTATE_RETURN_IF_ERROR(HasAudit());
  MODELSTATE_RETURN_IF_ERROR(
      gate_.AllowIn(caller, "WatchAudit", Permission::kAudit, query.ns));
  std::unique_ptr<AuditWatch> watch(new AuditWatch());
  MODELSTATE_ASSIGN_OR_RETURN(watch->slot_,
                              streams_.Acquire(caller.ctx.identity));
  watch->audit_ = audit_;
  watch->gate_ = &gate_;
  watch->caller_ = caller;
  watch->generation_ = caller.policy_generation;
  watch->visible_ = caller.principal.NamespacesFor(Permission::kAudit);
  watch->after_ = query.after_seq;
  watch->query_ = std::move(query);
  return watch;
}

absl::StatusOr<std::vector<AuditRecord>> AuditWatch::Next(absl::Duration wait) {
  // A reloaded token file may have revoked the watcher: the stream ends
  // within one wait instead of running until the client leaves.
  if (const uint64_t now = gate_->policy_generation(); now != generation_) {
    generation_ = now;
    MODELSTATE_RETURN_IF_ERROR(
        gate_->StillAllows(caller_, "WatchAudit", Permission::kAudit));
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      std::vector<AuditRecord> records,
      audit_->WaitForRecords(after_, absl::Now() + wait, kWatchBatch));
  std::vector<AuditRecord> out;
  for (AuditRecord& r : records) {
    after_ = r.seq;
    if (query_.Matches(r) && AuditRecordVisible(visible_, r)) {
      out.push_back(std::move(r));
    }
  }
  return out;
}

absl::StatusOr<AuditVerification> ModelService::VerifyAudit(
    const Caller& caller) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.AllowSomewhere(caller, "VerifyAudit", Permission::kAudit));
  MODELSTATE_RETURN_IF_ERROR(HasAudit());
  return AuditLog::Verify(options_.audit_path);
}

std::vector<DeviceDescription> ModelService::ListDevices(const Caller&) {
  return DescribeDevices();
}

}  // namespace modelstate
