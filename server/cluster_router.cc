#include "server/cluster_router.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "service/module_name.h"

namespace modelstate::server {
namespace {

constexpr char kSecretKey[] = "x-modelstate-replica-secret";
constexpr char kForwardedPeerKey[] = "x-modelstate-forwarded-peer";
constexpr char kForwardedCnKey[] = "x-modelstate-forwarded-cn";
constexpr char kForwardedByKey[] = "x-modelstate-forwarded-by";

std::optional<std::string> Metadata(const grpc::ServerContextBase& context,
                                    absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterRouter>> ClusterRouter::Create(
    ClusterOptions options, std::string secret,
    std::shared_ptr<grpc::ChannelCredentials> peers) {
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) {
    secret.pop_back();
  }
  if (secret.size() < 16) {
    return absl::InvalidArgumentError(
        "cluster_secret_file: the cluster secret must be at least 16 bytes");
  }
  return std::unique_ptr<ClusterRouter>(new ClusterRouter(
      std::move(options), std::move(secret), std::move(peers)));
}

absl::Status ClusterRouter::Join(
    const std::string& advertise_address,
    const std::vector<std::string>& local_modules,
    const std::vector<std::string>& in_move,
    const std::function<void(const ClusterMember::JoinReport&)>& joined) {
  ClusterOptions options = options_;
  if (!advertise_address.empty() && options.advertise_address.empty()) {
    options.advertise_address = advertise_address;
  }
  uint64_t credentials_set;
  {
    MutexLock lock(&mu_);
    credentials_set = etcd_credentials_set_;
    if (etcd_credentials_.has_value()) {
      options.etcd.ca_pem = etcd_credentials_->ca_pem;
      options.etcd.cert_pem = etcd_credentials_->cert_pem;
      options.etcd.key_pem = etcd_credentials_->key_pem;
      options.etcd.password = etcd_credentials_->password;
    }
  }
  ClusterMember::JoinReport report;
  MODELSTATE_ASSIGN_OR_RETURN(
      std::unique_ptr<ClusterMember> member,
      ClusterMember::Join(options, local_modules, in_move, &report));
  // Until member_ is set every call answers UNAVAILABLE: none reaches a
  // copy that is not this replica's.
  if (joined) joined(report);
  MutexLock lock(&mu_);
  member_ = std::move(member);
  // Credentials set while it joined: set_etcd_credentials saw no member.
  if (etcd_credentials_set_ != credentials_set) {
    member_->etcd().SetCredentials(*etcd_credentials_);
  }
  return absl::OkStatus();
}

void ClusterRouter::Leave() {
  std::shared_ptr<ClusterMember> member;
  {
    MutexLock lock(&mu_);
    member = std::move(member_);
  }
  // The lease is revoked when the last user lets go.
}

std::shared_ptr<ClusterMember> ClusterRouter::member() {
  MutexLock lock(&mu_);
  return member_;
}

void ClusterRouter::set_peer_credentials(
    std::shared_ptr<grpc::ChannelCredentials> peers) {
  MutexLock lock(&mu_);
  peers_ = std::move(peers);
  channels_.clear();
}

void ClusterRouter::set_etcd_credentials(const EtcdCredentials& credentials) {
  // Under mu_, so that a Join ending meanwhile sees these or hands them on.
  // SetCredentials only makes channels: nothing here waits on etcd.
  MutexLock lock(&mu_);
  etcd_credentials_ = credentials;
  ++etcd_credentials_set_;
  if (member_ != nullptr) member_->etcd().SetCredentials(credentials);
}

std::shared_ptr<grpc::Channel> ClusterRouter::ChannelTo(
    const std::string& address) {
  MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    grpc::ChannelArguments args;
    // The owner enforces the message limit; the forwarder passes on.
    args.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
    args.SetMaxSendMessageSize(std::numeric_limits<int>::max());
    // Its own connections: a channel made after new credentials
    // (set_peer_credentials) must not share one made with the old.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channel = grpc::CreateCustomChannel(address, peers_, args);
  }
  return channel;
}

absl::StatusOr<Peer> ClusterRouter::LivePeer(const std::string& replica,
                                             absl::string_view module) {
  std::shared_ptr<ClusterMember> self = member();
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<ClusterMemberInfo> info,
                              self->LiveMember(replica));
  if (!info.has_value()) {
    return absl::UnavailableError(absl::StrCat(
        "module '", module, "' is owned by replica ", replica,
        ", which holds no live lease; it answers again when that replica "
        "is back"));
  }
  return Peer{replica, ChannelTo(info->address)};
}

absl::StatusOr<std::optional<Peer>> ClusterRouter::Route(
    const grpc::ServerContextBase& context, absl::string_view module,
    Access access) {
  std::shared_ptr<ClusterMember> self = member();
  if (self == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("replica ", replica(), " is still joining the cluster"));
  }
  MODELSTATE_RETURN_IF_ERROR(self->Standing());
  absl::StatusOr<ModuleName> name = ParseModuleName(module);
  if (!name.ok()) return std::nullopt;  // the local call names the error
  const std::string full = name->full();
  const bool forwarded = IsForwarded(context);
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<std::string> owner,
                              self->OwnerOf(full));
  // A move of it left this copy, and the module's owner deleted it since
  // (or etcd could not say at the join): not the module, neither served
  // nor claimed by a build.
  if (!owner.has_value() && unsettled_move_ && unsettled_move_(*name)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "module '", full, "': the copy on replica ", replica(),
        " was left by a cluster move and no replica owns the module now; it "
        "is not served, and is set aside at that replica's next start"));
  }
  if (!owner.has_value() && access == Access::kBuild) {
    std::string target = replica();
    if (!forwarded) {
      MODELSTATE_ASSIGN_OR_RETURN(target, self->ChooseOwner(full));
    }
    if (target == replica()) {
      MODELSTATE_RETURN_IF_ERROR(CheckRelays(*self));
      absl::Status claimed = self->Claim(full);
      if (claimed.code() != absl::StatusCode::kFailedPrecondition) {
        MODELSTATE_RETURN_IF_ERROR(claimed);
        MutexLock lock(&mu_);
        ++building_[full];
        return std::nullopt;
      }
      // Another replica placed it meanwhile: go where it went.
      MODELSTATE_ASSIGN_OR_RETURN(owner, self->OwnerOf(full));
      if (!owner.has_value()) return claimed;
    } else {
      owner = target;
    }
  }
  if (!owner.has_value() || *owner == replica()) {
    if (access != Access::kRead) {
      MODELSTATE_RETURN_IF_ERROR(self->CheckLease());
      MODELSTATE_RETURN_IF_ERROR(CheckRelays(*self));
    }
    if (access == Access::kBuild) {
      MutexLock lock(&mu_);
      ++building_[full];
    }
    return std::nullopt;
  }
  if (forwarded) {
    return absl::UnavailableError(
        absl::StrCat("module '", full, "' moved to replica ", *owner,
                     " while the call was being forwarded; retry"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Peer peer, LivePeer(*owner, full));
  return peer;
}

absl::Status ClusterRouter::CheckWritable() {
  std::shared_ptr<ClusterMember> self = member();
  if (self == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("replica ", replica(), " is still joining the cluster"));
  }
  return self->CheckLease();
}

absl::Status ClusterRouter::CheckRelays(ClusterMember& self) {
  {
    MutexLock lock(&mu_);
    if (relays_arrived_ || !connected_subscribers_) return absl::OkStatus();
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<RecordedSubscriber> recorded,
                              self.RecordedSubscribers());
  const std::vector<std::string> here = connected_subscribers_();
  std::vector<std::string> missing;
  for (const RecordedSubscriber& subscriber : recorded) {
    if (subscriber.home != replica() &&
        std::find(here.begin(), here.end(), subscriber.name) == here.end()) {
      missing.push_back(absl::StrCat(subscriber.name, " (connected to ",
                                     subscriber.home, ")"));
    }
  }
  if (!missing.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "replica ", replica(),
        " takes no writes until the subscribers connected to other replicas "
        "are relayed here too, so that they see its registrations; waiting "
        "for ",
        absl::StrJoin(missing, ", "), "; retry"));
  }
  MutexLock lock(&mu_);
  relays_arrived_ = true;
  return absl::OkStatus();
}

void ClusterRouter::BuildDone(absl::string_view module, bool hosted) {
  absl::StatusOr<ModuleName> name = ParseModuleName(module);
  if (!name.ok()) return;
  {
    MutexLock lock(&mu_);
    auto it = building_.find(name->full());
    if (it == building_.end()) return;
    if (--it->second > 0) return;
    building_.erase(it);
  }
  if (!hosted) Release(module);
}

void ClusterRouter::Release(absl::string_view module) {
  std::shared_ptr<ClusterMember> self = member();
  absl::StatusOr<ModuleName> name = ParseModuleName(module);
  if (self == nullptr || !name.ok()) return;
  absl::Status released = self->Release(name->full());
  if (!released.ok()) {
    Log(LogLevel::kWarning, "could not release a module's ownership",
        {.correlation_id = "",
         .fields = {{"module", name->full()},
                    {"error", std::string(released.message())}}});
  }
}

absl::StatusOr<Peer> ClusterRouter::MemberPeer(const std::string& replica) {
  std::shared_ptr<ClusterMember> self = member();
  if (self == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "replica ", this->replica(), " is still joining the cluster"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<ClusterMemberInfo> info,
                              self->LiveMember(replica));
  if (!info.has_value()) {
    return absl::UnavailableError(
        absl::StrCat("replica ", replica, " holds no live lease"));
  }
  return Peer{replica, ChannelTo(info->address)};
}

absl::StatusOr<std::vector<Peer>> ClusterRouter::OtherMembers() {
  std::shared_ptr<ClusterMember> self = member();
  if (self == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("replica ", replica(), " is still joining the cluster"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<ClusterMemberInfo> members,
                              self->LiveMembers());
  std::vector<Peer> peers;
  for (const ClusterMemberInfo& m : members) {
    if (m.replica != replica()) {
      peers.push_back({m.replica, ChannelTo(m.address)});
    }
  }
  return peers;
}

bool ClusterRouter::IsForwarded(const grpc::ServerContextBase& context) const {
  std::optional<std::string> secret = Metadata(context, kSecretKey);
  return secret.has_value() && secret->size() == secret_.size() &&
         CRYPTO_memcmp(secret->data(), secret_.data(), secret_.size()) == 0;
}

absl::StatusOr<Credentials> ClusterRouter::CallerCredentials(
    const grpc::ServerContextBase& context, Credentials direct) const {
  std::optional<std::string> peer = Metadata(context, kForwardedPeerKey);
  std::optional<std::string> cn = Metadata(context, kForwardedCnKey);
  const bool claims = peer.has_value() || cn.has_value() ||
                      Metadata(context, kSecretKey).has_value();
  if (!claims) return direct;
  if (!IsForwarded(context)) {
    return absl::UnauthenticatedError(
        absl::StrCat(kForwardedPeerKey,
                     ": a forwarded identity is believed only from "
                     "another replica of this cluster"));
  }
  if (peer.has_value()) direct.peer = *peer;
  direct.certificate_cn = cn;
  return direct;
}

std::unique_ptr<grpc::ClientContext> ClusterRouter::ForwardingContext(
    const grpc::ServerContextBase& context) const {
  std::unique_ptr<grpc::ClientContext> out =
      grpc::ClientContext::FromServerContext(context);
  const auto& metadata = context.client_metadata();
  for (const char* key : {"authorization", "x-request-id"}) {
    auto it = metadata.find(key);
    if (it != metadata.end()) {
      out->AddMetadata(key, std::string(it->second.data(), it->second.size()));
    }
  }
  out->AddMetadata(kForwardedPeerKey, context.peer());
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr) {
    std::vector<grpc::string_ref> names =
        auth->FindPropertyValues("x509_common_name");
    if (!names.empty()) {
      out->AddMetadata(kForwardedCnKey,
                       std::string(names.front().data(), names.front().size()));
    }
  }
  out->AddMetadata(kSecretKey, secret_);
  out->AddMetadata(kForwardedByKey, options_.replica_id);
  return out;
}

}  // namespace modelstate::server
