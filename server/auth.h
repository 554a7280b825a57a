// File: auth.h
// Who is calling: a bearer token ("authorization: Bearer <token>") or a
// verified client certificate's common name, looked up in the token file's
// principals (core/access_policy.h). Without a token file every caller is
// an admin named after its peer address (the server then serves loopback
// only; see server_main.cc).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(auto auth, Authenticator::Create(path, true));
//   absl::StatusOr<Principal> caller = auth->Authenticate(*context);
#ifndef MODELSTATE_SERVER_AUTH_H_
#define MODELSTATE_SERVER_AUTH_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/sync.h"
#include "grpcpp/grpcpp.h"
#include "service/access_policy.h"

namespace modelstate::server {

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

  // The caller: UNAUTHENTICATED without valid credentials, PERMISSION_DENIED
  // for a certificate whose CN is no principal.
  absl::StatusOr<Principal> Authenticate(
      const grpc::ServerContextBase& context) const;

 private:
  Authenticator(std::string token_file, bool client_certificates)
      : token_file_(std::move(token_file)),
        client_certificates_(client_certificates) {}

  const std::string token_file_;
  const bool client_certificates_;
  mutable Mutex mu_;
  std::shared_ptr<const AccessPolicy> policy_ ABSL_GUARDED_BY(mu_);
};

// Counts each identity's open streams (state_dict transfers, audit watches,
// subscriptions) against a limit. Thread-safe.
class StreamLimiter {
 public:
  explicit StreamLimiter(int max_per_identity)
      : max_per_identity_(max_per_identity) {}

  // Holds one stream slot until destroyed.
  class Slot {
   public:
    Slot(StreamLimiter* owner, std::string identity)
        : owner_(owner), identity_(std::move(identity)) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot();

   private:
    StreamLimiter* owner_;
    std::string identity_;
  };

  // RESOURCE_EXHAUSTED naming max_streams_per_identity when `identity`
  // already has that many streams open. max_per_identity <= 0: no limit.
  absl::StatusOr<std::unique_ptr<Slot>> Acquire(const std::string& identity);

 private:
  const int max_per_identity_;
  Mutex mu_;
  std::map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_AUTH_H_
