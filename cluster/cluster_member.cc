#include "cluster/cluster_member.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace modelstate {

namespace {

// FNV-1a: the same on every replica (absl::Hash is seeded per process), so
// that replicas break placement ties alike.
uint64_t StableHash(absl::string_view a, absl::string_view b) {
  uint64_t hash = 14695981039346656037ull;
  auto mix = [&](absl::string_view text) {
    for (unsigned char c : text) {
      hash ^= c;
      hash *= 1099511628211ull;
    }
  };
  mix(a);
  mix("\n");
  mix(b);
  return hash;
}

}  // namespace

ClusterMember::ClusterMember(ClusterOptions options,
                             std::unique_ptr<EtcdClient> etcd)
    : options_(std::move(options)), etcd_(std::move(etcd)) {}

absl::StatusOr<std::unique_ptr<ClusterMember>> ClusterMember::Join(
    ClusterOptions options, const std::vector<std::string>& local_modules,
    const std::vector<std::string>& in_move, JoinReport* report) {
  if (options.replica_id.empty()) {
    return absl::InvalidArgumentError("replica_id: empty");
  }
  for (char c : options.replica_id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' &&
        c != '.' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("replica_id: '", options.replica_id,
                       "' may hold only [A-Za-z0-9_.-]"));
    }
  }
  if (options.advertise_address.empty()) {
    return absl::InvalidArgumentError("advertise_address: empty");
  }
  if (options.lease_seconds < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster_lease_seconds: ", options.lease_seconds, " is below 2"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd,
                              EtcdClient::Create(options.etcd));
  auto member = std::unique_ptr<ClusterMember>(
      new ClusterMember(std::move(options), std::move(etcd)));
  MODELSTATE_RETURN_IF_ERROR(member->Register(/*first=*/true));
  const absl::flat_hash_set<std::string> moving(in_move.begin(), in_move.end());
  for (const std::string& module : local_modules) {
    if (moving.contains(module)) {
      // Claiming it would bring back a module its new owner deleted.
      absl::StatusOr<std::optional<std::string>> owner =
          member->OwnerOf(module);
      if (owner.ok() && *owner == member->replica()) {
        // Written again first: the move this replica was sending may still
        // reach the receiver's takeover, which then fails.
        absl::StatusOr<bool> kept = member->KeepOwnership(module);
        if (kept.ok() && *kept) {
          if (report != nullptr) report->moves_settled.push_back(module);
          continue;
        }
        owner = kept.ok()
                    ? member->OwnerOf(module)
                    : absl::StatusOr<std::optional<std::string>>(kept.status());
      }
      if (owner.ok() && *owner != member->replica() && report != nullptr) {
        report->owned_elsewhere.push_back({module, owner->value_or("")});
        continue;
      }
      Log(LogLevel::kWarning, "a hosted module's move was under way",
          {.correlation_id = "",
           .fields = {
               {"module", module},
               {"owner", owner.ok() ? owner->value_or("none")
                                    : std::string(owner.status().message())}}});
      continue;
    }
    absl::Status claimed = member->Claim(module);
    if (absl::IsFailedPrecondition(claimed) && report != nullptr) {
      absl::StatusOr<std::optional<std::string>> owner =
          member->OwnerOf(module);
      if (owner.ok() && owner->has_value() && **owner != member->replica()) {
        report->owned_elsewhere.push_back({module, **owner});
        continue;
      }
    }
    if (!claimed.ok()) {
      Log(LogLevel::kWarning, "a hosted module is owned elsewhere",
          {.correlation_id = "",
           .fields = {{"module", module},
                      {"error", std::string(claimed.message())}}});
    }
  }
  absl::Status published = member->PublishCheckpoint();
  if (!published.ok()) {
    Log(LogLevel::kWarning, "could not record the audit checkpoint",
        {.correlation_id = "",
         .fields = {{"error", std::string(published.message())}}});
  }
  member->renewer_ = std::thread([m = member.get()] { m->RenewLoop(); });
  return member;
}

ClusterMember::~ClusterMember() {
  stop_.Notify();
  if (renewer_.joinable()) renewer_.join();
  const int64_t held = lease();
  if (held != 0) {
    absl::Status revoked = etcd_->RevokeLease(held);
    if (!revoked.ok()) {
      Log(LogLevel::kWarning, "could not revoke the cluster lease",
          {.correlation_id = "",
           .fields = {{"error", std::string(revoked.message())}}});
    }
  }
}

std::string ClusterMember::MemberKey(absl::string_view replica) const {
  return absl::StrCat(options_.key_prefix, "members/", replica);
}

std::string ClusterMember::OwnerKey(absl::string_view module) const {
  return absl::StrCat(options_.key_prefix, "owners/", module);
}

std::string ClusterMember::CheckpointKey(absl::string_view replica) const {
  return absl::StrCat(options_.key_prefix, "checkpoints/", replica);
}

std::string ClusterMember::SubscriberKey(absl::string_view name) const {
  return absl::StrCat(options_.key_prefix, "subscribers/", name, "/",
                      replica());
}

absl::Status ClusterMember::RecordSubscriber(const std::string& name) {
  {
    MutexLock lock(&mu_);
    if (subscribers_[name]++ > 0) return absl::OkStatus();
  }
  absl::Status put = etcd_->Put(SubscriberKey(name), replica(), lease());
  if (!put.ok()) ForgetSubscriber(name);
  return put;
}

void ClusterMember::ForgetSubscriber(const std::string& name) {
  {
    MutexLock lock(&mu_);
    auto it = subscribers_.find(name);
    if (it == subscribers_.end() || --it->second > 0) return;
    subscribers_.erase(it);
  }
  // Best effort: a record left behind goes with the lease.
  (void)etcd_->DeleteIfValue(SubscriberKey(name), replica());
}

absl::StatusOr<std::vector<RecordedSubscriber>>
ClusterMember::RecordedSubscribers() {
  const std::string prefix = absl::StrCat(options_.key_prefix, "subscribers/");
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs,
                              etcd_->GetPrefix(prefix));
  std::vector<RecordedSubscriber> out;
  for (const EtcdKeyValue& kv : kvs) {
    absl::string_view rest = absl::string_view(kv.key).substr(prefix.size());
    const size_t slash = rest.rfind('/');
    if (slash == absl::string_view::npos) continue;
    out.push_back({std::string(rest.substr(0, slash)), kv.value});
  }
  return out;
}

absl::Status ClusterMember::PublishCheckpoint() {
  if (!options_.audit_checkpoint) return absl::OkStatus();
  auto [key, note] = options_.audit_checkpoint();
  if (note.empty() || note == published_) return absl::OkStatus();
  MODELSTATE_RETURN_IF_ERROR(etcd_->Put(
      CheckpointKey(replica()),
      nlohmann::json({{"verifier_key", key}, {"note", note}}).dump()));
  published_ = std::move(note);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RecordedCheckpoint>> ClusterMember::Checkpoints() {
  const std::string prefix = CheckpointKey("");
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs,
                              etcd_->GetPrefix(prefix));
  std::vector<RecordedCheckpoint> out;
  for (const EtcdKeyValue& kv : kvs) {
    nlohmann::json record = nlohmann::json::parse(kv.value, nullptr, false);
    if (!record.is_object() || !record.contains("verifier_key") ||
        !record["verifier_key"].is_string() || !record.contains("note") ||
        !record["note"].is_string()) {
      continue;
    }
    out.push_back({kv.key.substr(prefix.size()),
                   record["verifier_key"].get<std::string>(),
                   record["note"].get<std::string>()});
  }
  return out;
}

absl::Status ClusterMember::Register(bool first) {
  const absl::Time sent = absl::Now();
  MODELSTATE_ASSIGN_OR_RETURN(EtcdLease lease,
                              etcd_->GrantLease(options_.lease_seconds));
  const std::string record =
      nlohmann::json({{"address", options_.advertise_address},
                      {"lease", lease.id},
                      {"volume", options_.volume_id}})
          .dump();
  MODELSTATE_ASSIGN_OR_RETURN(
      bool created,
      etcd_->CreateIfAbsent(MemberKey(replica()), record, lease.id));
  if (!created) {
    MODELSTATE_ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> existing,
                                etcd_->Get(MemberKey(replica())));
    if (existing.has_value()) {
      nlohmann::json old =
          nlohmann::json::parse(existing->value, nullptr, false);
      const bool same_volume = old.is_object() && old.contains("volume") &&
                               old["volume"] == options_.volume_id;
      if (!same_volume) {
        (void)etcd_->RevokeLease(lease.id);
        const absl::Status taken = absl::AlreadyExistsError(
            absl::StrCat("replica_id: a live member is already named '",
                         replica(), "' (etcd key ", MemberKey(replica()), ")"));
        if (first) return taken;
        // Another server took the id while this one's lease had lapsed (a
        // second server started with it, this one paused). Overwriting its
        // record would give two servers one id; this one stands down
        // instead, and serves nothing from now on.
        MutexLock lock(&mu_);
        displaced_ = absl::FailedPreconditionError(absl::StrCat(
            "replica ", replica(),
            " was replaced by another server with the same replica_id (and "
            "another volume) while its lease had lapsed; it serves nothing "
            "more: stop it, or give it a replica_id of its own"));
        return displaced_;
      }
      // Our own previous life: its lease goes, and its record with it.
      (void)etcd_->RevokeLease(existing->lease);
    }
    MODELSTATE_RETURN_IF_ERROR(
        etcd_->Put(MemberKey(replica()), record, lease.id));
  }
  std::vector<std::string> subscribers;
  {
    MutexLock lock(&mu_);
    lease_ = lease.id;
    live_until_ = sent + absl::Seconds(lease.ttl_seconds);
    for (const auto& entry : subscribers_) subscribers.push_back(entry.first);
  }
  // Recorded under a lease that lapsed: again under this one.
  for (const std::string& name : subscribers) {
    MODELSTATE_RETURN_IF_ERROR(
        etcd_->Put(SubscriberKey(name), replica(), lease.id));
  }
  return absl::OkStatus();
}

void ClusterMember::RenewLoop() {
  const absl::Duration period = absl::Seconds(options_.lease_seconds) / 3;
  absl::Duration wait = period;
  while (!stop_.WaitForNotificationWithTimeout(wait)) {
    const absl::Time sent = absl::Now();
    absl::StatusOr<int64_t> ttl = etcd_->KeepAlive(lease());
    absl::Status status = ttl.status();
    if (ttl.ok() && *ttl > 0) {
      {
        MutexLock lock(&mu_);
        live_until_ = sent + absl::Seconds(*ttl);
      }
      absl::Status published = PublishCheckpoint();
      if (!published.ok()) {
        Log(LogLevel::kWarning, "could not record the audit checkpoint",
            {.correlation_id = "",
             .fields = {{"error", std::string(published.message())}}});
      }
    } else if (ttl.ok()) {
      // The lease expired (this process was stopped, or cut off from etcd
      // for longer than its time to live): join again under a new one.
      Log(LogLevel::kWarning, "the cluster lease expired; registering again");
      status = Register(/*first=*/false);
      if (absl::Status standing = Standing(); !standing.ok()) {
        Log(LogLevel::kError, std::string(standing.message()));
        return;
      }
    }
    if (!status.ok()) {
      Log(LogLevel::kWarning, "could not renew the cluster lease",
          {.correlation_id = "",
           .fields = {{"error", std::string(status.message())}}});
    }
    wait = status.ok() ? period : absl::Milliseconds(500);
  }
}

int64_t ClusterMember::lease() const {
  MutexLock lock(&mu_);
  return lease_;
}

absl::Status ClusterMember::Standing() const {
  MutexLock lock(&mu_);
  return displaced_;
}

absl::Status ClusterMember::CheckLease() const {
  MutexLock lock(&mu_);
  if (!displaced_.ok()) return displaced_;
  if (absl::Now() < live_until_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "replica ", replica(),
      " cannot confirm its etcd lease and accepts no writes until it does"));
}

absl::StatusOr<std::optional<std::string>> ClusterMember::OwnerOf(
    absl::string_view module) {
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> kv,
                              etcd_->Get(OwnerKey(module)));
  if (!kv.has_value()) return std::nullopt;
  return kv->value;
}

absl::StatusOr<std::optional<ClusterMemberInfo>> ClusterMember::LiveMember(
    absl::string_view replica) {
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> kv,
                              etcd_->Get(MemberKey(replica)));
  if (!kv.has_value() || kv->lease == 0) return std::nullopt;
  nlohmann::json record = nlohmann::json::parse(kv->value, nullptr, false);
  if (!record.is_object() || !record.contains("address") ||
      !record["address"].is_string()) {
    return std::nullopt;  // being written (Register's placeholder)
  }
  return ClusterMemberInfo{std::string(replica),
                           record["address"].get<std::string>(), kv->lease};
}

absl::StatusOr<std::vector<ClusterMemberInfo>> ClusterMember::LiveMembers() {
  const std::string prefix = MemberKey("");
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs,
                              etcd_->GetPrefix(prefix));
  std::vector<ClusterMemberInfo> members;
  for (const EtcdKeyValue& kv : kvs) {
    nlohmann::json record = nlohmann::json::parse(kv.value, nullptr, false);
    if (kv.lease == 0 || !record.is_object() || !record.contains("address") ||
        !record["address"].is_string()) {
      continue;
    }
    members.push_back({kv.key.substr(prefix.size()),
                       record["address"].get<std::string>(), kv.lease});
  }
  return members;
}

absl::StatusOr<std::vector<ModuleOwner>> ClusterMember::Owners(
    int64_t* revision) {
  const std::string prefix = OwnerKey("");
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs,
                              etcd_->GetPrefix(prefix, revision));
  std::vector<ModuleOwner> owners;
  owners.reserve(kvs.size());
  for (EtcdKeyValue& kv : kvs) {
    owners.push_back({kv.key.substr(prefix.size()), std::move(kv.value)});
  }
  return owners;
}

absl::StatusOr<std::string> ClusterMember::ChooseOwner(
    absl::string_view module) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<ClusterMemberInfo> members,
                              LiveMembers());
  if (members.empty()) {
    return absl::UnavailableError("no cluster member holds a live lease");
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<ModuleOwner> owners, Owners());
  std::map<std::string, size_t> owned;
  for (const ModuleOwner& owner : owners) ++owned[owner.replica];
  auto rank = [&](const ClusterMemberInfo& m) {
    return std::make_pair(owned[m.replica], StableHash(module, m.replica));
  };
  return std::min_element(
             members.begin(), members.end(),
             [&](const auto& a, const auto& b) { return rank(a) < rank(b); })
      ->replica;
}

absl::Status ClusterMember::Claim(absl::string_view module) {
  MODELSTATE_RETURN_IF_ERROR(CheckLease());
  MODELSTATE_ASSIGN_OR_RETURN(
      bool claimed, etcd_->CreateIfAbsent(OwnerKey(module), replica(),
                                          /*lease=*/0, MemberKey(replica())));
  if (claimed) return absl::OkStatus();
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<std::string> owner,
                              OwnerOf(module));
  if (owner == replica()) return absl::OkStatus();
  if (!owner.has_value()) {
    return absl::UnavailableError(absl::StrCat(
        "replica ", replica(), " has no member record in etcd to claim '",
        module, "' with"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("module '", module, "' is owned by replica ", *owner));
}

absl::StatusOr<int64_t> ClusterMember::OwnedRevision(absl::string_view module) {
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> kv,
                              etcd_->Get(OwnerKey(module)));
  if (!kv.has_value() || kv->value != replica()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "module '", module, "' is not owned by replica ", replica(),
        kv.has_value() ? absl::StrCat(" (owner: ", kv->value, ")")
                       : std::string(" (not placed)")));
  }
  return kv->mod_revision;
}

absl::Status ClusterMember::TakeOver(absl::string_view module,
                                     absl::string_view from,
                                     int64_t from_revision) {
  MODELSTATE_RETURN_IF_ERROR(CheckLease());
  MODELSTATE_ASSIGN_OR_RETURN(
      bool taken, etcd_->ReplaceIfValue(OwnerKey(module), from, replica(),
                                        MemberKey(replica()), from_revision));
  if (taken) return absl::OkStatus();
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> kv,
                              etcd_->Get(OwnerKey(module)));
  if (!kv.has_value() || kv->value != from) {
    return absl::FailedPreconditionError(absl::StrCat(
        "module '", module, "' is no longer owned by replica ", from,
        kv.has_value() ? absl::StrCat(" (owner: ", kv->value, ")")
                       : std::string(" (not placed)")));
  }
  if (from_revision != 0 && kv->mod_revision != from_revision) {
    return absl::FailedPreconditionError(
        absl::StrCat("replica ", from, " called the move of '", module,
                     "' off and keeps the module"));
  }
  return absl::UnavailableError(absl::StrCat(
      "replica ", replica(), " has no member record in etcd to take over '",
      module, "' with"));
}

absl::StatusOr<bool> ClusterMember::KeepOwnership(absl::string_view module) {
  return etcd_->ReplaceIfValue(OwnerKey(module), replica(), replica(),
                               MemberKey(replica()));
}

absl::Status ClusterMember::Release(absl::string_view module) {
  return etcd_->DeleteIfValue(OwnerKey(module), replica()).status();
}

}  // namespace modelstate
