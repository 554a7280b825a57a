// File: server.h
// A whole modelstate server in one object: from a ServerConfig (every
// flag's value) it opens the data directory (audit log, modules, staging),
// restores the saved modules, and serves the gRPC service (with health
// checks) on its listening address, on an optional health-only address,
// and in-process, with Prometheus metrics over HTTP on an optional
// address (server/metrics.h). modelstate-server is a flag parser and a signal
// loop around it (which also turns on gRPC reflection, a process-wide plugin);
// tests start one in their own process.
//
// Example:
//   ServerConfig config;
//   config.listen = "127.0.0.1:0";
//   config.data_dir = "/tmp/data";
//   MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<Server> server,
//                               Server::Start(config));
//   auto stub = v1::ModelStateService::NewStub(server->InProcessChannel());
//   ...
//   server->Shutdown();
//   server->Wait();
#ifndef MODELSTATE_SERVER_SERVER_H_
#define MODELSTATE_SERVER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "cluster/cluster_member.h"
#include "grpcpp/grpcpp.h"
#include "service/limits.h"
#include "service/quota.h"

namespace modelstate {
class AuditLog;
class Authenticator;
class CheckpointSigner;
class ModelService;
class ModelStore;
class ModuleRepository;
class Scrubber;
class SharedMemoryExchange;
class SubscriberHub;
}  // namespace modelstate

namespace modelstate::server {

class AsyncCallQueue;
class ClusterRouter;
class ClusterServiceImpl;
class EtcdTls;
class HealthService;
class MetricsHttpServer;
class ModelStateServiceImpl;
class PeerTls;
class ServerMetrics;
class ServerTls;

// Everything a server is started with: modelstate-server's flags. The
// flags take their defaults from here (and from Limits).
struct ServerConfig {
  // host:port to listen on (port 0 picks a free one); "": none, the server
  // is reachable through InProcessChannel() only.
  std::string listen = "127.0.0.1:50051";
  // Durable state and the audit log; created if missing.
  std::string data_dir = "./data";
  // HTTP/2 receive window per stream, in KiB: how far a client may send
  // ahead of a load being written to disk (0: gRPC's adaptive window).
  int stream_window_kib = 8192;
  // Most threads serving calls (0: gRPC's default).
  int worker_threads = 0;
  // MiB of memory gRPC may hold receiving requests on the listening port
  // (its read buffers, requests not yet whole) before it cancels streams
  // and closes idle connections (0: no limit).
  int max_transport_mib = 0;
  // How long running calls may take to finish at Shutdown().
  int shutdown_grace_seconds = 10;
  Limits limits;
  // TLS: certificate chain and key (PEM files; both or neither), and the
  // CA bundle that client certificates must chain to (mutual TLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // How often the TLS files, the token file and the quota file are
  // checked and, if changed, re-read (SIGHUP re-reads them too): a
  // Kubernetes Secret or ConfigMap is updated in place, and nothing
  // signals the container. Zero: on SIGHUP only.
  absl::Duration reload_interval = absl::Seconds(60);
  // Principals and roles (JSON); "": no authentication, loopback only.
  std::string token_file;
  // Allow plaintext on a non-loopback address.
  bool plaintext = false;
  // A second, plaintext address serving only grpc.health.v1; "": none.
  std::string health_listen;
  // Per-namespace quotas (JSON), over `namespace_quota`, which holds for
  // every namespace the file does not name.
  std::string quota_file;
  NamespaceQuota namespace_quota;
  // Restore modules saved on a device this server lacks onto cpu.
  bool fallback_to_cpu = false;
  // Serve Prometheus metrics over HTTP at /metrics on this address
  // ("host:port", or a port alone for 127.0.0.1); "": none.
  std::string metrics_listen;
  // Namespaces named in the per-namespace metrics (in name order); the
  // rest are summed into namespace="_other".
  size_t metrics_max_namespaces = 100;
  // The audit log's Ed25519 signing key (PEM), created with mode 0600 when
  // absent; "": DATA_DIR/audit.key.
  std::string audit_key_file;
  // The witnesses whose cosignatures AddCosignature takes: one verifier
  // key (cosignature type) per line, '#' comments; "": none.
  std::string audit_witness_keys_file;
  // The log's name in its checkpoints (and its key's name).
  std::string audit_origin = "modelstate/audit";
  // Cluster membership (server/cluster_router.h): with etcd endpoints the
  // server joins the cluster named by them once it listens. Its replica id
  // is cluster.replica_id; cluster.advertise_address "" is the address it
  // listens on; cluster.volume_id is this data directory's.
  ClusterOptions cluster;
  // The files cluster.etcd's credentials were read from
  // (modelstate-server's --etcd_*_file), re-read with the TLS files at
  // each reload and handed to the etcd client when they changed; null:
  // cluster.etcd's are kept.
  std::shared_ptr<EtcdTls> etcd_files;
  // The secret replicas present to one another (a file; at least 16
  // bytes); required with etcd endpoints.
  std::string cluster_secret_file;
  // The CA that signed the other replicas' TLS certificates, for servers
  // that serve TLS: a replica calls the others with its own certificate.
  std::string cluster_ca_file;
  // Same-host clients may exchange state_dict bytes as memfds over a Unix
  // socket (server/shared_memory_exchange.h), at `shm_socket` ("":
  // DATA_DIR/shm.sock). Off for a cluster member, whose calls may be
  // forwarded to another host.
  bool shared_memory = true;
  std::string shm_socket;
  // With shared memory, a GetStateDict may write the bytes straight into
  // the memory of a client that offers it (base/shared_memory.h's direct
  // table), where the kernel lets this process; off: through the ring's
  // slots only.
  bool shared_memory_direct = true;
  // How often the scrub reads every hosted byte mapped from the data
  // directory and checks it against its CRC-32C (service/scrubber.h);
  // zero turns it off.
  absl::Duration scrub_interval = absl::Hours(24);
  // After each save, host the saved bytes from the data files instead of
  // process memory (ModuleRepository::set_map_saved_bytes).
  bool map_saved_bytes = false;
};

// Checks what a server must not start with, before anything starts:
// INVALID_ARGUMENT (its message names the flag) for TLS files that do not
// go together or cannot be read, mutual TLS without a token file, a
// non-loopback address without a token file or (unless `plaintext`)
// without TLS; a token or quota file that cannot be read or parsed.
absl::Status CheckServerConfig(const ServerConfig& config);

// Thread-safe.
class Server {
 public:
  // CheckServerConfig's errors, then any failure to set up the data
  // directory, restore or listen (its message says which). Everything
  // saved is restored before the first call is served.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerConfig config);
  // Shuts down (if not yet) and waits.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The address actually listened on ("127.0.0.1:41234"); "" without one.
  const std::string& address() const { return address_; }
  // Where /metrics is served ("127.0.0.1:9464"); "" without
  // metrics_listen.
  std::string metrics_address() const;
  // A channel to this server within the process (no network, no TLS;
  // bearer tokens work), with the server's message size limit.
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Re-reads the TLS files (the etcd ones too), the token file and the
  // quota file; a file that cannot be read (or fails a check) keeps what is
  // in force. Logs what happened, each line after `why`.
  void Reload(absl::string_view why = "reload");
  // What reload_interval runs: the TLS and etcd files re-read (logged only
  // when something changed), and the token and quota files re-read only when
  // their bytes changed since they were last read.
  void ReloadChanged();
  // Health turns NOT_SERVING at once, subscribers are disconnected, new
  // calls are refused, and running calls get shutdown_grace_seconds before
  // they are cancelled. Returns at once; later calls do nothing.
  void Shutdown();
  // Returns once the server has shut down.
  void Wait();

  // The hosted state, for tests that look behind the service.
  ModelStore& store() { return *store_; }
  AuditLog& audit_log() { return *audit_; }
  ServerMetrics& metrics() { return *metrics_; }

 private:
  Server();
  absl::Status OpenState();
  absl::Status Listen(
      const std::shared_ptr<grpc::ServerCredentials>& credentials);
  absl::Status ListenForHealth();
  absl::Status ServeMetrics();
  absl::Status PrepareCluster();
  absl::Status OpenSharedMemory();
  absl::Status JoinCluster();
  // Reload's parts. The token file's: open subscriptions and transfers are
  // checked against the new principals.
  void ReloadPeerTls(absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mu_);
  void ReloadEtcd(absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mu_);
  void ReloadTokens(absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mu_);
  void ReloadQuotas(absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mu_);
  // Runs ReloadChanged every reload_interval until Shutdown.
  void StartReloads();

  ServerConfig config_;
  // One reload at a time (SIGHUP's and the interval's), and the bytes of
  // the token and quota files as last read, to tell a change.
  Mutex reload_mu_;
  std::string token_bytes_ ABSL_GUARDED_BY(reload_mu_);
  std::string quota_bytes_ ABSL_GUARDED_BY(reload_mu_);
  absl::Notification stop_reloads_;
  std::thread reloads_;
  // Declared in dependency order: each member is destroyed before the
  // ones it uses.
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<AuditLog> audit_;
  std::unique_ptr<CheckpointSigner> checkpoints_;
  std::unique_ptr<SubscriberHub> hub_;
  std::unique_ptr<ModuleRepository> repository_;
  std::unique_ptr<ModelStore> store_;
  std::unique_ptr<Scrubber> scrubber_;
  std::unique_ptr<ModelService> service_;
  // What router_ presents to and trusts of the other replicas under TLS
  // (null without TLS or a cluster); set before the reloads start.
  std::unique_ptr<PeerTls> peer_tls_;
  std::unique_ptr<ClusterRouter> router_;
  std::unique_ptr<SharedMemoryExchange> shared_memory_;
  std::unique_ptr<ModelStateServiceImpl> handlers_;
  std::unique_ptr<ClusterServiceImpl> cluster_handlers_;
  std::unique_ptr<HealthService> health_;
  // Declared before the servers that use them, so destroyed after.
  std::shared_ptr<ServerTls> tls_;  // gRPC calls into it at each handshake
  std::unique_ptr<AsyncCallQueue> calls_;  // server_'s streams
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthService> health_only_;  // health_server_'s service
  std::unique_ptr<AsyncCallQueue> health_calls_;
  std::unique_ptr<grpc::Server> health_server_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  std::string address_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_SERVER_H_
