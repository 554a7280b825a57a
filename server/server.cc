#include "server/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "server/cluster_router.h"
#include "server/cluster_service.h"
#include "server/health_service.h"
#include "server/metrics.h"
#include "server/model_state_service.h"
#include "server/parse_errors.h"
#include "server/server_tls.h"
#include "service/audit_log.h"
#include "service/authenticator.h"
#include "service/checkpoint_signer.h"
#include "service/data_dir.h"
#include "service/model_service.h"
#include "service/model_store.h"
#include "service/module_repository.h"
#include "service/scrubber.h"
#include "service/subscriber_hub.h"

namespace modelstate::server {
namespace {

using internal::LogLine;

// Threads that run the reactions of Subscribe and health Watch streams
// (short: a queue push, an event's conversion): as many as gRPC's callback
// API would have used, half the cores, 2 to 16.
int StreamThreads() {
  return static_cast<int>(
      std::clamp(std::thread::hardware_concurrency() / 2, 2u, 16u));
}

// An IP literal in 127.0.0.0/8, ::1 (or ::ffff:127.x.y.z), or "localhost"
// in any case (host names are case-insensitive, RFC 4343): reachable from
// this machine only. Any other name (127.example.com) may resolve anywhere,
// so it is not loopback.
bool IsLoopback(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) ||
           (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

// `guarded`: a file that must not be writable by group or others (the
// private key, whose replacement serves as this server; the client CA,
// whose replacement lets anyone mint an identity).
absl::StatusOr<std::string> ReadPem(absl::string_view flag,
                                    const std::string& path,
                                    bool guarded = false,
                                    uint32_t* mode = nullptr) {
  absl::StatusOr<std::string> text =
      guarded ? ReadGuardedFile(path, mode) : ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", text.status().message()));
  }
  return text;
}

// TLS when a certificate is given, requiring verified client certificates
// when a client CA is; plaintext (null) otherwise. The files are re-read
// while the server runs (ServerTls), with the checks made here at start.
absl::StatusOr<std::shared_ptr<ServerTls>> PrepareTls(
    const ServerConfig& config) {
  const std::string& cert = config.tls_cert_file;
  const std::string& key = config.tls_key_file;
  const std::string& client_ca = config.tls_client_ca_file;
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file go together");
  }
  if (cert.empty()) {
    if (!client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca_file needs --tls_cert_file and --tls_key_file");
    }
    return nullptr;
  }
  if (config.reload_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--reload_seconds must not be negative (0: on SIGHUP only)");
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      std::shared_ptr<ServerTls> tls,
      ServerTls::Create({.cert = cert, .key = key, .client_ca = client_ca}));
  return tls;
}

// A key others may read is only warned about: a Kubernetes Secret is
// mounted 0644 unless its defaultMode says otherwise, and in a container
// of one user "others" is nobody. Writable by others is refused.
void WarnAboutReadableKey(const std::string& key) {
  struct stat st;
  if (stat(key.c_str(), &st) != 0 || (st.st_mode & S_IROTH) == 0) return;
  LogLine(absl::StrFormat(
      "warning: --tls_key_file %s is readable by others (mode %04o); "
      "chmod o-r it (or a Secret's defaultMode 0440)",
      key, st.st_mode & 07777));
}

absl::StatusOr<QuotaPolicy> LoadQuotas(const ServerConfig& config) {
  if (config.quota_file.empty()) {
    QuotaPolicy policy;
    policy.defaults = config.namespace_quota;
    return policy;
  }
  return QuotaPolicy::ReadFile(config.quota_file, config.namespace_quota);
}

// Who may connect, and how: what a server must not even start without.
struct Security {
  std::shared_ptr<ServerTls> tls;  // null: plaintext
  std::unique_ptr<Authenticator> auth;
  QuotaPolicy quotas;
};

absl::Status Refuse(absl::string_view what, const absl::Status& error) {
  return absl::InvalidArgumentError(absl::StrCat(what, error.message()));
}

// `address` ("host:port", "[v6]:port" or "unix:path") with a port gRPC
// will not wrap or ignore: 0 to 65535.
absl::Status CheckListenAddress(absl::string_view flag,
                                absl::string_view address) {
  if (address.empty() || absl::StartsWith(address, "unix:")) {
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": cannot parse '", address,
                     "' as host:port (port 0 to 65535)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Security> PrepareSecurity(const ServerConfig& config) {
  Security security;
  MODELSTATE_RETURN_IF_ERROR(CheckListenAddress("listen", config.listen));
  MODELSTATE_RETURN_IF_ERROR(
      CheckListenAddress("health_listen", config.health_listen));
  if (config.scrub_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--scrub_interval must not be negative (0 turns the "
                     "scrub off), not ",
                     absl::FormatDuration(config.scrub_interval)));
  }
  // Unauthenticated plain HTTP: checked with the other exposure rules.
  MODELSTATE_RETURN_IF_ERROR(CheckMetricsListen(config.metrics_listen));
  MODELSTATE_ASSIGN_OR_RETURN(security.tls, PrepareTls(config));
  const bool tls = !config.tls_cert_file.empty();
  const bool mtls = !config.tls_client_ca_file.empty();
  if (mtls && config.token_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca_file needs --token_file: its principals give "
        "certificate identities (CN) their roles");
  }
  if (!config.listen.empty() && !IsLoopback(config.listen)) {
    if (config.token_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "refusing to listen on ", config.listen,
          " without authentication: pass --token_file (and TLS), or listen "
          "on a loopback address"));
    }
    if (!tls && !config.plaintext) {
      return absl::InvalidArgumentError(
          absl::StrCat("refusing plaintext on ", config.listen,
                       ": pass --tls_cert_file and --tls_key_file, or "
                       "--plaintext to allow it"));
    }
  }
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create(config.token_file, mtls);
  if (!auth.ok()) return Refuse("--token_file: ", auth.status());
  security.auth = *std::move(auth);
  absl::StatusOr<QuotaPolicy> quotas = LoadQuotas(config);
  if (!quotas.ok()) return Refuse("--quota_file: ", quotas.status());
  security.quotas = *std::move(quotas);
  return security;
}

absl::Status CreateDirectory(const std::string& dir, absl::string_view what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cannot create ", what, dir, ": ", ec.message()));
}

// A failure to start, saying what failed.
absl::Status StartError(absl::string_view what, const absl::Status& error) {
  return absl::Status(error.code(), absl::StrCat(what, error.ToString()));
}

// The witness verifier keys in `path`, one per line ('#' comments).
absl::StatusOr<std::vector<VerifierKey>> ReadWitnessKeys(
    const std::string& path) {
  std::vector<VerifierKey> keys;
  if (path.empty()) return keys;
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    absl::StatusOr<CosignatureVerifier> key = CosignatureVerifier::Parse(line);
    if (!key.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--audit_witness_keys ", path, " line ", line_number,
                       ": ", key.status().message()));
    }
    keys.push_back(key->verifier_key());
  }
  return keys;
}

// The audit log's signer, with its key (created on first start) and the
// configured witnesses.
absl::StatusOr<std::unique_ptr<CheckpointSigner>> OpenCheckpointSigner(
    const ServerConfig& config, AuditLog* audit, metrics::Timestamp* covered) {
  const std::string key_path = config.audit_key_file.empty()
                                   ? data_dir::AuditKeyPath(config.data_dir)
                                   : config.audit_key_file;
  bool created = false;
  MODELSTATE_ASSIGN_OR_RETURN(
      Ed25519PrivateKey key,
      Ed25519PrivateKey::LoadOrCreate(key_path, &created));
  CheckpointSignerOptions options;
  options.origin = config.audit_origin;
  options.covered_at = covered;
  MODELSTATE_ASSIGN_OR_RETURN(options.witnesses,
                              ReadWitnessKeys(config.audit_witness_keys_file));
  const size_t witnesses = options.witnesses.size();
  MODELSTATE_ASSIGN_OR_RETURN(
      std::unique_ptr<CheckpointSigner> signer,
      CheckpointSigner::Create(audit, std::move(key), std::move(options)));
  LogLine(absl::StrCat(
      created ? "created the audit signing key " : "audit signing key ",
      key_path, created ? " (mode 0600)" : "", "; verifier key: ",
      signer->verifier_key(), "; ", witnesses, " witness keys"));
  return signer;
}

}  // namespace

absl::Status CheckServerConfig(const ServerConfig& config) {
  return PrepareSecurity(config).status();
}

Server::Server() = default;

Server::~Server() {
  Shutdown();
  Wait();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerConfig config) {
  MODELSTATE_ASSIGN_OR_RETURN(Security security, PrepareSecurity(config));
  std::unique_ptr<Server> server(new Server());
  server->config_ = std::move(config);
  server->auth_ = std::move(security.auth);
  server->metrics_ = std::make_unique<ServerMetrics>();
  MODELSTATE_RETURN_IF_ERROR(server->OpenState());
  server->store_->set_quotas(std::move(security.quotas));
  server->tls_ = std::move(security.tls);
  MODELSTATE_RETURN_IF_ERROR(server->Listen(
      server->tls_ != nullptr ? server->tls_->Credentials()
                              : grpc::InsecureServerCredentials()));
  if (server->tls_ != nullptr) {
    WarnAboutReadableKey(server->config_.tls_key_file);
  }
  server->StartReloads();
  MODELSTATE_RETURN_IF_ERROR(server->ListenForHealth());
  MODELSTATE_RETURN_IF_ERROR(server->ServeMetrics());
  MODELSTATE_RETURN_IF_ERROR(server->JoinCluster());
  return server;
}

absl::Status Server::OpenState() {
  const std::string& root = config_.data_dir;
  MODELSTATE_RETURN_IF_ERROR(CreateDirectory(root, "--data_dir "));
  ModelServiceOptions options;
  options.limits = config_.limits;
  // Loads stage their bytes in unlinked files here (nothing to clean up).
  options.staging_dir = data_dir::StagingDir(root);
  MODELSTATE_RETURN_IF_ERROR(CreateDirectory(options.staging_dir, ""));
  options.audit_path = data_dir::AuditLogPath(root);
  absl::StatusOr<std::unique_ptr<AuditLog>> audit =
      AuditLog::Open(options.audit_path,
                     {.hashes_path = data_dir::AuditHashesPath(root),
                      .checkpoint_path = data_dir::AuditCheckpointPath(root),
                      .index_path = data_dir::AuditIndexPath(root)});
  if (!audit.ok()) {
    return StartError("cannot open the audit log: ", audit.status());
  }
  audit_ = *std::move(audit);
  audit_->set_metrics(&metrics_->audit_append(), &metrics_->audit_sync());
  if (audit_->recovered_torn_tail()) {
    LogLine(absl::StrCat(options.audit_path,
                         ": removed a torn last record left by a crash"));
  }
  if (!audit_->read_whole_log().empty()) {
    LogLine(absl::StrCat(options.audit_path, ": read and checked all ",
                         audit_->last_seq(), " records (",
                         audit_->read_whole_log(), ")"));
  }
  if (!audit_->read_after_crash().empty()) {
    LogLine(absl::StrCat(options.audit_path, ": ", audit_->read_after_crash()));
  }
  if (!audit_->tree_repair().empty()) {
    LogLine(absl::StrCat(options.audit_path, ": ", audit_->tree_repair()));
  }
  absl::StatusOr<std::unique_ptr<CheckpointSigner>> checkpoints =
      OpenCheckpointSigner(config_, audit_.get(),
                           &metrics_->latest_checkpoint());
  if (!checkpoints.ok()) {
    return StartError("cannot sign the audit log: ", checkpoints.status());
  }
  checkpoints_ = *std::move(checkpoints);
  checkpoints_->Start();
  options.checkpoints = checkpoints_.get();
  hub_ = std::make_unique<SubscriberHub>(
      audit_.get(), config_.limits.subscriber_timeout,
      config_.limits.denied_audit_interval, config_.limits.max_denied_keys);
  hub_->set_metrics(&metrics_->hook_round_trip(), &metrics_->hook_timeouts());
  hub_->set_stray_answers_metric(&metrics_->hook_stray_answers());
  hub_->set_max_dry_run_bytes(config_.limits.max_subscriber_queue_bytes);
  absl::StatusOr<size_t> owned_names = hub_->RestoreNameOwners();
  if (!owned_names.ok()) {
    return StartError("cannot read subscriber names from the audit log: ",
                      owned_names.status());
  }
  const std::string modules_dir = data_dir::ModulesDir(root);
  absl::StatusOr<std::unique_ptr<ModuleRepository>> repository =
      ModuleRepository::Open(modules_dir);
  if (!repository.ok()) {
    return StartError("cannot open the module directory: ",
                      repository.status());
  }
  repository_ = *std::move(repository);
  repository_->set_map_saved_bytes(config_.map_saved_bytes);
  store_ = std::make_unique<ModelStore>();
  store_->set_decider(hub_.get());
  store_->set_audit_log(audit_.get());
  store_->set_repository(repository_.get());
  // Everything saved comes back before the first request is served.
  absl::Time restore_start = absl::Now();
  ModelStore::RestoreReport restored = store_->Restore(config_.fallback_to_cpu);
  if (!restored.refused.ok()) {
    return StartError("cannot restore the modules: ", restored.refused);
  }
  for (const absl::Status& error : restored.errors) {
    LogLine(absl::StrCat("not restored: ", error.ToString()));
    if (absl::IsFailedPrecondition(error) && !config_.fallback_to_cpu) {
      LogLine("  (start with --fallback_to_cpu to restore it onto cpu)");
    }
  }
  LogLine(
      absl::StrFormat("restored %d modules (%d bytes) from %s in %.3f s%s",
                      restored.modules, restored.bytes, modules_dir,
                      absl::ToDoubleSeconds(absl::Now() - restore_start),
                      restored.recovered == 0
                          ? ""
                          : absl::StrCat("; recorded ", restored.recovered,
                                         " changes the audit log had missed")));
  metrics_->Observe(store_.get(), hub_.get(), config_.metrics_max_namespaces);
  if (config_.scrub_interval > absl::ZeroDuration()) {
    ServerMetrics* metrics = metrics_.get();
    scrubber_ = std::make_unique<Scrubber>(
        store_.get(), config_.scrub_interval,
        [metrics](const ModelStore::ScrubReport& report) {
          metrics->CountScrubPass(report.bytes);
          for (const absl::Status& damaged : report.damaged) {
            LogLine(absl::StrCat("scrub: ", damaged.ToString()));
          }
          if (report.newly_damaged > 0) {
            LogLine(absl::StrFormat(
                "scrub: %d of %d storages (%d bytes, %d modules) newly found "
                "damaged; reads of them fail with DATA_LOSS",
                report.newly_damaged, report.storages, report.bytes,
                report.modules));
          }
        });
  }
  service_ = std::make_unique<ModelService>(
      store_.get(), hub_.get(), audit_.get(), auth_.get(), std::move(options));
  MODELSTATE_RETURN_IF_ERROR(PrepareCluster());
  MODELSTATE_RETURN_IF_ERROR(OpenSharedMemory());
  handlers_ = std::make_unique<ModelStateServiceImpl>(
      service_.get(), router_.get(), metrics_.get(), shared_memory_.get());
  if (router_ != nullptr) {
    cluster_handlers_ =
        std::make_unique<ClusterServiceImpl>(service_.get(), router_.get());
  }
  return absl::OkStatus();
}

absl::Status Server::OpenSharedMemory() {
  if (!config_.shared_memory || router_ != nullptr) return absl::OkStatus();
  const bool chosen = !config_.shm_socket.empty();
  absl::StatusOr<std::unique_ptr<SharedMemoryExchange>> exchange =
      SharedMemoryExchange::Start(
          {.socket_path =
               chosen ? config_.shm_socket
                      : data_dir::SharedMemorySocketPath(config_.data_dir),
           .direct_writes = config_.shared_memory_direct});
  if (!exchange.ok() && chosen) {
    return StartError("cannot open the shared memory socket: ",
                      exchange.status());
  }
  if (!exchange.ok()) {
    // The default place may not suit (a path too long for a socket): the
    // server serves without it, as with --shared_memory=false.
    LogLine(absl::StrCat("no shared memory transfers: ",
                         exchange.status().message()));
    return absl::OkStatus();
  }
  shared_memory_ = *std::move(exchange);
  LogLine(absl::StrCat("same-host clients may exchange state through ",
                       shared_memory_->socket_path()));
  return absl::OkStatus();
}

absl::Status Server::PrepareCluster() {
  if (config_.cluster.etcd.endpoints.empty()) return absl::OkStatus();
  if (config_.cluster_secret_file.empty()) {
    return absl::InvalidArgumentError(
        "cluster_secret_file: required with --etcd_endpoints");
  }
  // Whoever can write the secret can forward any identity to this replica.
  MODELSTATE_ASSIGN_OR_RETURN(
      std::string secret,
      ReadPem("cluster_secret_file", config_.cluster_secret_file,
              /*guarded=*/true));
  // The volume id: made once, kept with the data.
  const std::string volume_path = data_dir::ClusterVolumePath(config_.data_dir);
  absl::StatusOr<std::string> volume = ReadFile(volume_path);
  if (absl::IsNotFound(volume.status())) {
    unsigned char bytes[16];
    if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
      return absl::InternalError("no random bytes for the cluster volume id");
    }
    volume = absl::BytesToHexString(
        absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
    MODELSTATE_RETURN_IF_ERROR(WriteFileAtomically(volume_path, *volume));
  }
  MODELSTATE_RETURN_IF_ERROR(volume.status());
  ClusterOptions options = config_.cluster;
  options.volume_id = *volume;
  options.audit_checkpoint = [signer = checkpoints_.get()] {
    return std::make_pair(signer->verifier_key(), signer->Latest());
  };
  std::shared_ptr<grpc::ChannelCredentials> peers =
      grpc::InsecureChannelCredentials();
  if (!config_.tls_cert_file.empty()) {
    if (config_.cluster_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "cluster_ca_file: required with --etcd_endpoints and TLS");
    }
    // Whoever can write the CA can pose as a replica: it is read as a
    // guarded file, as the client CA is. Re-read with the listening side's
    // files (Reload), so that a rotation reaches the calls between
    // replicas too.
    MODELSTATE_ASSIGN_OR_RETURN(
        peer_tls_,
        PeerTls::Create({config_.tls_cert_file, config_.tls_key_file,
                         config_.cluster_ca_file, "cluster_ca_file"}));
    peers = peer_tls_->Credentials();
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      router_, ClusterRouter::Create(std::move(options), std::move(secret),
                                     std::move(peers)));
  router_->set_unsettled_move([store = store_.get()](const ModuleName& name) {
    return store->InMove(name);
  });
  router_->set_connected_subscribers([hub = hub_.get()] {
    std::vector<std::string> names;
    for (const SubscriberInfo& info : hub->List()) {
      names.push_back(info.spec.name);
    }
    return names;
  });
  // Fenced at commit, not only when a write is routed: a stream or a held
  // registration may outlast the lease it began under.
  store_->set_write_fence(
      [router = router_.get()] { return router->CheckWritable(); });
  return absl::OkStatus();
}

absl::Status Server::JoinCluster() {
  if (router_ == nullptr) return absl::OkStatus();
  std::vector<std::string> local;
  std::vector<std::string> in_move;
  for (const ModuleSummary& module :
       store_->List("", "", std::numeric_limits<size_t>::max())) {
    local.push_back(module.name.full());
    if (store_->InMove(module.name)) in_move.push_back(module.name.full());
  }
  // A copy this replica does not own was left by a move that crashed
  // half-way (the new owner before its takeover, or the old one before
  // deleting its copy). Served, it would answer for the module once its
  // owner deletes it, and list it twice meanwhile; its files are kept for
  // an operator.
  size_t set_aside = 0;
  auto settle = [&](const ClusterMember::JoinReport& report) {
    const std::string stamp =
        absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone());
    for (const ModuleOwner& copy : report.owned_elsewhere) {
      absl::StatusOr<ModuleName> name = ParseModuleName(copy.module);
      if (!name.ok()) continue;
      const std::string destination =
          data_dir::SetAsidePath(config_.data_dir, *name, stamp);
      absl::Status moved = store_->SetAside(*name, copy.replica, destination);
      ++set_aside;
      LogLine(absl::StrCat(
          "module ", copy.module,
          copy.replica.empty()
              ? " was being moved and no replica owns it now"
              : absl::StrCat(" is owned by replica ", copy.replica),
          ": the copy here is not served",
          moved.ok() ? absl::StrCat("; moved to ", destination)
                     : absl::StrCat(" (", moved.message(), ")")));
    }
    for (const std::string& module : report.moves_settled) {
      absl::StatusOr<ModuleName> name = ParseModuleName(module);
      if (name.ok()) store_->SettleMove(*name).IgnoreError();
    }
  };
  absl::Status joined = router_->Join(address_, local, in_move, settle);
  if (!joined.ok()) {
    return absl::Status(joined.code(), absl::StrCat("cannot join the cluster: ",
                                                    joined.message()));
  }
  LogLine(absl::StrCat("joined the cluster as replica ", router_->replica(),
                       " (", local.size() - set_aside, " modules claimed)"));
  return absl::OkStatus();
}

absl::Status Server::Listen(
    const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  grpc::ServerBuilder builder;
  // Ours, not gRPC's (health_service.h says why).
  builder.SetOption(
      std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  health_ = std::make_unique<HealthService>();
  builder.RegisterService(health_.get());
  // A second server on the same port must fail, not share connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // In range (checked by modelstate-server): fits an int.
  const int max_message = static_cast<int>(config_.limits.max_message_bytes);
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  if (config_.stream_window_kib > 0) {
    // A fixed window instead of gRPC's adaptive one, which on loopback
    // grows until a slow consumer has tens of MiB queued in the server.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               config_.stream_window_kib << 10);
  }
  // gRPC charges what every connection on this port reads (requests not
  // yet whole included) to the quota; past its size it cancels streams
  // (RESOURCE_EXHAUSTED) and closes idle connections. That bounds what
  // callers who are then refused make the server hold: gRPC receives a
  // request whole before the server can look at its token.
  if (config_.worker_threads > 0 || config_.max_transport_mib > 0) {
    grpc::ResourceQuota quota("modelstate");
    if (config_.worker_threads > 0) quota.SetMaxThreads(config_.worker_threads);
    if (config_.max_transport_mib > 0) {
      quota.Resize(static_cast<size_t>(config_.max_transport_mib) << 20);
    }
    builder.SetResourceQuota(quota);
  }
  int port = 0;
  if (!config_.listen.empty()) {
    builder.AddListeningPort(config_.listen, credentials, &port);
  }
  builder.RegisterService(handlers_.get());
  if (cluster_handlers_ != nullptr) {
    builder.RegisterService(cluster_handlers_.get());
  }
  // Every call is counted, timed and given a correlation id for the log,
  // after a request gRPC could not parse has been given a status that says so.
  auto interceptors = metrics_->InterceptorCreators();
  interceptors.insert(interceptors.begin(), ParseErrorInterceptorCreator());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  calls_ = std::make_unique<AsyncCallQueue>(builder);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || (!config_.listen.empty() && port == 0)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", config_.listen));
  }
  calls_->Start(StreamThreads());
  handlers_->ServeSubscriptions(calls_.get());
  health_->ServeWatches(calls_.get());
  if (config_.listen.empty()) {
    LogLine("modelstate-server serving in-process only (no listen address)");
    return absl::OkStatus();
  }
  address_ = absl::StrCat(config_.listen.substr(0, config_.listen.rfind(':')),
                          ":", port);
  const bool tls = !config_.tls_cert_file.empty();
  const bool mtls = !config_.tls_client_ca_file.empty();
  LogLine(absl::StrCat(
      "modelstate-server listening on ", address_,
      tls ? (mtls ? " (mutual TLS)" : " (TLS)") : " (plaintext)",
      tls ? absl::StrCat("; certificate ", tls_->summary()) : "",
      auth_->enabled()
          ? absl::StrCat("; ", config_.token_file, " authenticates callers")
          : "; no authentication (no --token_file): loopback only, every "
            "caller is an admin"));
  return absl::OkStatus();
}

namespace {

// Removes gRPC reflection's builder plugin (modelstate-server turns it on
// process-wide) from a server that must describe nothing.
class NoReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    std::erase_if(*plugins, [](const auto& plugin) {
      return plugin->name() == "proto_server_reflection";
    });
  }
};

}  // namespace

absl::Status Server::ListenForHealth() {
  // Probes that cannot present credentials get health and nothing else:
  // not even reflection's description of the service.
  if (config_.health_listen.empty()) return absl::OkStatus();
  grpc::ServerBuilder builder;
  builder.SetOption(
      std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  builder.SetOption(std::make_unique<NoReflection>());
  health_only_ = std::make_unique<HealthService>();
  builder.RegisterService(health_only_.get());
  int port = 0;
  builder.AddListeningPort(config_.health_listen,
                           grpc::InsecureServerCredentials(), &port);
  health_calls_ = std::make_unique<AsyncCallQueue>(builder);
  health_server_ = builder.BuildAndStart();
  if (health_server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on --health_listen ", config_.health_listen));
  }
  health_calls_->Start(1);
  health_only_->ServeWatches(health_calls_.get());
  // The port bound, not the one asked for (0: any free one).
  const absl::string_view asked = config_.health_listen;
  LogLine(absl::StrCat("health checks (only) on ",
                       asked.substr(0, asked.rfind(':')), ":", port));
  return absl::OkStatus();
}

absl::Status Server::ServeMetrics() {
  if (config_.metrics_listen.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
      MetricsHttpServer::Start(config_.metrics_listen, &metrics_->registry());
  if (!http.ok()) return http.status();
  metrics_http_ = *std::move(http);
  LogLine(absl::StrCat("Prometheus metrics on http://",
                       metrics_http_->address(), "/metrics"));
  return absl::OkStatus();
}

std::string Server::metrics_address() const {
  return metrics_http_ == nullptr ? "" : metrics_http_->address();
}

std::shared_ptr<grpc::Channel> Server::InProcessChannel() {
  grpc::ChannelArguments args;
  const int max_message = static_cast<int>(config_.limits.max_message_bytes);
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  return server_->InProcessChannel(args);
}

namespace {

// The bytes of `path` now ("" when it is unset or cannot be read: a file
// being replaced is looked at again next time).
std::string BytesOf(const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> bytes = ReadFile(path);
  return bytes.ok() ? *std::move(bytes) : std::string();
}

}  // namespace

void Server::Reload(absl::string_view why) {
  MutexLock lock(&reload_mu_);
  if (tls_ != nullptr) {
    const std::string line = tls_->Reload();
    LogLine(absl::StrCat(
        why, ": ", line.empty() ? "the TLS files are as in force" : line));
  }
  ReloadPeerTls(why);
  ReloadEtcd(why);
  ReloadTokens(why);
  ReloadQuotas(why);
}

void Server::ReloadChanged() {
  MutexLock lock(&reload_mu_);
  if (tls_ != nullptr) {
    const std::string line = tls_->Reload();
    if (!line.empty()) LogLine(absl::StrCat("TLS: ", line));
  }
  ReloadPeerTls("TLS");
  ReloadEtcd("TLS");
  if (std::string now = BytesOf(config_.token_file);
      !now.empty() && now != token_bytes_) {
    ReloadTokens("the token file changed");
  }
  if (std::string now = BytesOf(config_.quota_file);
      !now.empty() && now != quota_bytes_) {
    ReloadQuotas("the quota file changed");
  }
}

void Server::ReloadPeerTls(absl::string_view why) {
  if (peer_tls_ == nullptr) return;
  bool taken = false;
  const std::string line = peer_tls_->Reload(&taken);
  // Channels made before keep the old set when they reconnect: the
  // router makes new ones. Calls under way finish on theirs.
  if (taken) router_->set_peer_credentials(peer_tls_->Credentials());
  if (!line.empty()) LogLine(absl::StrCat(why, ": ", line));
}

void Server::ReloadEtcd(absl::string_view why) {
  if (config_.etcd_files == nullptr || router_ == nullptr) return;
  bool taken = false;
  const std::string line = config_.etcd_files->Reload(&taken);
  // Calls under way finish on the old connections; the lease is kept.
  if (taken) router_->set_etcd_credentials(config_.etcd_files->Credentials());
  if (!line.empty()) LogLine(absl::StrCat(why, ": ", line));
}

void Server::ReloadTokens(absl::string_view why) {
  if (!auth_->enabled()) return;
  // Read before the reload: a change made meanwhile is found next time.
  token_bytes_ = BytesOf(config_.token_file);
  absl::StatusOr<size_t> loaded = auth_->Reload();
  LogLine(loaded.ok() ? absl::StrCat(why, ": ", *loaded, " principals from ",
                                     config_.token_file)
                      : absl::StrCat(why, ": kept the principals in force: ",
                                     loaded.status().message()));
  // Open subscriptions and transfers were authorised by the old file;
  // audit watches notice the new one within a second on their own.
  if (loaded.ok()) {
    service_->RecheckSubscribers();
    service_->RecheckTransfers();
  }
}

void Server::ReloadQuotas(absl::string_view why) {
  quota_bytes_ = BytesOf(config_.quota_file);
  absl::StatusOr<QuotaPolicy> quotas = LoadQuotas(config_);
  if (quotas.ok()) {
    store_->set_quotas(*std::move(quotas));
    if (!config_.quota_file.empty()) {
      LogLine(absl::StrCat(why, ": quotas from ", config_.quota_file));
    }
  } else {
    LogLine(absl::StrCat(
        why, ": kept the quotas in force: ", quotas.status().message()));
  }
}

void Server::StartReloads() {
  {
    MutexLock lock(&reload_mu_);
    token_bytes_ = BytesOf(config_.token_file);
    quota_bytes_ = BytesOf(config_.quota_file);
  }
  if (config_.reload_interval <= absl::ZeroDuration()) return;
  reloads_ = std::thread([this] {
    while (!stop_reloads_.WaitForNotificationWithTimeout(
        config_.reload_interval)) {
      ReloadChanged();
    }
  });
}

void Server::Shutdown() {
  if (server_ == nullptr || shut_down_.exchange(true)) return;
  stop_reloads_.Notify();
  health_->Shutdown();
  if (health_only_ != nullptr) health_only_->Shutdown();
  hub_->CloseAll(absl::UnavailableError("server shutting down"));
  server_->Shutdown(absl::ToChronoTime(
      absl::Now() + absl::Seconds(config_.shutdown_grace_seconds)));
}

void Server::Wait() {
  if (server_ == nullptr) return;
  server_->Wait();
  if (reloads_.joinable()) reloads_.join();
  calls_->Shutdown();  // after the server's
  if (health_server_ != nullptr) {
    health_server_->Shutdown();
    health_calls_->Shutdown();
  }
  // Its lease revoked, the replica leaves the cluster at once.
  if (router_ != nullptr) router_->Leave();
  // The refusals counted since the last interval are recorded too.
  service_->FlushDenials();
  // And the stray answers counted (no subscriber's stream runs any more).
  hub_->StopStrayAnswers();
  // The last records get their checkpoint before the server goes.
  checkpoints_->Stop();
  checkpoints_->SignNow().IgnoreError();
}

}  // namespace modelstate::server
