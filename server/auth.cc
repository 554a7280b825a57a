#include "server/auth.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace modelstate::server {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

}  // namespace

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(
    std::string token_file, bool client_certificates) {
  std::unique_ptr<Authenticator> auth(
      new Authenticator(std::move(token_file), client_certificates));
  if (auth->enabled()) {
    absl::StatusOr<size_t> loaded = auth->Reload();
    if (!loaded.ok()) return loaded.status();
  }
  return auth;
}

absl::StatusOr<size_t> Authenticator::Reload() {
  if (!enabled()) return absl::FailedPreconditionError("no --token_file");
  absl::StatusOr<AccessPolicy> policy = AccessPolicy::ReadFile(token_file_);
  if (!policy.ok()) return policy.status();
  const size_t size = policy->size();
  auto fresh = std::make_shared<const AccessPolicy>(*std::move(policy));
  MutexLock lock(&mu_);
  policy_ = std::move(fresh);
  return size;
}

absl::StatusOr<Principal> Authenticator::Authenticate(
    const grpc::ServerContextBase& context) const {
  if (!enabled()) return AnonymousAdmin(context.peer());
  std::shared_ptr<const AccessPolicy> policy;
  {
    MutexLock lock(&mu_);
    policy = policy_;
  }
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    absl::string_view value(it->second.data(), it->second.size());
    if (!absl::StartsWith(value, kBearer)) {
      return absl::UnauthenticatedError(
          "authorization: expected 'Bearer <token>'");
    }
    const Principal* p = policy->FindByToken(value.substr(kBearer.size()));
    if (p == nullptr) {
      return absl::UnauthenticatedError(
          "authorization: the bearer token is not valid");
    }
    return *p;
  }
  if (client_certificates_) {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    std::vector<grpc::string_ref> names =
        auth == nullptr ? std::vector<grpc::string_ref>{}
                        : auth->FindPropertyValues("x509_common_name");
    if (!names.empty()) {
      std::string cn(names.front().data(), names.front().size());
      const Principal* p = policy->FindByIdentity(cn);
      if (p == nullptr) {
        return absl::PermissionDeniedError(absl::StrCat(
            "client certificate CN '", cn, "' is not a known principal"));
      }
      return *p;
    }
  }
  return absl::UnauthenticatedError(
      client_certificates_
          ? "no credentials: present a client certificate or send "
            "'authorization: Bearer <token>' metadata"
          : "no credentials: send 'authorization: Bearer <token>' metadata");
}

StreamLimiter::Slot::~Slot() {
  MutexLock lock(&owner_->mu_);
  if (--owner_->open_[identity_] == 0) owner_->open_.erase(identity_);
}

absl::StatusOr<std::unique_ptr<StreamLimiter::Slot>> StreamLimiter::Acquire(
    const std::string& identity) {
  MutexLock lock(&mu_);
  int& open = open_[identity];
  if (max_per_identity_ > 0 && open >= max_per_identity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_streams_per_identity (", max_per_identity_, ") reached: '",
        identity, "' already has ", open, " streams open"));
  }
  ++open;
  return std::make_unique<Slot>(this, identity);
}

}  // namespace modelstate::server
