#include "cluster/etcd_client.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "etcd/etcd_v3.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace modelstate {

namespace pb = ::etcdserverpb;

// The connection to one etcd endpoint (options_.endpoints[i]).
struct EtcdClient::Endpoint {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Auth::Stub> auth;
};

namespace {

// The first key after every key that starts with `prefix`: etcd's range_end
// for a prefix query.
std::string PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdKeyValue FromProto(const pb::KeyValue& kv) {
  EtcdKeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.lease = kv.lease();
  return out;
}

// gRPC's codes are absl's, number for number.
absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// Whether etcd refused a login itself, which no other member would
// accept: a wrong user or password (INVALID_ARGUMENT, as etcd's
// ErrGRPCAuthFailed), a user without rights, or authentication turned off
// while a user is configured.
bool LoginRefused(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return true;
    case absl::StatusCode::kFailedPrecondition:
      return absl::StrContains(status.message(),
                               "authentication is not enabled");
    default:
      return false;
  }
}

absl::Status WithEndpoint(const absl::Status& status,
                          absl::string_view address) {
  if (status.ok()) return status;
  return absl::Status(
      status.code(), absl::StrCat("etcd at ", address, ": ", status.message()));
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsOf(
    const std::string& ca_pem, const std::string& cert_pem,
    const std::string& key_pem) {
  if (ca_pem.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca_pem;
  ssl.pem_cert_chain = cert_pem;
  ssl.pem_private_key = key_pem;
  return grpc::SslCredentials(ssl);
}

}  // namespace

std::vector<std::shared_ptr<EtcdClient::Endpoint>> EtcdClient::Connect(
    const std::vector<std::string>& addresses,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  std::vector<std::shared_ptr<Endpoint>> endpoints;
  for (const std::string& address : addresses) {
    auto endpoint = std::make_shared<Endpoint>();
    grpc::ChannelArguments args;
    // Its own connections: a channel made after new credentials
    // (SetCredentials) must not reuse one that an older channel made with
    // the old ones.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    endpoint->channel = grpc::CreateCustomChannel(address, credentials, args);
    endpoint->kv = pb::KV::NewStub(endpoint->channel);
    endpoint->lease = pb::Lease::NewStub(endpoint->channel);
    endpoint->auth = pb::Auth::NewStub(endpoint->channel);
    endpoints.push_back(std::move(endpoint));
  }
  return endpoints;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(
    EtcdOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd_endpoints: no endpoint given");
  }
  for (const std::string& address : options.endpoints) {
    if (address.empty()) {
      return absl::InvalidArgumentError("etcd_endpoints: an empty endpoint");
    }
  }
  auto client = std::unique_ptr<EtcdClient>(new EtcdClient(options));
  std::vector<std::shared_ptr<Endpoint>> endpoints = Connect(
      client->options_.endpoints,
      ChannelCredentialsOf(options.ca_pem, options.cert_pem, options.key_pem));
  MutexLock lock(&client->mu_);
  client->endpoints_ = std::move(endpoints);
  client->tls_ = !options.ca_pem.empty();
  client->password_ = options.password;
  return client;
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {}
EtcdClient::~EtcdClient() = default;

void EtcdClient::SetCredentials(const EtcdCredentials& credentials) {
  bool tls;
  {
    MutexLock lock(&mu_);
    tls = tls_;
  }
  // Plaintext stays plaintext, and TLS never falls back to it.
  if (tls && credentials.ca_pem.empty()) return;
  std::vector<std::shared_ptr<Endpoint>> endpoints = Connect(
      options_.endpoints,
      tls ? ChannelCredentialsOf(credentials.ca_pem, credentials.cert_pem,
                                 credentials.key_pem)
          : grpc::InsecureChannelCredentials());
  MutexLock lock(&mu_);
  endpoints_ = std::move(endpoints);
  if (credentials.password != password_) {
    password_ = credentials.password;
    // etcd keeps the old token valid until it expires or the password
    // changes there; the new password is used at once all the same.
    token_.clear();
  }
}

absl::StatusOr<std::string> EtcdClient::Authenticate(Endpoint& endpoint) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  pb::AuthenticateRequest request;
  request.set_name(options_.user);
  {
    MutexLock lock(&mu_);
    request.set_password(password_);
  }
  pb::AuthenticateResponse response;
  // Invoke names the endpoint in an error.
  MODELSTATE_RETURN_IF_ERROR(
      FromGrpc(endpoint.auth->Authenticate(&context, request, &response)));
  MutexLock lock(&mu_);
  // A token got with a password SetCredentials replaced meanwhile serves
  // this call only: the next one logs in with the new password.
  if (request.password() == password_) token_ = response.token();
  return response.token();
}

template <typename Call>
absl::Status EtcdClient::Invoke(Call call) {
  size_t first;
  {
    MutexLock lock(&mu_);
    first = current_;
  }
  absl::Status status;
  const size_t count = options_.endpoints.size();
  for (size_t tried = 0; tried < count; ++tried) {
    const size_t index = (first + tried) % count;
    const std::string& address = options_.endpoints[index];
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::string token;
      // Held for the call: SetCredentials may replace it meanwhile.
      std::shared_ptr<Endpoint> endpoint;
      {
        MutexLock lock(&mu_);
        token = token_;
        endpoint = endpoints_[index];
      }
      if (!options_.user.empty() && token.empty()) {
        absl::StatusOr<std::string> fresh = Authenticate(*endpoint);
        status = fresh.status();
        if (LoginRefused(status)) {
          // Passed on as etcd says it (INVALID_ARGUMENT for a wrong
          // password), a client would take it for a fault of its own
          // request; it is this replica's configuration, which a reload of
          // the password file mends. Said at once: every etcd member keeps
          // the same users, and a later endpoint's "unreachable" would
          // hide it.
          return WithEndpoint(
              absl::UnavailableError(absl::StrCat(
                  "etcd refused the login of user '", options_.user,
                  "' (--etcd_user, --etcd_password_file): ", status.message())),
              address);
        }
        if (!status.ok()) {
          // Anything else (too many requests, a member's own trouble, a
          // proxy's error) may pass on another endpoint: tried next.
          status = absl::UnavailableError(
              absl::StrCat("logging in failed: ", status.ToString()));
          break;
        }
        token = *std::move(fresh);
      }
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
      if (!token.empty()) context.AddMetadata("token", token);
      status = FromGrpc(call(*endpoint, &context));
      // etcd answers an expired or revoked token with this text.
      const bool stale_token =
          !options_.user.empty() &&
          absl::StrContains(status.message(), "invalid auth token");
      if (!stale_token) break;
      MutexLock lock(&mu_);
      token_.clear();
    }
    if (status.code() != absl::StatusCode::kUnavailable &&
        status.code() != absl::StatusCode::kDeadlineExceeded) {
      if (status.ok() && index != first) {
        MutexLock lock(&mu_);
        current_ = index;
      }
      return WithEndpoint(status, address);
    }
    status = WithEndpoint(status, address);
  }
  // Every endpoint failed or timed out: etcd is unreachable. Our own
  // deadline running out is not the caller's, whose deadline may be far.
  if (absl::IsDeadlineExceeded(status)) {
    return absl::UnavailableError(
        absl::StrCat(status.message(), " (etcd unreachable)"));
  }
  return status;
}

template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> EtcdClient::Unary(
    std::unique_ptr<Stub> Endpoint::*stub,
    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                 Response*),
    const Request& request) {
  Response response;
  MODELSTATE_RETURN_IF_ERROR(
      Invoke([&](Endpoint& e, grpc::ClientContext* context) {
        return ((*(e.*stub)).*method)(context, request, &response);
      }));
  return response;
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(
    absl::string_view key) {
  pb::RangeRequest request;
  request.set_key(std::string(key));
  MODELSTATE_ASSIGN_OR_RETURN(
      pb::RangeResponse response,
      Unary(&Endpoint::kv, &pb::KV::Stub::Range, request));
  if (response.kvs_size() == 0) return std::nullopt;
  return FromProto(response.kvs(0));
}

absl::StatusOr<std::vector<EtcdKeyValue>> EtcdClient::GetPrefix(
    absl::string_view prefix, int64_t* revision) {
  pb::RangeRequest request;
  request.set_key(std::string(prefix));
  request.set_range_end(PrefixEnd(prefix));
  MODELSTATE_ASSIGN_OR_RETURN(
      pb::RangeResponse response,
      Unary(&Endpoint::kv, &pb::KV::Stub::Range, request));
  std::vector<EtcdKeyValue> out;
  out.reserve(response.kvs_size());
  for (const pb::KeyValue& kv : response.kvs()) out.push_back(FromProto(kv));
  if (revision != nullptr) *revision = response.header().revision();
  return out;
}

absl::Status EtcdClient::Put(absl::string_view key, absl::string_view value,
                             int64_t lease) {
  pb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  return Unary(&Endpoint::kv, &pb::KV::Stub::Put, request).status();
}

namespace {

// The compares of a transaction: `key` was never created (absent), or
// holds `value`, or exists.
void RequireAbsent(pb::TxnRequest& request, absl::string_view key) {
  pb::Compare* absent = request.add_compare();
  absent->set_key(std::string(key));
  absent->set_target(pb::Compare::CREATE);
  absent->set_result(pb::Compare::EQUAL);
  absent->set_create_revision(0);
}

void RequireValue(pb::TxnRequest& request, absl::string_view key,
                  absl::string_view value) {
  pb::Compare* same = request.add_compare();
  same->set_key(std::string(key));
  same->set_target(pb::Compare::VALUE);
  same->set_result(pb::Compare::EQUAL);
  same->set_value(std::string(value));
}

void RequireModRevision(pb::TxnRequest& request, absl::string_view key,
                        int64_t revision) {
  pb::Compare* unchanged = request.add_compare();
  unchanged->set_key(std::string(key));
  unchanged->set_target(pb::Compare::MOD);
  unchanged->set_result(pb::Compare::EQUAL);
  unchanged->set_mod_revision(revision);
}

void RequirePresent(pb::TxnRequest& request, absl::string_view key) {
  pb::Compare* present = request.add_compare();
  present->set_key(std::string(key));
  present->set_target(pb::Compare::CREATE);
  present->set_result(pb::Compare::GREATER);
  present->set_create_revision(0);
}

void PutOnSuccess(pb::TxnRequest& request, absl::string_view key,
                  absl::string_view value, int64_t lease) {
  pb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
}

}  // namespace

absl::StatusOr<bool> EtcdClient::Transact(const pb::TxnRequest& request) {
  MODELSTATE_ASSIGN_OR_RETURN(
      pb::TxnResponse response,
      Unary(&Endpoint::kv, &pb::KV::Stub::Txn, request));
  return response.succeeded();
}

absl::StatusOr<bool> EtcdClient::CreateIfAbsent(
    absl::string_view key, absl::string_view value, int64_t lease,
    absl::string_view required_key) {
  pb::TxnRequest request;
  RequireAbsent(request, key);
  if (!required_key.empty()) RequirePresent(request, required_key);
  PutOnSuccess(request, key, value, lease);
  return Transact(request);
}

absl::StatusOr<bool> EtcdClient::ReplaceIfValue(absl::string_view key,
                                                absl::string_view expected,
                                                absl::string_view value,
                                                absl::string_view required_key,
                                                int64_t expected_mod_revision) {
  pb::TxnRequest request;
  RequireValue(request, key, expected);
  if (expected_mod_revision != 0) {
    RequireModRevision(request, key, expected_mod_revision);
  }
  RequirePresent(request, required_key);
  PutOnSuccess(request, key, value, /*lease=*/0);
  return Transact(request);
}

absl::StatusOr<bool> EtcdClient::DeleteIfValue(absl::string_view key,
                                               absl::string_view value) {
  pb::TxnRequest request;
  RequireValue(request, key, value);
  request.add_success()->mutable_request_delete_range()->set_key(
      std::string(key));
  return Transact(request);
}

absl::StatusOr<EtcdLease> EtcdClient::GrantLease(int64_t ttl_seconds) {
  pb::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  MODELSTATE_ASSIGN_OR_RETURN(
      pb::LeaseGrantResponse response,
      Unary(&Endpoint::lease, &pb::Lease::Stub::LeaseGrant, request));
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd refused a lease: ", response.error()));
  }
  return EtcdLease{response.id(), response.ttl()};
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  pb::LeaseKeepAliveResponse response;
  MODELSTATE_RETURN_IF_ERROR(
      Invoke([&](Endpoint& e, grpc::ClientContext* context) {
        auto stream = e.lease->LeaseKeepAlive(context);
        pb::LeaseKeepAliveRequest request;
        request.set_id(lease);
        if (stream->Write(request)) stream->Read(&response);
        stream->WritesDone();
        return stream->Finish();
      }));
  return response.ttl() > 0 ? response.ttl() : 0;
}

absl::StatusOr<int64_t> EtcdClient::TimeToLive(int64_t lease) {
  pb::LeaseTimeToLiveRequest request;
  request.set_id(lease);
  MODELSTATE_ASSIGN_OR_RETURN(
      pb::LeaseTimeToLiveResponse response,
      Unary(&Endpoint::lease, &pb::Lease::Stub::LeaseTimeToLive, request));
  return response.ttl();
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  return Unary(&Endpoint::lease, &pb::Lease::Stub::LeaseRevoke, request)
      .status();
}

}  // namespace modelstate
