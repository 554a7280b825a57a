#include "service/authenticator.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/quote.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

}  // namespace

std::string CappedRequestId(absl::string_view id) {
  if (id.size() <= kMaxRequestIdBytes) return std::string(id);
  const std::string marker = absl::StrCat("...[", id.size(), " bytes]");
  size_t keep = kMaxRequestIdBytes - marker.size();
  // A UTF-8 continuation byte (10xxxxxx) would start a broken character.
  while (keep > 0 && (static_cast<unsigned char>(id[keep]) & 0xC0) == 0x80) {
    --keep;
  }
  return absl::StrCat(id.substr(0, keep), marker);
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(
    std::string token_file, bool client_certificates) {
  std::unique_ptr<Authenticator> auth(
      new Authenticator(std::move(token_file), client_certificates));
  if (auth->enabled()) MODELSTATE_RETURN_IF_ERROR(auth->Reload().status());
  return auth;
}

absl::StatusOr<size_t> Authenticator::Reload() {
  if (!enabled()) return absl::FailedPreconditionError("no --token_file");
  MODELSTATE_ASSIGN_OR_RETURN(AccessPolicy policy,
                              AccessPolicy::ReadFile(token_file_));
  const size_t size = policy.size();
  auto fresh = std::make_shared<const AccessPolicy>(std::move(policy));
  MutexLock lock(&mu_);
  policy_ = std::move(fresh);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  return size;
}

absl::StatusOr<Principal> Authenticator::Authenticate(
    const Credentials& credentials) const {
  if (!enabled()) return AnonymousAdmin(credentials.peer);
  std::shared_ptr<const AccessPolicy> policy;
  {
    MutexLock lock(&mu_);
    policy = policy_;
  }
  if (credentials.authorization.has_value()) {
    absl::string_view value = *credentials.authorization;
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
  if (client_certificates_ && credentials.certificate_cn.has_value()) {
    const std::string& cn = *credentials.certificate_cn;
    const Principal* p = policy->FindByIdentity(cn);
    if (p == nullptr) {
      return absl::PermissionDeniedError(absl::StrCat(
          "client certificate CN ", Quote(cn), " is not a known principal"));
    }
    return *p;
  }
  return absl::UnauthenticatedError(
      client_certificates_
          ? "no credentials: present a client certificate or send "
            "'authorization: Bearer <token>' metadata"
          : "no credentials: send 'authorization: Bearer <token>' metadata");
}

}  // namespace modelstate
