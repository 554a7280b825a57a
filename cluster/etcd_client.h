// File: etcd_client.h
// A small synchronous client of etcd's v3 gRPC API: the keys, transactions
// and leases a cluster member needs. Every call has a deadline; a call
// that cannot reach its endpoint tries the next one. With a user, the
// client authenticates and sends etcd's token with each call, and fetches
// a new token once when etcd says the old one is no longer valid.
//
// Example:
//   EtcdOptions options;
//   options.endpoints = {"127.0.0.1:2379"};
//   MODELSTATE_ASSIGN_OR_RETURN(auto etcd, EtcdClient::Create(options));
//   MODELSTATE_ASSIGN_OR_RETURN(Lease lease, etcd->GrantLease(10));
//   MODELSTATE_RETURN_IF_ERROR(etcd->Put("/a", "1", lease.id));
//   MODELSTATE_ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> kv,
//                               etcd->Get("/a"));
#ifndef MODELSTATE_CLUSTER_ETCD_CLIENT_H_
#define MODELSTATE_CLUSTER_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "grpcpp/grpcpp.h"

namespace etcdserverpb {
class TxnRequest;
}  // namespace etcdserverpb

namespace modelstate {

struct EtcdOptions {
  // host:port of each etcd member; at least one.
  std::vector<std::string> endpoints;
  // TLS to etcd (PEM text, not paths): the CA that signed its certificate
  // ("" for plaintext), and the client certificate and key it asks for
  // ("" for none).
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // etcd's authentication: a user and its password ("" for none).
  std::string user;
  std::string password;
  // Each call's deadline.
  absl::Duration timeout = absl::Seconds(5);
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdLease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;
};

// What a running client may be given anew (SetCredentials): the TLS
// material and password of EtcdOptions.
struct EtcdCredentials {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string password;
};

// Thread-safe.
class EtcdClient {
 public:
  // INVALID_ARGUMENT without endpoints; does not contact etcd (the first
  // call does).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(
      EtcdOptions options);
  ~EtcdClient();

  // The value at `key`, nullopt when there is none.
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(absl::string_view key);
  // Every key starting with `prefix`, in key order, and etcd's revision.
  absl::StatusOr<std::vector<EtcdKeyValue>> GetPrefix(
      absl::string_view prefix, int64_t* revision = nullptr);
  // Sets `key` (attached to `lease` unless 0).
  absl::Status Put(absl::string_view key, absl::string_view value,
                   int64_t lease = 0);
  // Sets `key` (attached to `lease` unless 0) only if it does not exist;
  // returns whether it did so. `required_key`, unless "", must exist for
  // the put to happen too (a member's own record: a member whose lease
  // lapsed cannot claim).
  absl::StatusOr<bool> CreateIfAbsent(absl::string_view key,
                                      absl::string_view value,
                                      int64_t lease = 0,
                                      absl::string_view required_key = "");
  // Sets `key` to `value` only if its value is `expected`, `required_key`
  // exists and, unless `expected_mod_revision` is 0, `key` was last
  // modified at that revision; returns whether it did so.
  absl::StatusOr<bool> ReplaceIfValue(absl::string_view key,
                                      absl::string_view expected,
                                      absl::string_view value,
                                      absl::string_view required_key,
                                      int64_t expected_mod_revision = 0);
  // Deletes `key` only if its value is `value`; returns whether it did so.
  absl::StatusOr<bool> DeleteIfValue(absl::string_view key,
                                     absl::string_view value);

  absl::StatusOr<EtcdLease> GrantLease(int64_t ttl_seconds);
  // Renews `lease`; returns the seconds it now has, 0 when it has expired.
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  // The seconds `lease` has left; -1 when it has expired.
  absl::StatusOr<int64_t> TimeToLive(int64_t lease);
  absl::Status RevokeLease(int64_t lease);

  // Calls from now on go over new channels made with `credentials` (a
  // rotated client certificate or CA: a channel reconnects with the
  // credentials it was made with); calls under way finish on theirs. A new
  // password drops the token, so the next call authenticates with it.
  // Leases live in etcd, not in a connection: they are kept. TLS stays on
  // or off as it was made (an empty CA keeps plaintext).
  void SetCredentials(const EtcdCredentials& credentials)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Endpoint;
  explicit EtcdClient(EtcdOptions options);

  // Runs `call` against the current endpoint with a fresh context (with
  // deadline and token); on UNAVAILABLE tries the others in turn, on an
  // expired token authenticates again once.
  template <typename Call>
  absl::Status Invoke(Call call);
  // Invoke of one unary call: `method` of the endpoint's `stub`.
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> Unary(
      std::unique_ptr<Stub> Endpoint::*stub,
      grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                   Response*),
      const Request& request);
  // A token for `endpoint`'s calls, kept for later ones unless the
  // password changed meanwhile.
  absl::StatusOr<std::string> Authenticate(Endpoint& endpoint)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The channels and stubs to each endpoint, made with `credentials`.
  static std::vector<std::shared_ptr<Endpoint>> Connect(
      const std::vector<std::string>& addresses,
      const std::shared_ptr<grpc::ChannelCredentials>& credentials);
  // Runs the transaction; returns whether its compares held.
  absl::StatusOr<bool> Transact(const etcdserverpb::TxnRequest& request);

  // Its credentials are the ones it was made with; SetCredentials changes
  // endpoints_ and password_.
  const EtcdOptions options_;
  Mutex mu_;
  // One per options_.endpoints, replaced together by SetCredentials; a
  // call holds the one it uses.
  std::vector<std::shared_ptr<Endpoint>> endpoints_ ABSL_GUARDED_BY(mu_);
  bool tls_ ABSL_GUARDED_BY(mu_) = false;
  std::string password_ ABSL_GUARDED_BY(mu_);
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate

#endif  // MODELSTATE_CLUSTER_ETCD_CLIENT_H_
