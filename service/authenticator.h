// File: authenticator.h
// Who is calling, from what the transport extracted: a bearer token
// ("authorization: Bearer <token>") or a verified client certificate's
// common name, looked up in the token file's principals
// (service/access_policy.h). Without a token file every caller is an admin
// named after its peer address (the server then serves loopback only).
// Nothing here knows the transport: the server fills in Credentials.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(auto auth, Authenticator::Create(path, true));
//   Credentials credentials;
//   credentials.peer = "ipv4:10.0.0.7:51234";
//   credentials.authorization = "Bearer s3cret";
//   absl::StatusOr<Principal> caller = auth->Authenticate(credentials);
#ifndef MODELSTATE_SERVICE_AUTHENTICATOR_H_
#define MODELSTATE_SERVICE_AUTHENTICATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/sync.h"
#include "service/access_policy.h"

namespace modelstate {

// What a call presents, as the transport received it.
struct Credentials {
  // Where the call comes from ("ipv4:127.0.0.1:5000"); names the caller
  // when there is no authentication.
  std::string peer;
  // The request id the caller chose ("x-request-id"); "" for none.
  std::string request_id;
  // The "authorization" metadata as sent, if any.
  std::optional<std::string> authorization;
  // The common name of a client certificate the transport verified.
  std::optional<std::string> certificate_cn;
};

// The most bytes of a caller's request id that are stored (audit records,
// change notes) or logged: a longer one is cut to fit, and ends in a
// marker giving its full length ("...[7168 bytes]"), so a caller cannot
// grow the audit log or the logs with its ids.
inline constexpr size_t kMaxRequestIdBytes = 128;
// `id` as stored: itself when it fits in kMaxRequestIdBytes, else its
// start (never cut inside a UTF-8 character) and the marker.
std::string CappedRequestId(absl::string_view id);

// Thread-safe.
class Authenticator {
 public:
  // `token_file` "" turns authentication off. `client_certificates`: the
  // transport verifies client certificates (mTLS), whose CN names a
  // principal.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(
      std::string token_file, bool client_certificates);

  bool enabled() const { return !token_file_.empty(); }
  const std::string& token_file() const { return token_file_; }

  // Re-reads the token file; on error the principals in force stay.
  // Returns how many principals it now holds.
  absl::StatusOr<size_t> Reload();
  // Moves on each Reload that took a file: a long-lived stream compares it
  // with the one it saw, and asks again whether its caller may go on.
  uint64_t generation() const {
    return generation_.load(std::memory_order_acquire);
  }

  // The caller: UNAUTHENTICATED without valid credentials, PERMISSION_DENIED
  // for a certificate whose CN is no principal.
  absl::StatusOr<Principal> Authenticate(const Credentials& credentials) const;

 private:
  Authenticator(std::string token_file, bool client_certificates)
      : token_file_(std::move(token_file)),
        client_certificates_(client_certificates) {}

  const std::string token_file_;
  const bool client_certificates_;
  mutable Mutex mu_;
  std::shared_ptr<const AccessPolicy> policy_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> generation_{0};
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_AUTHENTICATOR_H_
