#include "service/model_store.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/glob.h"
#include "base/log.h"
#include "base/quote.h"
#include "base/status_macros.h"
#include "nn/forward.h"
#include "service/audit_events.h"

namespace modelstate {
namespace {

// Hooks that answer each event with the next precomputed decision: the
// second, real pass of a registration that was decided on a dry run.
class ReplayHooks {
 public:
  explicit ReplayHooks(std::vector<HookDecision> decisions)
      : decisions_(std::move(decisions)) {
    for (EntryKind kind :
         {EntryKind::kParameter, EntryKind::kBuffer, EntryKind::kModule}) {
      handles_.push_back(registry_.AddHook(
          kind,
          [this](const RegistrationEvent& event) { return Next(event); }));
    }
  }
  const HookRegistry* registry() const { return &registry_; }

 private:
  HookResult Next(const RegistrationEvent& event) {
    if (next_ >= decisions_.size()) {
      return HookResult::Block("internal: more registrations than decisions");
    }
    const HookDecision& d = decisions_[next_++];
    switch (d.kind) {
      case HookResult::Kind::kKeep:
        return HookResult::Keep();
      case HookResult::Kind::kBlock:
        return HookResult::Block(d.reason);
      case HookResult::Kind::kReplace:
        if (event.kind == EntryKind::kModule) {
          return HookResult::Replace(d.value.module);
        }
        return HookResult::ReplaceBuffer(d.value.tensor, d.value.persistent);
    }
    return HookResult::Keep();
  }

  std::vector<HookDecision> decisions_;
  size_t next_ = 0;
  HookRegistry registry_;
  std::vector<RemovableHandle> handles_;
};

absl::Status NoSuchModule(const ModuleName& name) {
  return absl::NotFoundError(
      absl::StrCat("module '", name.full(), "' does not exist"));
}

// The submodule of `root` at `path` (given in request field `field`):
// NOT_FOUND naming the path otherwise.
absl::StatusOr<std::shared_ptr<Module>> Submodule(const Module& root,
                                                  const ModuleName& name,
                                                  absl::string_view field,
                                                  const std::string& path) {
  absl::StatusOr<std::shared_ptr<Module>> found = root.GetSubmodule(path);
  if (found.ok()) return found;
  return absl::NotFoundError(absl::StrCat(field, " ", Quote(path), " in '",
                                          name.full(),
                                          "': ", found.status().message()));
}

std::string DescribeBlocked(const RegistrationRecord& r,
                            const HookDecision& final) {
  std::string where =
      r.event.path.empty() ? "the root module" : Quote(r.event.path);
  return absl::StrCat(
      RegistrationActionName(r.event.action) == "register" ? "registration"
                                                           : "unregistration",
      " of ", EntryKindName(r.event.kind), " ", Quote(r.event.name), " in ",
      where, " was blocked", final.reason.empty() ? "" : ": ", final.reason);
}

std::vector<RegistrationResult> Zip(std::vector<RegistrationRecord> records,
                                    std::vector<HookDecision> finals) {
  std::vector<RegistrationResult> out;
  out.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    out.push_back(
        RegistrationResult{std::move(records[i]), std::move(finals[i])});
  }
  return out;
}

}  // namespace

void ModelStore::set_decider(RegistrationDecider* decider) {
  MutexLock lock(&mu_);
  decider_ = decider;
}

void ModelStore::set_audit_log(AuditLog* audit) {
  MutexLock lock(&mu_);
  audit_ = audit;
}

AuditLog* ModelStore::audit() const {
  MutexLock lock(&mu_);
  return audit_;
}

void ModelStore::set_repository(ModuleRepository* repository) {
  MutexLock lock(&mu_);
  repository_ = repository;
}

void ModelStore::set_write_fence(std::function<absl::Status()> fence) {
  MutexLock lock(&mu_);
  write_fence_ = std::move(fence);
}

absl::Status ModelStore::CheckWriteFence() const {
  std::function<absl::Status()> fence;
  {
    MutexLock lock(&mu_);
    fence = write_fence_;
  }
  return fence ? fence() : absl::OkStatus();
}

ModuleRepository* ModelStore::repository() const {
  MutexLock lock(&mu_);
  return repository_;
}

ChangeNote ModelStore::NoteFor(const OperationContext& ctx,
                               AuditType type) const {
  AuditLog* log = audit();
  return ChangeNote{std::string(AuditTypeName(type)), ctx.identity,
                    ctx.correlation_id, log == nullptr ? 0 : log->last_seq()};
}

absl::Status ModelStore::Persist(
    const OperationContext& ctx, Entry& entry, AuditType type,
    const std::vector<PrewrittenBytes>& prewritten) {
  ModuleRepository* repo = repository();
  if (repo == nullptr) return absl::OkStatus();
  // Fenced off (see set_write_fence): not saved, and so undone below like
  // a change the disk refused, but UNAVAILABLE: a retry may succeed.
  absl::Status saved = CheckWriteFence();
  const absl::StatusCode code =
      saved.ok() ? absl::StatusCode::kInternal : absl::StatusCode::kUnavailable;
  if (saved.ok()) {
    saved = repo->Save(entry.name, *entry.root, NoteFor(ctx, type), prewritten);
  }
  if (saved.ok()) return saved;
  if (type == AuditType::kBuild) {
    return absl::Status(code,
                        absl::StrCat("module '", entry.name.full(),
                                     "' was not stored: ", saved.message()));
  }
  // Memory must not run ahead of the disk: a reader would see, and a later
  // save would silently commit, a change the caller was told failed. The
  // exclusive lock is still held, so nobody saw the unsaved tree.
  absl::StatusOr<std::shared_ptr<Module>> committed = repo->Reload(entry.name);
  if (committed.ok()) {
    entry.root = *std::move(committed);
    return absl::Status(code,
                        absl::StrCat("the change to '", entry.name.full(),
                                     "' could not be saved (", saved.message(),
                                     "); the module is unchanged"));
  }
  // Neither the new state nor the old one is available: withdraw the module
  // rather than serve a state that is not on disk.
  entry.deleted = true;
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(entry.name.full());
    if (it != entries_.end() && it->second.get() == &entry) entries_.erase(it);
  }
  return absl::InternalError(absl::StrCat(
      "the change to '", entry.name.full(), "' could not be saved (",
      saved.message(), ") and the saved state could not be read back (",
      committed.status().message(),
      "); the module is withdrawn and its files are kept for repair"));
}

absl::StatusOr<bool> ModelStore::RecordIfUnrecorded(const ModuleName& name,
                                                    const ChangeNote& note) {
  AuditLog* log = audit();
  if (log == nullptr) return false;
  // The change's own record, or the "recovered" one an earlier start made.
  AuditQuery query;
  query.ns = name.ns;
  query.module = name.name;
  query.after_seq = note.audit_seq;
  query.limit = AuditQuery::kMaxLimit;
  while (true) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> records,
                                log->Query(query));
    for (const AuditRecord& r : records) {
      if (r.correlation_id == note.correlation_id &&
          (r.type == note.type ||
           r.type == AuditTypeName(AuditType::kRecovered))) {
        return false;
      }
    }
    if (records.size() < query.limit) break;
    query.after_seq = records.back().seq;
  }
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t seq,
                              log->Append(audit_events::Recovered(name, note)));
  MODELSTATE_RETURN_IF_ERROR(log->Sync(seq));
  return true;
}

absl::Status ModelStore::CheckAuditCoversManifests(
    const ModuleRepository::LoadReport& loaded) const {
  AuditLog* log = audit();
  if (log == nullptr) return absl::OkStatus();
  const uint64_t records = log->last_seq();
  auto check = [&](const ModuleName& name, const ChangeNote& note) {
    if (note.audit_seq <= records) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "the audit log has ", records, " records, but the manifest of '",
        name.full(), "' was saved when it had ", note.audit_seq,
        ": records were cut off; refusing to start"));
  };
  for (const ModuleRepository::Removed& removed : loaded.removed) {
    MODELSTATE_RETURN_IF_ERROR(check(removed.name, removed.note));
  }
  for (const ModuleRepository::Loaded& module : loaded.modules) {
    MODELSTATE_RETURN_IF_ERROR(check(module.name, module.note));
  }
  return absl::OkStatus();
}

ModelStore::RestoreReport ModelStore::Restore(bool fallback_to_cpu) {
  RestoreReport report;
  ModuleRepository* repo = repository();
  if (repo == nullptr) return report;
  ModuleRepository::LoadReport loaded = repo->LoadAll(fallback_to_cpu);
  report.errors = std::move(loaded.errors);
  report.refused = CheckAuditCoversManifests(loaded);
  if (!report.refused.ok()) return report;
  auto recover = [&](const ModuleName& name, const ChangeNote& note) {
    absl::StatusOr<bool> recovered = RecordIfUnrecorded(name, note);
    if (!recovered.ok()) report.errors.push_back(recovered.status());
    if (recovered.ok() && *recovered) ++report.recovered;
    return recovered.ok();
  };
  for (ModuleRepository::Removed& removed : loaded.removed) {
    if (recover(removed.name, removed.note)) repo->DropTombstone(removed.name);
  }
  for (ModuleRepository::Loaded& module : loaded.modules) {
    recover(module.name, module.note);
    ++report.modules;
    report.bytes += module.bytes;
    auto entry = NewEntry(module.name, std::move(module.root));
    MutexLock lock(&mu_);
    entries_[module.name.full()] = std::move(entry);
  }
  if (AuditLog* log = audit(); log != nullptr) {
    for (const absl::Status& error : report.errors) {
      absl::StatusOr<uint64_t> seq =
          log->Append(audit_events::RestoreFailed(error));
      if (seq.ok()) log->Sync(*seq).IgnoreError();
    }
  }
  return report;
}

namespace {

// Bytes a tensor holds in memory (meta tensors hold none).
uint64_t HeldBytes(const Tensor& t) {
  return t.defined() && t.device().has_storage() ? t.nbytes() : 0;
}

// Bytes a module tree holds in memory: what quotas count.
uint64_t HeldBytes(const Module& module) {
  uint64_t total = 0;
  for (const auto& [key, t] : module.NamedParameters()) total += HeldBytes(t);
  for (const auto& [key, t] : module.NamedBuffers()) total += HeldBytes(t);
  return total;
}

// What HeldBytes will be after module.To(device, dtype): to() converts
// floating-point tensors only. As in torch's _apply, a buffer that changes
// becomes a new tensor in each slot holding it, so a tied buffer counts once
// per slot afterwards; parameters keep their ties (one moved to or from
// meta, which does not, holds no bytes there).
uint64_t HeldBytesAfterMove(const Module& module, std::optional<Device> device,
                            std::optional<DType> dtype, bool convert_all) {
  uint64_t total = 0;
  // type() converts integer and bool tensors too: an int8 buffer made
  // float64 holds eight times its bytes.
  auto target = [&](const Tensor& t) {
    return std::make_pair(
        device.value_or(t.device()),
        dtype.has_value() && (convert_all || IsFloatingPoint(t.dtype()))
            ? *dtype
            : t.dtype());
  };
  auto add = [&](const Tensor& t) {
    auto [d, type] = target(t);
    if (!d.has_storage()) return;
    total += static_cast<uint64_t>(t.numel()) * ElementSize(type);
  };
  for (const auto& [key, t] : module.NamedParameters()) add(t);
  absl::flat_hash_set<const void*> kept;
  for (const auto& [path, m] : module.NamedModules()) {
    for (const auto& item : m->buffers()) {
      const Tensor& t = item.value;
      if (!t.defined()) continue;
      const bool changes = target(t) != std::make_pair(t.device(), t.dtype());
      if (changes || kept.insert(t.identity()).second) add(t);
    }
  }
  return total;
}

// What HeldBytes will be once an assigning load has installed
// `state_dict`'s tensors (each a tensor of its own, as it comes). Counted
// by slot, not by key: one tensor may fill several slots (a tied weight)
// and one module several paths (a shared submodule). Subtracting each
// key's old tensor once per key took a tied weight off as many times as it
// was tied, so an assigning load into a k-fold tie could install k new
// tensors while the quota counted one. Each slot a key names holds its new
// value (the largest, when several keys name it); every other slot keeps
// its tensor, which counts once however many slots hold it.
uint64_t HeldBytesAfterAssign(const Module& root, const StateDict& state_dict) {
  using Slot = std::pair<const Module*, std::string>;
  std::map<Slot, uint64_t> assigned;
  for (const auto& [path, module] :
       root.NamedModules("", /*remove_duplicate=*/false)) {
    auto visit = [&, &path = path, &module = module](
                     const OrderedDict<Tensor>& entries, bool buffers) {
      for (const auto& item : entries) {
        if (!item.value.defined()) continue;
        // A load leaves non-persistent buffers alone.
        if (buffers && !module->IsPersistentBuffer(item.key)) continue;
        const Tensor* value = state_dict.tensors.Find(
            path.empty() ? item.key : absl::StrCat(path, ".", item.key));
        if (value == nullptr || !value->defined()) continue;
        uint64_t& bytes = assigned[{module.get(), item.key}];
        bytes = std::max(bytes, static_cast<uint64_t>(value->numel()) *
                                    ElementSize(value->dtype()));
      }
    };
    visit(module->parameters(), false);
    visit(module->buffers(), true);
  }
  uint64_t total = 0;
  absl::flat_hash_set<const void*> kept;
  for (const auto& [path, module] : root.NamedModules()) {
    for (const auto* entries : {&module->parameters(), &module->buffers()}) {
      for (const auto& item : *entries) {
        if (!item.value.defined() ||
            assigned.contains({module.get(), item.key})) {
          continue;
        }
        if (kept.insert(item.value.identity()).second) {
          total += HeldBytes(item.value);
        }
      }
    }
  }
  for (const auto& [slot, bytes] : assigned) total += bytes;
  return total;
}

}  // namespace

void ModelStore::set_quotas(QuotaPolicy quotas) {
  MutexLock lock(&mu_);
  quotas_ = std::move(quotas);
}

ModelStore::QuotaHold::QuotaHold(QuotaHold&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)),
      ns_(std::move(other.ns_)),
      held_(std::exchange(other.held_, {})) {}

ModelStore::QuotaHold::~QuotaHold() {
  if (store_ == nullptr) return;
  MutexLock lock(&store_->mu_);
  store_->ReleaseLocked(*this);
}

void ModelStore::ReleaseLocked(QuotaHold& hold) {
  if (hold.store_ == nullptr) return;
  auto it = reserved_.find(hold.ns_);
  if (it != reserved_.end()) {
    it->second.modules -= hold.held_.modules;
    it->second.bytes -= hold.held_.bytes;
    if (it->second.modules == 0 && it->second.bytes == 0) reserved_.erase(it);
  }
  hold.held_ = {};
  hold.store_ = nullptr;
  ++quota_epoch_;
}

absl::Status ModelStore::Reserve(const ModuleName& name, uint64_t added_modules,
                                 uint64_t added_bytes, const Entry* excluded,
                                 QuotaHold& hold) {
  const std::string prefix = absl::StrCat(name.ns, "/");
  while (true) {
    NamespaceQuota quota;
    uint64_t epoch = 0;
    std::vector<std::shared_ptr<Entry>> same_namespace;
    {
      MutexLock lock(&mu_);
      quota = quotas_.For(name.ns);
      if (quota.max_modules == 0 && quota.max_bytes == 0) {
        return absl::OkStatus();
      }
      epoch = quota_epoch_;
      if (quota.max_bytes != 0) {
        for (auto it = entries_.lower_bound(prefix);
             it != entries_.end() && absl::StartsWith(it->first, prefix);
             ++it) {
          same_namespace.push_back(it->second);
        }
      }
    }
    // Summed without mu_ (a module's lock comes first); a change of the
    // namespace meanwhile moves the epoch, and the sum is taken again.
    uint64_t held = 0;
    for (const std::shared_ptr<Entry>& entry : same_namespace) {
      if (entry.get() == excluded) continue;
      ReaderMutexLock lock(&entry->mu);
      if (!entry->deleted) held += HeldBytes(*entry->root);
    }
    MutexLock lock(&mu_);
    if (quota_epoch_ != epoch) continue;
    const Reserved pending = reserved_.contains(name.ns)
                                 ? reserved_.find(name.ns)->second
                                 : Reserved{};
    if (added_modules > 0 && quota.max_modules != 0) {
      uint64_t modules = pending.modules;
      for (auto it = entries_.lower_bound(prefix);
           it != entries_.end() && absl::StartsWith(it->first, prefix); ++it) {
        ++modules;
      }
      if (modules + added_modules > quota.max_modules) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "namespace '", name.ns, "' quota max_modules (", quota.max_modules,
            ") reached: it holds ", modules, " modules",
            pending.modules == 0
                ? ""
                : absl::StrCat(" (", pending.modules, " being built)")));
      }
    }
    if (quota.max_bytes != 0 &&
        held + pending.bytes + added_bytes > quota.max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "namespace '", name.ns, "' quota max_bytes (", quota.max_bytes,
          ") would be exceeded: ", held + pending.bytes, " bytes held",
          pending.bytes == 0 ? "" : " or promised", " + ", added_bytes,
          " new"));
    }
    Reserved& mine = reserved_[name.ns];
    mine.modules += added_modules;
    mine.bytes += added_bytes;
    ++quota_epoch_;
    hold.store_ = this;
    hold.ns_ = name.ns;
    hold.held_.modules += added_modules;
    hold.held_.bytes += added_bytes;
    return absl::OkStatus();
  }
}

absl::StatusOr<uint64_t> ModelStore::BuildBytes(const ModuleName& name,
                                                const ModuleSpec& spec,
                                                BuildOptions options) const {
  uint64_t max_bytes = 0;
  {
    MutexLock lock(&mu_);
    max_bytes = quotas_.For(name.ns).max_bytes;
  }
  if (max_bytes == 0 || !options.device.has_storage()) return 0;
  options.device = Device::Meta();
  options.hooks = nullptr;
  // A layer whose spec names cpu itself allocates even here: the quota
  // bounds what that may take.
  options.limits.max_total_bytes =
      std::min(options.limits.max_total_bytes, max_bytes);
  MODELSTATE_ASSIGN_OR_RETURN(BuildResult sized, BuildModule(spec, options));
  uint64_t total = 0;
  auto add = [&](const Tensor& t) {
    if (t.defined()) {
      total += static_cast<uint64_t>(t.numel()) * ElementSize(t.dtype());
    }
  };
  for (const auto& [key, t] : sized.root->NamedParameters()) add(t);
  for (const auto& [key, t] : sized.root->NamedBuffers()) add(t);
  return total;
}

absl::Status ModelStore::ReserveAssigned(const ModuleName& name,
                                         const Entry& entry,
                                         const StateDict& state_dict,
                                         QuotaHold& hold) {
  uint64_t before = 0;
  uint64_t after = 0;
  {
    ReaderMutexLock lock(&entry.mu);
    if (entry.deleted) return Gone(entry);
    before = HeldBytes(*entry.root);
    after = HeldBytesAfterAssign(*entry.root, state_dict);
  }
  if (after <= before) return absl::OkStatus();
  return Reserve(name, 0, after, &entry, hold);
}

absl::Status ModelStore::Record(const absl::Status& result,
                                AuditRecord record) {
  AuditLog* log = audit();
  if (log == nullptr) return result;
  const std::string type = record.type;
  absl::StatusOr<uint64_t> seq = log->Append(std::move(record));
  absl::Status synced = seq.ok() ? log->Sync(*seq) : seq.status();
  if (!synced.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "the audit log could not record ", type, ": ", synced.message()));
  }
  return result;
}

absl::StatusOr<std::shared_ptr<ModelStore::Entry>> ModelStore::Find(
    const ModuleName& name) const {
  ModuleRepository* repo;
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(name.full());
    if (it != entries_.end()) return it->second;
    repo = repository_;
  }
  // Not served because its files are damaged: say so, not "does not
  // exist" (a build of the name is refused for the same reason).
  if (repo != nullptr) MODELSTATE_RETURN_IF_ERROR(repo->Damaged(name));
  return NoSuchModule(name);
}

std::shared_ptr<ModelStore::Entry> ModelStore::NewEntry(
    const ModuleName& name, std::shared_ptr<Module> root) {
  return std::make_shared<Entry>(name, std::move(root), next_incarnation_++);
}

absl::StatusOr<uint64_t> ModelStore::Incarnation(const ModuleName& name) const {
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  return entry->incarnation;
}

absl::StatusOr<std::shared_ptr<ModelStore::Entry>> ModelStore::FindLoadTarget(
    const ModuleName& name, uint64_t incarnation) const {
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  if (incarnation != 0 && entry->incarnation != incarnation) {
    return absl::AbortedError(absl::StrCat(
        "module '", name.full(),
        "' was deleted and built again while this load's bytes came; "
        "nothing was loaded"));
  }
  return entry;
}

std::vector<HookDecision> ModelStore::Decide(
    const OperationContext& ctx, const ModuleName& name,
    absl::Span<const RegistrationRecord> records) {
  RegistrationDecider* decider;
  {
    MutexLock lock(&mu_);
    decider = decider_;
  }
  std::vector<HookDecision> finals;
  if (decider != nullptr && !records.empty()) {
    finals = decider->Decide(ctx, name, records);
  }
  if (finals.size() != records.size()) {
    finals.clear();
    for (const RegistrationRecord& r : records) finals.push_back(r.local);
  }
  // What the in-process hooks blocked stays blocked.
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].local.blocked()) finals[i] = records[i].local;
  }
  return finals;
}

int ModelStore::BuildsWaiting(const ModuleName& name) const {
  MutexLock lock(&mu_);
  auto it = build_waiters_.find(name.full());
  return it == build_waiters_.end() ? 0 : it->second;
}

int ModelStore::BuildsWaiting() const {
  MutexLock lock(&mu_);
  int waiting = 0;
  for (const auto& [name, waiters] : build_waiters_) waiting += waiters;
  return waiting;
}

absl::Status ModelStore::ClaimName(const OperationContext& ctx,
                                   const ModuleName& name) {
  // A cancelled call is noticed within this long.
  constexpr absl::Duration kCancelPoll = absl::Milliseconds(100);
  bool waited = false;
  {
    MutexLock lock(&mu_);
    // The claim is looked at before entries_: a build holds it until its
    // module is saved and recorded, or taken out again when that fails.
    if (building_.contains(name.full())) {
      auto it = build_waiters_.try_emplace(name.full(), 0).first;
      const int waiters = it->second;
      if (max_build_waiters_ > 0 && waiters >= max_build_waiters_) {
        return absl::ResourceExhaustedError(
            absl::StrCat("module: another build of '", name.full(),
                         "' is under way and ", waiters,
                         " more wait for it (the max_build_waiters limit); try "
                         "again once it is done"));
      }
      it->second = waiters + 1;
      waited = true;
    }
    absl::Status waited_out = absl::OkStatus();
    while (building_.contains(name.full())) {
      if (ctx.cancelled && ctx.cancelled()) {
        waited_out = absl::CancelledError(
            absl::StrCat("cancelled while waiting for another build of '",
                         name.full(), "'"));
        break;
      }
      const absl::Time now = absl::Now();
      if (now >= ctx.deadline) {
        waited_out = absl::DeadlineExceededError(
            absl::StrCat("the deadline passed while another build of '",
                         name.full(), "' was under way"));
        break;
      }
      absl::Time until = ctx.deadline;
      if (ctx.cancelled) until = std::min(until, now + kCancelPoll);
      claim_released_.WaitWithDeadline(&mu_, until);
    }
    if (waited) {
      auto it = build_waiters_.find(name.full());
      if (--it->second == 0) build_waiters_.erase(it);
    }
    MODELSTATE_RETURN_IF_ERROR(waited_out);
    if (!waited || !ctx.still_allowed) {
      if (entries_.contains(name.full())) {
        return absl::AlreadyExistsError(
            absl::StrCat("module '", name.full(), "' already exists"));
      }
      building_.insert(name.full());
      return absl::OkStatus();
    }
    // Claimed while the caller is asked again, so that no other build
    // takes the name meanwhile; released below if it may not go on.
    building_.insert(name.full());
  }
  // After a wait, which may have lasted as long as another build's hooks:
  // a caller revoked meanwhile is refused as a fresh call would be, before
  // it learns whether the name exists. Asked without the lock, since a
  // refusal is recorded in the audit log.
  absl::Status still = ctx.still_allowed();
  MutexLock lock(&mu_);
  if (still.ok() && entries_.contains(name.full())) {
    still = absl::AlreadyExistsError(
        absl::StrCat("module '", name.full(), "' already exists"));
  }
  if (!still.ok()) {
    building_.erase(name.full());
    claim_released_.SignalAll();
  }
  return still;
}

void ModelStore::set_max_build_waiters(int max_waiters) {
  MutexLock lock(&mu_);
  max_build_waiters_ = max_waiters;
}

absl::StatusOr<BuildOutcome> ModelStore::Build(const OperationContext& ctx,
                                               const ModuleName& name,
                                               const ModuleSpec& spec,
                                               const BuildOptions& options,
                                               bool all_or_nothing) {
  // The name is claimed before any quota is reserved: of concurrent
  // builds of one new name, one goes on and the others wait for it,
  // instead of RESOURCE_EXHAUSTED for the max_modules slot the first one
  // holds (or building, and sending hooks their events, only to find the
  // name taken at the end). A waiter is ALREADY_EXISTS once the first is
  // hosted, and builds itself when the first stored nothing: refusing it
  // at once would say the name exists when it may end up free.
  MODELSTATE_RETURN_IF_ERROR(ClaimName(ctx, name));
  // Given up on every return, once the module is hosted or not.
  struct Claim {
    ModelStore* store;
    std::string name;
    ~Claim() {
      MutexLock lock(&store->mu_);
      store->building_.erase(name);
      store->claim_released_.SignalAll();
    }
  } claim{this, name.full()};
  if (ModuleRepository* repo = repository(); repo != nullptr) {
    MODELSTATE_RETURN_IF_ERROR(repo->CheckUsable(name));
  }
  BuildOptions build_options = options;
  build_options.root_path = "";
  // The quota is checked, and its share reserved, from the spec's shapes
  // before a byte is allocated; the build may not allocate more.
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t needed,
                              BuildBytes(name, spec, build_options));
  QuotaHold hold;
  if (absl::Status quota = Reserve(name, 1, needed, nullptr, hold);
      !quota.ok()) {
    return Record(quota, audit_events::Build(ctx, name, spec, options, 0, 0,
                                             all_or_nothing, quota));
  }
  if (needed > 0) {
    build_options.limits.max_total_bytes =
        std::min(build_options.limits.max_total_bytes, needed);
  }
  MODELSTATE_ASSIGN_OR_RETURN(BuildResult built,
                              BuildModule(spec, build_options));
  // The built bytes go to disk while the registrations are decided (hooks,
  // their events' digests, audit records): a build's two slowest steps,
  // independent until a decision changes a tensor. If the write cannot
  // start, Save writes the bytes itself and reports why.
  std::unique_ptr<Prewrite> prewrite;
  if (ModuleRepository* repo = repository();
      repo != nullptr && options.device.has_storage()) {
    if (auto started = repo->StartPrewrite(name, built.root); started.ok()) {
      prewrite = *std::move(started);
    }
  }
  OperationContext seeded = ctx;
  seeded.seed = options.seed;
  std::vector<HookDecision> finals = Decide(seeded, name, built.records);
  if (prewrite != nullptr) prewrite->Wait();
  MODELSTATE_RETURN_IF_ERROR(ApplyFinalDecisions(built.records, finals));
  size_t blocked_count = 0;
  std::vector<std::string> blocked;
  for (size_t i = 0; i < finals.size(); ++i) {
    if (finals[i].blocked()) {
      ++blocked_count;
      blocked.push_back(DescribeBlocked(built.records[i], finals[i]));
    }
  }
  auto recorded = [&](const absl::Status& result) {
    return Record(result,
                  audit_events::Build(ctx, name, spec, options, finals.size(),
                                      blocked_count, all_or_nothing, result));
  };
  if (all_or_nothing && !blocked.empty()) {
    return recorded(absl::FailedPreconditionError(
        absl::StrCat("all_or_nothing build of '", name.full(),
                     "' stored nothing: ", absl::StrJoin(blocked, "; "))));
  }
  // Replacements the subscribers made may hold more than the spec said.
  if (const uint64_t held = HeldBytes(*built.root); held > hold.bytes()) {
    absl::Status quota = Reserve(name, 0, held - hold.bytes(), nullptr, hold);
    if (!quota.ok()) return recorded(quota);
  }
  auto entry = NewEntry(name, built.root);
  // Nobody changes the new module before it is saved and recorded.
  MutexLock gate(&entry->gate);
  absl::Status result;
  {
    // Counted in entries_ from now on, instead of in the reservation.
    MutexLock lock(&mu_);
    if (!entries_.emplace(name.full(), entry).second) {
      result = absl::AlreadyExistsError(
          absl::StrCat("module '", name.full(), "' already exists"));
    }
    ReleaseLocked(hold);
  }
  if (result.ok()) {
    {
      WriterMutexLock lock(&entry->mu);
      result = Persist(ctx, *entry, AuditType::kBuild,
                       prewrite != nullptr ? prewrite->Unchanged()
                                           : std::vector<PrewrittenBytes>());
      if (result.ok() && prewrite != nullptr) prewrite->Keep();
      if (!result.ok()) entry->deleted = true;
    }
    if (!result.ok()) {
      MutexLock lock(&mu_);
      entries_.erase(name.full());
    }
  }
  MODELSTATE_RETURN_IF_ERROR(recorded(result));
  return BuildOutcome{Zip(std::move(built.records), std::move(finals))};
}

namespace {

// Performs the one registration (or removal) a request asks for; the
// context decides whether it is the dry run or the real pass.
absl::StatusOr<RegistrationOutcome> ApplyRequest(
    Module& target, const RegistrationRequest& request, const SlotValue& value,
    const RegistrationContext& context) {
  if (request.removal) return target.RemoveEntry(request.name, context);
  switch (request.kind) {
    case EntryKind::kParameter:
      return target.RegisterParameter(request.name, value.tensor, context);
    case EntryKind::kBuffer:
      return target.RegisterBuffer(request.name, value.tensor, value.persistent,
                                   context);
    case EntryKind::kModule:
      break;
  }
  return target.RegisterModule(request.name, value.module, context);
}

// max_entries for the tree as the registration would leave it: what the
// new value brings in place of the old one, once per path from the root to
// `target` (a module shared along many paths multiplies it; see
// TraversalEntries).
absl::Status CheckRegisteredEntries(const Module& root, const Module& target,
                                    const RegistrationRequest& request,
                                    const SlotValue& value) {
  uint64_t before = 0;
  uint64_t after = 0;
  if (request.kind == EntryKind::kModule) {
    const std::shared_ptr<Module>* old = target.children().Find(request.name);
    if (old != nullptr && *old != nullptr) before = 1 + TraversalEntries(**old);
    if (value.module != nullptr) after = 1 + TraversalEntries(*value.module);
  } else {
    const Tensor* old = request.kind == EntryKind::kParameter
                            ? target.parameters().Find(request.name)
                            : target.buffers().Find(request.name);
    before = old != nullptr && old->defined() ? 1 : 0;
    after = value.tensor.defined() ? 1 : 0;
  }
  if (after <= before) return absl::OkStatus();
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const uint64_t paths = PathsTo(root, target);
  const uint64_t grown = after - before;
  const uint64_t added = paths > kMax / grown ? kMax : paths * grown;
  const uint64_t now = TraversalEntries(root);
  return CheckTraversalEntries(now > kMax - added ? kMax : now + added,
                               request.build_options.limits);
}

}  // namespace

absl::StatusOr<std::vector<RegistrationResult>> ModelStore::Register(
    const OperationContext& ctx, const ModuleName& name,
    RegistrationRequest request) {
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  MutexLock gate(&entry->gate);
  std::shared_ptr<Module> target;
  std::vector<RegistrationRecord> records;
  std::vector<RegistrationRecord> child_records;
  SlotValue value = request.value;
  std::string target_path = request.path;
  {
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) return Gone(*entry);
    MODELSTATE_ASSIGN_OR_RETURN(
        target, Submodule(*entry->root, name, "path", request.path));
    if (request.existing_path.has_value()) {
      MODELSTATE_ASSIGN_OR_RETURN(value.module,
                                  Submodule(*entry->root, name, "existing_path",
                                            *request.existing_path));
    }
  }
  // A submodule spec is built first, detached; its own registrations come
  // before the module event (PyTorch constructs before it assigns).
  auto refused = [&](const absl::Status& quota) {
    return Record(quota,
                  audit_events::Register(ctx, name, target_path, request.name,
                                         nullptr, request.removal, quota));
  };
  // A new value counts in full against the quota (the old one is still
  // held until the change is applied); a module already in the tree adds
  // nothing. A spec is sized, and its bytes reserved, before it is built.
  QuotaHold hold;
  if (request.spec.has_value()) {
    BuildOptions options = request.build_options;
    options.root_path = target_path.empty()
                            ? request.name
                            : absl::StrCat(target_path, ".", request.name);
    MODELSTATE_ASSIGN_OR_RETURN(uint64_t needed,
                                BuildBytes(name, *request.spec, options));
    if (absl::Status quota = Reserve(name, 0, needed, nullptr, hold);
        !quota.ok()) {
      return refused(quota);
    }
    if (needed > 0) {
      options.limits.max_total_bytes =
          std::min(options.limits.max_total_bytes, needed);
    }
    MODELSTATE_ASSIGN_OR_RETURN(BuildResult built,
                                BuildModule(*request.spec, options));
    value.module = built.root;
    child_records = std::move(built.records);
  }
  if (!request.removal) {
    const uint64_t added = request.existing_path.has_value() ? 0
                           : value.module != nullptr ? HeldBytes(*value.module)
                                                     : HeldBytes(value.tensor);
    if (added > hold.bytes()) {
      absl::Status quota =
          Reserve(name, 0, added - hold.bytes(), nullptr, hold);
      if (!quota.ok()) return refused(quota);
    }
  }
  // Dry run: validate and record the event without changing anything.
  RegistrationContext dry;
  dry.records = &records;
  dry.path = target_path;
  dry.dry_run = true;
  {
    ReaderMutexLock lock(&entry->mu);
    MODELSTATE_RETURN_IF_ERROR(
        ApplyRequest(*target, request, value, dry).status());
    if (!request.removal) {
      MODELSTATE_RETURN_IF_ERROR(
          CheckRegisteredEntries(*entry->root, *target, request, value));
    }
  }
  std::vector<RegistrationRecord> all = child_records;
  all.insert(all.end(), records.begin(), records.end());
  std::vector<HookDecision> finals = Decide(ctx, name, all);
  std::vector<HookDecision> child_finals(finals.begin(),
                                         finals.begin() + child_records.size());
  MODELSTATE_RETURN_IF_ERROR(ApplyFinalDecisions(child_records, child_finals));
  const HookDecision& last = finals.back();
  auto recorded = [&](const absl::Status& result) {
    return Record(result, audit_events::Register(
                              ctx, name, target_path, request.name,
                              &all.back().event, request.removal, result));
  };
  if (last.blocked()) {
    return recorded(
        absl::FailedPreconditionError(DescribeBlocked(all.back(), last)));
  }
  // A subscriber's replacement (of the value, or of a tensor in a new
  // submodule) may hold more than the request did: what is stored counts,
  // as for a build (without this, one MODIFY answer put a tensor of any
  // size past the quota).
  if (!request.removal && !request.existing_path.has_value()) {
    const SlotValue& stored =
        last.kind == HookResult::Kind::kReplace ? last.value : value;
    const uint64_t added = stored.module != nullptr ? HeldBytes(*stored.module)
                                                    : HeldBytes(stored.tensor);
    if (added > hold.bytes()) {
      absl::Status quota =
          Reserve(name, 0, added - hold.bytes(), nullptr, hold);
      if (!quota.ok()) return recorded(quota);
    }
  }
  // The real pass, with the final decision replayed as its only hook.
  ReplayHooks replay({last});
  RegistrationContext real;
  real.hooks = replay.registry();
  real.path = target_path;
  absl::Status saved;
  {
    // Applied and saved under the exclusive lock: readers see the change
    // only once it is on disk (or never, if the save fails).
    WriterMutexLock lock(&entry->mu);
    MODELSTATE_RETURN_IF_ERROR(
        ApplyRequest(*target, request, value, real).status());
    saved = Persist(ctx, *entry, AuditType::kRegister);
  }
  MODELSTATE_RETURN_IF_ERROR(recorded(saved));
  return Zip(std::move(all), std::move(finals));
}

absl::Status ModelStore::Read(
    const ModuleName& name,
    absl::FunctionRef<absl::Status(const Module&)> fn) const {
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  ReaderMutexLock lock(&entry->mu);
  if (entry->deleted) {
    return Gone(*entry);
  }
  return fn(*entry->root);
}

absl::StatusOr<StateDictSnapshot> ModelStore::Snapshot(
    const ModuleName& name, const SnapshotFilter& filter) const {
  StateDictSnapshot snapshot;
  MODELSTATE_RETURN_IF_ERROR(Read(name, [&](const Module& root) {
    auto keep = [&](const std::string& key, const Tensor& t, EntryKind kind) {
      if (!absl::StartsWith(key, filter.key_prefix)) return;
      if (!filter.key_glob.empty() && !GlobMatch(filter.key_glob, key)) return;
      snapshot.kinds.push_back(kind);
      // A snapshot of the bytes that still says whether it requires grad.
      Tensor detached = t.Detach();
      if (t.requires_grad()) detached.SetRequiresGrad(true).IgnoreError();
      snapshot.state.tensors.Set(key, std::move(detached));
    };
    switch (filter.selection) {
      case SnapshotFilter::Selection::kStateDict: {
        StateDict kept = root.GetStateDict("", /*keep_vars=*/true);
        snapshot.state.metadata = std::move(kept.metadata);
        for (const auto& item : kept.tensors) {
          keep(item.key, item.value,
               item.value.is_parameter() ? EntryKind::kParameter
                                         : EntryKind::kBuffer);
        }
        break;
      }
      case SnapshotFilter::Selection::kParameters:
        for (const auto& [key, t] : root.NamedParameters()) {
          keep(key, t, EntryKind::kParameter);
        }
        break;
      case SnapshotFilter::Selection::kBuffers:
        for (const auto& [key, t] : root.NamedBuffers()) {
          keep(key, t, EntryKind::kBuffer);
        }
        break;
    }
    return absl::OkStatus();
  }));
  return snapshot;
}

absl::StatusOr<LoadResult> ModelStore::Load(const OperationContext& ctx,
                                            const ModuleName& name,
                                            const StateDict& state_dict,
                                            const LoadOptions& options,
                                            absl::string_view sha256,
                                            uint64_t incarnation) {
  return LoadImpl(ctx, name, state_dict, options, nullptr, sha256, incarnation);
}

absl::StatusOr<std::unique_ptr<StagedStateDict>> ModelStore::StageLoad(
    const OperationContext& ctx, const ModuleName& name, StateDictLayout layout,
    const StreamLimits& limits, const LoadOptions& options,
    const std::string& staging_dir) {
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  std::unique_ptr<StagedStateDict> staged;
  if (ModuleRepository* repo = repository(); repo != nullptr) {
    // Staged straight into a data file of the module: written once.
    MODELSTATE_ASSIGN_OR_RETURN(std::string path, repo->ReserveDataFile(name));
    absl::StatusOr<std::unique_ptr<StagedStateDict>> created =
        StagedStateDict::CreateFile(
            std::move(layout), limits, path,
            [repo, name, path] { repo->ReleaseDataFile(name, path); });
    if (!created.ok()) {
      repo->ReleaseDataFile(name, path);
      return created.status();
    }
    staged = *std::move(created);
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(
        staged, StagedStateDict::CreateAnonymous(std::move(layout), limits,
                                                 staging_dir));
  }
  StateDict described = staged->Describe();
  if (options.assign) {
    // Checked again when it applies; refused now if it cannot fit.
    QuotaHold hold;
    if (absl::Status quota = ReserveAssigned(name, *entry, described, hold);
        !quota.ok()) {
      return Record(quota, audit_events::LoadStateDict(
                               ctx, name, options, described, nullptr, quota));
    }
  }
  if (!options.atomic) return staged;  // a partial load may still apply
  // A load that cannot succeed fails now, before its bytes travel.
  absl::Status fits;
  {
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) {
      return Gone(*entry);
    }
    std::vector<RegistrationRecord> unused;
    RegistrationContext check;
    check.hooks = nullptr;
    check.records = &unused;
    check.dry_run = true;
    LoadOptions checked = options;
    checked.source = staged.get();
    fits = entry->root->LoadStateDict(described, checked, check).status();
  }
  if (!fits.ok()) {
    return Record(fits, audit_events::LoadStateDict(ctx, name, options,
                                                    described, nullptr, fits));
  }
  return staged;
}

absl::StatusOr<LoadResult> ModelStore::LoadStaged(const OperationContext& ctx,
                                                  const ModuleName& name,
                                                  StagedStateDict& staged,
                                                  LoadOptions options,
                                                  absl::string_view sha256,
                                                  uint64_t incarnation) {
  // Deleted while its bytes came: the load is for a module that is gone,
  // and its staged file has no directory left to land in.
  if (absl::StatusOr<std::shared_ptr<Entry>> entry =
          FindLoadTarget(name, incarnation);
      entry.ok()) {
    ReaderMutexLock lock(&(*entry)->mu);
    if ((*entry)->deleted) {
      return RecordLoadFailure(ctx, name, options, Gone(**entry));
    }
  } else {
    return RecordLoadFailure(ctx, name, options, entry.status());
  }
  absl::StatusOr<StateDict> described = staged.Finish();
  if (!described.ok()) {
    return RecordLoadFailure(ctx, name, options, described.status());
  }
  options.source = &staged;
  return LoadImpl(ctx, name, *described, options, &staged, sha256, incarnation);
}

absl::Status ModelStore::RecordLoadFailure(const OperationContext& ctx,
                                           const ModuleName& name,
                                           const LoadOptions& options,
                                           absl::Status why) {
  return Record(why, audit_events::LoadStateDict(ctx, name, options,
                                                 StateDict(), nullptr, why));
}

absl::StatusOr<LoadResult> ModelStore::LoadImpl(
    const OperationContext& ctx, const ModuleName& name,
    const StateDict& state_dict, const LoadOptions& options,
    StagedStateDict* staged, absl::string_view sha256, uint64_t incarnation) {
  absl::StatusOr<std::shared_ptr<Entry>> target =
      FindLoadTarget(name, incarnation);
  if (absl::IsAborted(target.status())) {
    return RecordLoadFailure(ctx, name, options, target.status());
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, std::move(target));
  MutexLock gate(&entry->gate);
  std::optional<ReplayHooks> replay;
  QuotaHold hold;
  if (options.assign) {
    // Assigned values replace the module's tensors: they may hold more.
    if (absl::Status quota = ReserveAssigned(name, *entry, state_dict, hold);
        !quota.ok()) {
      return Record(quota,
                    audit_events::LoadStateDict(ctx, name, options, state_dict,
                                                nullptr, quota, sha256));
    }
    // Installations are registrations: decide them on a dry run first.
    std::vector<RegistrationRecord> records;
    RegistrationContext dry;
    dry.records = &records;
    dry.dry_run = true;
    {
      ReaderMutexLock lock(&entry->mu);
      if (entry->deleted) {
        return Gone(*entry);
      }
      MODELSTATE_RETURN_IF_ERROR(
          entry->root->LoadStateDict(state_dict, options, dry).status());
    }
    replay.emplace(Decide(ctx, name, records));
  }
  absl::StatusOr<LoadResult> result;
  absl::Status saved;
  {
    // Applied and saved under the exclusive lock: readers see the new
    // values only once they are on disk (or never, if the save fails).
    WriterMutexLock lock(&entry->mu);
    if (entry->deleted) {
      return Gone(*entry);
    }
    RegistrationContext real;
    real.hooks = replay.has_value() ? replay->registry() : nullptr;
    result = entry->root->LoadStateDict(state_dict, options, real);
    // Entries copied unchanged from a staged file are on disk already.
    std::vector<PrewrittenBytes> prewritten;
    if (staged != nullptr) {
      const std::string file =
          std::filesystem::path(staged->path()).filename().string();
      for (const StagedStateDict::CopiedEntry& c : staged->copied()) {
        prewritten.push_back({c.storage, c.dtype, file, c.key, c.crc32c});
      }
    }
    // A failed non-atomic load may have changed some tensors already.
    if (result.ok() || !options.atomic) {
      saved = Persist(ctx, *entry, AuditType::kLoadStateDict, prewritten);
    }
    if (saved.ok() && !prewritten.empty()) staged->Keep();
  }
  const absl::Status status = result.ok() ? saved : result.status();
  MODELSTATE_RETURN_IF_ERROR(Record(
      status, audit_events::LoadStateDict(ctx, name, options, state_dict,
                                          result.ok() ? &result->keys : nullptr,
                                          status, sha256)));
  return result;
}

absl::Status ModelStore::Move(const OperationContext& ctx,
                              const ModuleName& name,
                              std::optional<Device> device,
                              std::optional<DType> dtype, bool convert_all) {
  if (convert_all && !dtype.has_value()) {
    return absl::InvalidArgumentError(
        "convert_all: needs the dtype every tensor converts to");
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  MutexLock gate(&entry->gate);
  auto recorded = [&](const absl::Status& result) {
    return Record(result, audit_events::Move(ctx, name, device, dtype,
                                             convert_all, result));
  };
  uint64_t bytes_after = 0;
  {
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) {
      return Gone(*entry);
    }
    bytes_after = HeldBytesAfterMove(*entry->root, device, dtype, convert_all);
  }
  QuotaHold hold;
  if (absl::Status quota = Reserve(name, 0, bytes_after, entry.get(), hold);
      !quota.ok()) {
    return recorded(quota);
  }
  absl::Status result;
  {
    WriterMutexLock lock(&entry->mu);
    if (entry->deleted) {
      return Gone(*entry);
    }
    result = CheckHeldBytes(*entry->root);
    if (result.ok()) {
      result = convert_all ? entry->root->Type(*dtype, device)
                           : entry->root->To(device, dtype);
    }
    if (result.ok()) result = Persist(ctx, *entry, AuditType::kMove);
  }
  return recorded(result);
}

absl::Status ModelStore::SetTraining(const OperationContext& ctx,
                                     const ModuleName& name, bool training) {
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  MutexLock gate(&entry->gate);
  absl::Status saved;
  {
    WriterMutexLock lock(&entry->mu);
    if (entry->deleted) {
      return Gone(*entry);
    }
    entry->root->Train(training);
    saved = Persist(ctx, *entry, AuditType::kSetTraining);
  }
  return Record(saved, audit_events::SetTraining(ctx, name, training, saved));
}

namespace {

// The tensors `root` holds (parameters, then buffers, persistent or not),
// each storage once, by key.
std::vector<std::pair<std::string, Tensor>> HeldTensors(const Module& root) {
  std::vector<std::pair<std::string, Tensor>> held = root.NamedParameters();
  for (auto& item : root.NamedBuffers()) held.push_back(std::move(item));
  absl::flat_hash_set<const Storage*> seen;
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [key, t] : held) {
    if (t.defined() && t.storage() != nullptr &&
        seen.insert(t.storage().get()).second) {
      out.emplace_back(std::move(key), std::move(t));
    }
  }
  return out;
}

// Whether module(*inputs) on `target` may write its weights whatever the
// mode: an Embedding or EmbeddingBag with max_norm renormalises the rows it
// looks up, in eval mode too, as PyTorch does.
bool Renormalises(const Module& target) {
  for (const auto& [key, m] : target.NamedModules()) {
    const AttrValue* max_norm = m->attributes().Find("max_norm");
    if (max_norm != nullptr &&
        !std::holds_alternative<std::monostate>(*max_norm)) {
      return true;
    }
  }
  return false;
}

// Whether a forward call through `target` changes it: a training-mode
// submodule writes its buffers, and an Embedding with max_norm renormalises.
bool ForwardChanges(const Module& target, std::optional<bool> training) {
  for (const auto& [key, m] : target.NamedModules()) {
    if (training.value_or(m->is_training())) return true;
  }
  return Renormalises(target);
}

// Whether a forward call through `target` may run under a reader's lock:
// it changes nothing and switches no mode.
bool ForwardOnlyReads(const Module& target, std::optional<bool> training) {
  for (const auto& [key, m] : target.NamedModules()) {
    if (m->is_training()) return false;
  }
  return !ForwardChanges(target, training);
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> ModelStore::Forward(
    const OperationContext& ctx, const ModuleName& name,
    const std::string& path, std::vector<Tensor> inputs,
    std::optional<bool> training, uint64_t seed,
    absl::FunctionRef<absl::Status()> allow_change) {
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  ForwardOptions options;
  options.seed = seed;
  {
    // An eval call that changes nothing is a reader: it shares the lock
    // with other readers (and other eval calls) and waits for no writer's
    // pending decisions.
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) return Gone(*entry);
    MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Module> target,
                                Submodule(*entry->root, name, "path", path));
    if (ForwardOnlyReads(*target, training)) {
      MODELSTATE_RETURN_IF_ERROR(CheckHeldBytes(*target));
      return modelstate::Forward(*target, std::move(inputs), options);
    }
  }
  MutexLock gate(&entry->gate);
  bool will_change = false;
  {
    // Every writer holds the gate, so what this call would change cannot
    // change before it runs: the permission asked is the one it needs.
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) return Gone(*entry);
    MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Module> target,
                                Submodule(*entry->root, name, "path", path));
    will_change = ForwardChanges(*target, training);
  }
  if (will_change) MODELSTATE_RETURN_IF_ERROR(allow_change());
  absl::StatusOr<std::vector<Tensor>> outputs;
  bool changed = false;
  absl::Status saved;
  {
    // Exclusive: a training-mode call writes buffers, and the modes are
    // switched for the call.
    WriterMutexLock lock(&entry->mu);
    if (entry->deleted) {
      return Gone(*entry);
    }
    absl::StatusOr<std::shared_ptr<Module>> target =
        Submodule(*entry->root, name, "path", path);
    if (!target.ok()) return target.status();
    std::vector<std::pair<Module*, bool>> modes;
    changed = ForwardChanges(**target, training);
    for (const auto& [key, m] : (*target)->NamedModules()) {
      modes.emplace_back(m.get(), m->is_training());
    }
    absl::Status intact = CheckHeldBytes(**target);
    if (!intact.ok()) return intact;
    if (training.has_value()) (*target)->Train(*training);
    outputs = modelstate::Forward(**target, std::move(inputs), options);
    for (auto& [m, mode] : modes) m->set_training(mode);
    // Buffers (or renormalised weights) may have changed even if a later
    // submodule failed, as in PyTorch: save either way, before anyone
    // reads them.
    if (changed) saved = Persist(ctx, *entry, AuditType::kForward);
  }
  if (!changed) return outputs;
  absl::Status result = saved.ok() ? outputs.status() : saved;
  MODELSTATE_RETURN_IF_ERROR(
      Record(result, audit_events::Forward(ctx, name, path, result)));
  return outputs;
}

absl::Status ModelStore::Delete(const OperationContext& ctx,
                                const ModuleName& name) {
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  MutexLock gate(&entry->gate);
  {
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) {
      return Gone(*entry);
    }
  }
  ModuleRepository* repo = repository();
  if (repo != nullptr) {
    if (absl::Status fenced = CheckWriteFence(); !fenced.ok()) {
      return Record(fenced, audit_events::Delete(ctx, name, fenced));
    }
    absl::Status removed = repo->Remove(name, NoteFor(ctx, AuditType::kDelete));
    if (!removed.ok()) {
      absl::Status failed = absl::InternalError(absl::StrCat(
          "module '", name.full(), "' was not deleted: ", removed.message()));
      return Record(failed, audit_events::Delete(ctx, name, failed));
    }
  }
  Withdraw(*entry, "");
  absl::Status recorded = Record(
      absl::OkStatus(), audit_events::Delete(ctx, name, absl::OkStatus()));
  // Once recorded, the deletion needs no trace on disk.
  if (recorded.ok() && repo != nullptr) repo->DropTombstone(name);
  return recorded;
}

void ModelStore::Withdraw(Entry& entry, const std::string& moved_to) {
  {
    WriterMutexLock lock(&entry.mu);
    entry.deleted = true;
    entry.moved_to = moved_to;
  }
  MutexLock lock(&mu_);
  auto it = entries_.find(entry.name.full());
  if (it != entries_.end() && it->second.get() == &entry) entries_.erase(it);
}

absl::Status ModelStore::Gone(const Entry& entry) {
  if (entry.moved_to.empty()) return NoSuchModule(entry.name);
  return absl::UnavailableError(
      absl::StrCat("module '", entry.name.full(), "' moved to replica ",
                   entry.moved_to, " while the call waited; retry"));
}

absl::Status ModelStore::MoveOut(
    const OperationContext& ctx, const ModuleName& name,
    const std::string& to_replica,
    absl::FunctionRef<
        absl::StatusOr<uint64_t>(const std::vector<std::string>& files)>
        send,
    const std::function<bool(const absl::Status&)>& still_owner) {
  ModuleRepository* repo = repository();
  if (repo == nullptr) {
    return absl::FailedPreconditionError(
        "a module moves as its files: this server keeps no data directory");
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  // Writers wait here until the module is hosted elsewhere (or the move
  // failed); the files cannot change meanwhile.
  MutexLock gate(&entry->gate);
  {
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) return Gone(*entry);
  }
  auto recorded = [&](const absl::Status& result, uint64_t bytes) {
    return Record(result,
                  audit_events::MoveOut(ctx, name, to_replica, bytes, result));
  };
  absl::StatusOr<std::vector<std::string>> files = repo->CommittedFiles(name);
  if (!files.ok()) return recorded(files.status(), 0);
  // Marked before any file leaves: a crash from here on leaves a copy that
  // a restart hosts only where the cluster still names this replica.
  if (absl::Status marked = repo->MarkMove(name, "out", to_replica);
      !marked.ok()) {
    return recorded(marked, 0);
  }
  absl::StatusOr<uint64_t> sent = send(*files);
  if (!sent.ok()) {
    // Whether the other replica took the module over before the failure
    // is the cluster's to say; asked under the gate, so that no later move
    // of the module has marked it meanwhile.
    if (still_owner && still_owner(sent.status())) {
      repo->SettleMove(name).IgnoreError();
    }
    return recorded(sent.status(), 0);
  }
  // Hosted there now: the copy here goes. A removal that fails leaves the
  // files, marked (start-up finds the module owned elsewhere and sets the
  // copy aside).
  absl::Status removed = repo->Remove(name, NoteFor(ctx, AuditType::kMoveOut));
  Withdraw(*entry, to_replica);
  absl::Status result = recorded(absl::OkStatus(), *sent);
  if (result.ok() && removed.ok()) repo->DropTombstone(name);
  return result;
}

absl::StatusOr<std::string> ModelStore::ReserveImportFile(
    const ModuleName& name) {
  ModuleRepository* repo = repository();
  if (repo == nullptr) {
    return absl::FailedPreconditionError(
        "a module moves as its files: this server keeps no data directory");
  }
  if (Contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("module '", name.full(), "' is already hosted here"));
  }
  return repo->ReserveDataFile(name);
}

void ModelStore::AbandonImport(
    const ModuleName& name,
    const std::map<std::string, std::string>& received) {
  ModuleRepository* repo = repository();
  if (repo == nullptr) return;
  for (const auto& [sent, path] : received) {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
    repo->ReleaseDataFile(name, path);
  }
}

absl::Status ModelStore::MoveIn(
    const OperationContext& ctx, const ModuleName& name,
    const std::string& from_replica, absl::string_view manifest,
    const std::map<std::string, std::string>& received, uint64_t bytes,
    absl::FunctionRef<absl::Status()> take_ownership) {
  auto recorded = [&](const absl::Status& result) {
    return Record(result,
                  audit_events::MoveIn(ctx, name, from_replica, bytes, result));
  };
  ModuleRepository* repo = repository();
  if (repo == nullptr || Contains(name)) {
    AbandonImport(name, received);
    return recorded(repo == nullptr
                        ? absl::FailedPreconditionError(
                              "this server keeps no data directory")
                        : absl::AlreadyExistsError(absl::StrCat(
                              "module '", name.full(), "' already exists")));
  }
  const ChangeNote note = NoteFor(ctx, AuditType::kMoveIn);
  absl::StatusOr<ModuleRepository::Loaded> loaded =
      repo->Import(name, manifest, received, note, from_replica);
  if (!loaded.ok()) return recorded(loaded.status());
  auto undo = [&](absl::Status why) {
    if (repo->Remove(name, note).ok()) repo->DropTombstone(name);
    return recorded(why);
  };
  QuotaHold hold;
  if (absl::Status quota =
          Reserve(name, 1, HeldBytes(*loaded->root), nullptr, hold);
      !quota.ok()) {
    return undo(quota);
  }
  // Hosted before the takeover, its writers held off: once the cluster
  // names this replica the owner, a build of the name finds it here.
  auto entry = NewEntry(name, std::move(loaded->root));
  MutexLock gate(&entry->gate);
  {
    MutexLock lock(&mu_);
    if (!entries_.emplace(name.full(), entry).second) {
      // Unreachable: Import found no manifest, and every hosted module has
      // one. The files are not touched: they may be the other module's.
      return recorded(absl::InternalError(absl::StrCat(
          "module '", name.full(), "' appeared here during its import")));
    }
    ReleaseLocked(hold);
  }
  if (absl::Status taken = take_ownership(); !taken.ok()) {
    Withdraw(*entry, "");
    return undo(taken);
  }
  // Owned here now. A mark left by a failed unlink is settled at the next
  // start, which finds this replica named the owner.
  if (absl::Status settled = repo->SettleMove(name); !settled.ok()) {
    Log(LogLevel::kWarning, "could not clear a move mark",
        {.correlation_id = ctx.correlation_id,
         .fields = {{"module", name.full()},
                    {"error", std::string(settled.message())}}});
  }
  return recorded(absl::OkStatus());
}

bool ModelStore::InMove(const ModuleName& name) const {
  ModuleRepository* repo = repository();
  return repo != nullptr && repo->InMove(name);
}

absl::Status ModelStore::SettleMove(const ModuleName& name) {
  ModuleRepository* repo = repository();
  return repo == nullptr ? absl::OkStatus() : repo->SettleMove(name);
}

absl::Status ModelStore::SetAside(const ModuleName& name,
                                  const std::string& owner,
                                  const std::string& destination) {
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(name));
  MutexLock gate(&entry->gate);
  {
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) return Gone(*entry);
  }
  ModuleRepository* repo = repository();
  absl::Status moved =
      repo == nullptr ? absl::OkStatus() : repo->SetAside(name, destination);
  // Withdrawn even when its files could not move: the copy is not the
  // owner's, so serving it would show state the cluster may have changed
  // or deleted since.
  Withdraw(*entry, owner);
  return Record(moved, audit_events::SetAside(name, owner, destination, moved));
}

std::vector<ModuleSummary> ModelStore::List(absl::string_view ns,
                                            absl::string_view after,
                                            size_t limit) const {
  std::vector<std::shared_ptr<Entry>> picked;
  {
    MutexLock lock(&mu_);
    auto it = after.empty() ? entries_.begin()
                            : entries_.upper_bound(std::string(after));
    for (; it != entries_.end() && picked.size() < limit; ++it) {
      if (!ns.empty() && it->second->name.ns != ns) continue;
      picked.push_back(it->second);
    }
  }
  std::vector<ModuleSummary> out;
  for (const auto& entry : picked) {
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) continue;
    ModuleSummary summary;
    summary.name = entry->name;
    summary.type = entry->root->type_name();
    summary.total_bytes = entry->root->TotalBytes();
    absl::flat_hash_set<std::string> devices;
    for (const auto& [key, t] : entry->root->NamedParameters()) {
      summary.num_parameters += static_cast<uint64_t>(t.numel());
      devices.insert(t.device().ToString());
    }
    for (const auto& [key, t] : entry->root->NamedBuffers()) {
      devices.insert(t.device().ToString());
    }
    summary.devices.assign(devices.begin(), devices.end());
    std::sort(summary.devices.begin(), summary.devices.end());
    out.push_back(std::move(summary));
  }
  return out;
}

size_t ModelStore::size() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

ModelStore::ScrubReport ModelStore::Scrub(
    absl::FunctionRef<bool()> stopping) const {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    MutexLock lock(&mu_);
    for (const auto& [key, entry] : entries_) entries.push_back(entry);
  }
  ScrubReport report;
  for (const std::shared_ptr<Entry>& entry : entries) {
    // The storages are held while their bytes are read, not the module:
    // a writer replaces a storage rather than writing into a mapped one.
    // (Not the tensors: a writer may swap a tensor's storage meanwhile.)
    std::vector<std::pair<std::string, std::shared_ptr<const Storage>>> mapped;
    {
      ReaderMutexLock lock(&entry->mu);
      if (entry->deleted) continue;
      for (auto& [key, t] : HeldTensors(*entry->root)) {
        if (t.storage()->read_only()) mapped.emplace_back(key, t.storage());
      }
    }
    ++report.modules;
    for (const auto& [key, storage] : mapped) {
      if (stopping()) return report;
      ++report.storages;
      report.bytes += storage->nbytes();
      const bool was_damaged = storage->damaged();
      absl::Status intact = storage->CheckIntegrity(/*again=*/true);
      if (!intact.ok()) {
        report.damaged.push_back(absl::DataLossError(
            absl::StrCat("'", key, "': ", intact.message())));
        if (!was_damaged) ++report.newly_damaged;
      }
    }
  }
  return report;
}

std::vector<ModelStore::NamespaceUsage> ModelStore::Usage() const {
  std::vector<std::shared_ptr<Entry>> entries;
  QuotaPolicy quotas;
  {
    MutexLock lock(&mu_);
    quotas = quotas_;
    for (const auto& [key, entry] : entries_) entries.push_back(entry);
  }
  // Name order puts a namespace's modules together.
  std::vector<NamespaceUsage> usage;
  for (const std::shared_ptr<Entry>& entry : entries) {
    ReaderMutexLock lock(&entry->mu);
    if (entry->deleted) continue;
    if (usage.empty() || usage.back().ns != entry->name.ns) {
      NamespaceUsage ns;
      ns.ns = entry->name.ns;
      ns.quota = quotas.For(entry->name.ns);
      usage.push_back(std::move(ns));
    }
    NamespaceUsage& ns = usage.back();
    ++ns.modules;
    std::map<std::string, uint64_t> by_device;
    auto add = [&by_device](const Tensor& t) {
      if (t.defined()) by_device[t.device().ToString()] += HeldBytes(t);
    };
    for (const auto& [key, t] : entry->root->NamedParameters()) add(t);
    for (const auto& [key, t] : entry->root->NamedBuffers()) add(t);
    for (const auto& [device, bytes] : by_device) {
      auto it =
          std::lower_bound(ns.devices.begin(), ns.devices.end(), device,
                           [](const DeviceUsage& d, const std::string& name) {
                             return d.device < name;
                           });
      if (it == ns.devices.end() || it->device != device) {
        DeviceUsage added;
        added.device = device;
        it = ns.devices.insert(it, std::move(added));
      }
      ++it->modules;
      it->bytes += bytes;
      ns.bytes += bytes;
    }
  }
  return usage;
}

}  // namespace modelstate
