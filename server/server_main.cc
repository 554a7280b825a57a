// modelstate-server: hosts Module trees over gRPC.
//
//   modelstate-server --listen=127.0.0.1:50051 --data_dir=./data
//
// SIGTERM / SIGINT shut it down cleanly: new calls are refused, running
// calls get --shutdown_grace_seconds to finish, then are cancelled. SIGHUP
// re-reads --token_file, --quota_file, the TLS files and the --etcd_*_file
// ones (a bad file keeps the old one); they are also re-read when changed,
// every --reload_seconds.
//
// Without --token_file there is no authentication: every caller is an admin,
// so the server then listens on loopback addresses only. Plaintext on a
// non-loopback address needs --plaintext; otherwise --tls_cert_file and
// --tls_key_file (and --tls_client_ca_file for mutual TLS).
//
// This file only turns flags into a ServerConfig (server/server.h), checks
// their ranges, starts the server and runs the signal loop.
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/malloc_settings.h"
#include "base/signal_pipe.h"
#include "base/status_macros.h"
#include "core/emulated_device.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "server/server.h"
#include "server/server_tls.h"

namespace {

using modelstate::server::ServerConfig;

// Every flag's default is the ServerConfig's (and its Limits').
const ServerConfig& Defaults() {
  static const ServerConfig* const defaults = new ServerConfig();
  return *defaults;
}

}  // namespace

ABSL_FLAG(std::string, listen, Defaults().listen,
          "Address to listen on (host:port; port 0 picks a free one)");
ABSL_FLAG(std::string, data_dir, Defaults().data_dir,
          "Directory for durable state and the audit log");
ABSL_FLAG(int, stream_window_kib, Defaults().stream_window_kib,
          "HTTP/2 receive window per stream, in KiB: how far a client may "
          "send ahead of a load being written to disk, which bounds the "
          "server's buffering (0: gRPC's adaptive window)");
ABSL_FLAG(std::string, ready_file, "",
          "Once serving, write the actual listen address to this file");
ABSL_FLAG(int, max_message_mib,
          static_cast<int>(Defaults().limits.max_message_bytes >> 20),
          "Largest gRPC message accepted or sent, in MiB");
ABSL_FLAG(int, chunk_kib,
          static_cast<int>(Defaults().limits.default_chunk_bytes >> 10),
          "Default GetStateDict chunk size, in KiB");
ABSL_FLAG(int, max_chunk_kib,
          static_cast<int>(Defaults().limits.max_chunk_bytes >> 10),
          "Largest GetStateDict chunk size, in KiB");
ABSL_FLAG(int64_t, max_tensor_mib,
          static_cast<int64_t>(Defaults().limits.max_tensor_bytes >> 20),
          "Largest single tensor, in MiB");
ABSL_FLAG(int64_t, max_module_mib,
          static_cast<int64_t>(Defaults().limits.max_module_bytes >> 20),
          "Largest module (build or loaded state_dict), in MiB");
ABSL_FLAG(int, max_spec_depth, Defaults().limits.max_spec_depth,
          "Deepest module nesting in a spec");
ABSL_FLAG(int64_t, max_entries, Defaults().limits.max_entries,
          "Most parameters, buffers and submodules in one module");
ABSL_FLAG(int, worker_threads, Defaults().worker_threads,
          "Most threads serving calls (0: gRPC's default)");
ABSL_FLAG(int, max_transport_mib, Defaults().max_transport_mib,
          "MiB of memory that gRPC may hold receiving requests on the "
          "listening port before it cancels streams (RESOURCE_EXHAUSTED): "
          "bounds what callers who are then refused make the server hold "
          "(0: no limit; else at least twice --max_message_mib)");
ABSL_FLAG(int, max_queued_events,
          static_cast<int>(Defaults().limits.max_queued_events),
          "Events waiting for one subscriber before it is disconnected");
ABSL_FLAG(int64_t, max_subscriber_queue_mib,
          static_cast<int64_t>(Defaults().limits.max_subscriber_queue_bytes >>
                               20),
          "MiB of events (tensor data included) waiting for one subscriber "
          "before it is disconnected");
ABSL_FLAG(int, shutdown_grace_seconds, Defaults().shutdown_grace_seconds,
          "How long running calls may take to finish at shutdown");
ABSL_FLAG(std::string, tls_cert_file, Defaults().tls_cert_file,
          "Server certificate chain (PEM); with --tls_key_file turns on TLS");
ABSL_FLAG(std::string, tls_key_file, Defaults().tls_key_file,
          "Server private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca_file, Defaults().tls_client_ca_file,
          "CA bundle (PEM) that client certificates must chain to: mutual "
          "TLS; a certificate's CN names a principal of --token_file");
ABSL_FLAG(int, reload_seconds,
          static_cast<int>(absl::ToInt64Seconds(Defaults().reload_interval)),
          "How often the TLS files (--etcd_* ones included), the token file "
          "and the quota file are checked and re-read when changed (a rotated "
          "Secret is served to new connections; a bad file keeps the ones in "
          "force); 0: on SIGHUP only");
ABSL_FLAG(std::string, token_file, Defaults().token_file,
          "Principals, their token hashes and roles (JSON; see README "
          "\"Security\"); turns on authentication; re-read on SIGHUP and when "
          "changed (--reload_seconds)");
ABSL_FLAG(bool, plaintext, Defaults().plaintext,
          "Allow plaintext on a non-loopback --listen address");
ABSL_FLAG(std::string, health_listen, Defaults().health_listen,
          "A second, plaintext address serving only grpc.health.v1 (for "
          "probes that cannot present credentials); empty: none");
ABSL_FLAG(std::string, quota_file, Defaults().quota_file,
          "Per-namespace quotas (JSON; see README); re-read on SIGHUP and "
          "when changed (--reload_seconds)");
ABSL_FLAG(int64_t, namespace_max_modules,
          Defaults().namespace_quota.max_modules,
          "Most modules in one namespace (0: unlimited; --quota_file may "
          "override per namespace)");
ABSL_FLAG(int64_t, namespace_max_mib,
          Defaults().namespace_quota.max_bytes >> 20,
          "Most tensor MiB held by one namespace (0: unlimited; "
          "--quota_file may override per namespace)");
ABSL_FLAG(int, max_streams_per_identity,
          Defaults().limits.max_streams_per_identity,
          "Streams (state_dict transfers, audit watches, subscriptions) one "
          "authenticated identity may have open at once (0: unlimited)");
ABSL_FLAG(int, max_build_waiters, Defaults().limits.max_build_waiters,
          "Builds that may wait at once for another build of the same "
          "module name (0: unlimited); further ones are RESOURCE_EXHAUSTED");
ABSL_FLAG(int, audit_denied_interval_s,
          absl::ToInt64Seconds(Defaults().limits.denied_audit_interval),
          "Refused calls are audited once per (peer address, identity, rpc, "
          "module, error) and interval, the rest of the interval's as one "
          "record with their count; a subscriber's stray answers (late, "
          "duplicate, unknown) 8 per subscriber and interval, then counted "
          "the same way; 0: one record each");
ABSL_FLAG(bool, fallback_to_cpu, Defaults().fallback_to_cpu,
          "On start, restore modules saved on a device this server does not "
          "have (e.g. cuda:1 on a machine without that GPU) onto cpu instead "
          "of leaving them unloaded");
ABSL_FLAG(std::string, metrics_listen, Defaults().metrics_listen,
          "Serve Prometheus metrics at http://ADDR/metrics (host:port, or a "
          "port alone for 127.0.0.1); empty: none");
ABSL_FLAG(int64_t, metrics_max_namespaces, Defaults().metrics_max_namespaces,
          "Namespaces named in the per-namespace metrics (the first N by "
          "name); the rest are summed into namespace=\"_other\", so the "
          "number of series stays bounded");
ABSL_FLAG(std::string, log_format, "text",
          "Log lines on stderr: text, or json (one object per line with "
          "time, level, message and the request's correlation id)");
ABSL_FLAG(std::string, audit_key_file, Defaults().audit_key_file,
          "The audit log's Ed25519 signing key (PEM), created with mode 0600 "
          "if absent (default: DATA_DIR/audit.key)");
ABSL_FLAG(std::string, audit_witness_keys, Defaults().audit_witness_keys_file,
          "File of witness verifier keys (one per line) whose checkpoint "
          "cosignatures AddCosignature accepts");
ABSL_FLAG(std::string, audit_origin, Defaults().audit_origin,
          "The audit log's name in its signed checkpoints");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "Comma-separated etcd endpoints (host:port): join the modelstate "
          "cluster they coordinate; empty: a server on its own");
ABSL_FLAG(std::string, etcd_ca_file, "",
          "CA bundle (PEM) that etcd's certificate must chain to: TLS to "
          "etcd; re-read with the TLS files (SIGHUP, --reload_seconds)");
ABSL_FLAG(std::string, etcd_cert_file, "",
          "Client certificate (PEM) to present to etcd; re-read with the TLS "
          "files");
ABSL_FLAG(std::string, etcd_key_file, "",
          "Its private key (PEM); re-read with the TLS files");
ABSL_FLAG(std::string, etcd_user, "", "etcd user (etcd authentication)");
ABSL_FLAG(std::string, etcd_password_file, "",
          "File holding the etcd user's password; re-read with the TLS files "
          "(a new password: a new token)");
ABSL_FLAG(std::string, replica_id, "",
          "This replica's name in the cluster (default: the host name, a "
          "StatefulSet pod's name)");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port where the other replicas reach this one (default: the "
          "address it listens on)");
ABSL_FLAG(std::string, cluster_secret_file, "",
          "File holding the secret replicas present to one another (at least "
          "16 bytes); required with --etcd_endpoints");
ABSL_FLAG(std::string, cluster_ca_file, "",
          "CA bundle (PEM) of the other replicas' TLS certificates (TLS "
          "servers); re-read with the TLS files");
ABSL_FLAG(int64_t, cluster_lease_seconds, 10,
          "The replica's etcd lease: how long after it stops renewing it is "
          "still counted live");
ABSL_FLAG(std::string, cluster_key_prefix, "/modelstate/",
          "Every etcd key of the cluster starts with this");
ABSL_FLAG(bool, shared_memory, Defaults().shared_memory,
          "Let clients on this host exchange state_dict bytes as memfds over "
          "a Unix socket instead of gRPC messages (off for cluster members)");
ABSL_FLAG(bool, shared_memory_direct, Defaults().shared_memory_direct,
          "With --shared_memory, write a GetStateDict's bytes straight into "
          "the memory of a client that offers it (one copy, not the ring's "
          "two), where the kernel allows it (process_vm_writev)");
ABSL_FLAG(std::string, shm_socket, Defaults().shm_socket,
          "The Unix socket of --shared_memory (\"\": DATA_DIR/shm.sock)");
ABSL_FLAG(absl::Duration, scrub_interval, Defaults().scrub_interval,
          "How often to read every hosted byte mapped from the data "
          "directory and check it against its CRC-32C (\"24h\", \"30m\"; "
          "0 turns the scrub off). Damage found is logged, counted in "
          "modelstate_damaged_storages, and never served");
ABSL_FLAG(bool, map_saved_bytes, Defaults().map_saved_bytes,
          "After each save, host the saved tensor bytes from the data files "
          "(mapped, as a restart does) instead of process memory, so that "
          "memory bounds only the module being changed, not all hosted");
ABSL_FLAG(int, emulated_cuda_devices, 0,
          "TESTING ONLY: stand in N host-memory devices for cuda:0..N-1 "
          "(replacing real GPUs), so that device handling is tested without "
          "a GPU");

namespace {

using modelstate::internal::LogLine;
using modelstate::server::Server;

// Exit codes: a configuration refused before anything starts, and a start
// or run that failed.
constexpr int kBadConfig = 2;
constexpr int kFailed = 1;

// One flag's value against its allowed range: "--chunk_kib=0: must be
// between 1 and 16384 (KiB)".
absl::Status InRange(absl::string_view flag, int64_t value, int64_t low,
                     int64_t high, absl::string_view unit) {
  if (value >= low && value <= high) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": must be between ", low, " and ",
                   high, unit.empty() ? "" : absl::StrCat(" (", unit, ")")));
}

// Every numeric flag in range and the limits consistent with each other,
// before anything starts: a typo must not become a server that fails later.
absl::Status CheckLimitFlags() {
  // gRPC's message limit is an int of bytes.
  constexpr int64_t kMaxMessageMib = (int64_t{1} << 31) / (1 << 20) - 1;
  const int64_t max_message_mib = absl::GetFlag(FLAGS_max_message_mib);
  MODELSTATE_RETURN_IF_ERROR(
      InRange("max_message_mib", max_message_mib, 2, kMaxMessageMib, "MiB"));
  // A chunk and its framing (up to 1 MiB of headroom) fit in one message.
  const int64_t max_chunk_kib = absl::GetFlag(FLAGS_max_chunk_kib);
  MODELSTATE_RETURN_IF_ERROR(InRange("max_chunk_kib", max_chunk_kib, 1,
                                     (max_message_mib - 1) << 10,
                                     "KiB, to fit in --max_message_mib "
                                     "with room for framing"));
  MODELSTATE_RETURN_IF_ERROR(
      InRange("chunk_kib", absl::GetFlag(FLAGS_chunk_kib), 1, max_chunk_kib,
              "KiB, at most --max_chunk_kib"));
  constexpr int64_t kMaxMib = int64_t{1} << 43;  // bytes fit in uint64
  MODELSTATE_RETURN_IF_ERROR(InRange("max_tensor_mib",
                                     absl::GetFlag(FLAGS_max_tensor_mib), 1,
                                     kMaxMib, "MiB"));
  MODELSTATE_RETURN_IF_ERROR(InRange("max_module_mib",
                                     absl::GetFlag(FLAGS_max_module_mib), 1,
                                     kMaxMib, "MiB"));
  MODELSTATE_RETURN_IF_ERROR(InRange(
      "max_spec_depth", absl::GetFlag(FLAGS_max_spec_depth), 1, 100000, ""));
  MODELSTATE_RETURN_IF_ERROR(
      InRange("metrics_max_namespaces",
              absl::GetFlag(FLAGS_metrics_max_namespaces), 1, 100000, ""));
  MODELSTATE_RETURN_IF_ERROR(InRange("max_entries",
                                     absl::GetFlag(FLAGS_max_entries), 1,
                                     std::numeric_limits<int64_t>::max(), ""));
  MODELSTATE_RETURN_IF_ERROR(InRange("worker_threads",
                                     absl::GetFlag(FLAGS_worker_threads), 0,
                                     100000, "0: gRPC's default"));
  // A request larger than the quota is cancelled even alone, and one of the
  // largest size must fit beside others being received.
  const int64_t max_transport_mib = absl::GetFlag(FLAGS_max_transport_mib);
  if (max_transport_mib != 0) {
    MODELSTATE_RETURN_IF_ERROR(
        InRange("max_transport_mib", max_transport_mib, 2 * max_message_mib,
                std::numeric_limits<int>::max(),
                "MiB, at least twice --max_message_mib; 0: no limit"));
  }
  MODELSTATE_RETURN_IF_ERROR(InRange("max_queued_events",
                                     absl::GetFlag(FLAGS_max_queued_events), 1,
                                     std::numeric_limits<int>::max(), ""));
  MODELSTATE_RETURN_IF_ERROR(InRange(
      "max_subscriber_queue_mib", absl::GetFlag(FLAGS_max_subscriber_queue_mib),
      1, kMaxMib, "MiB"));
  MODELSTATE_RETURN_IF_ERROR(
      InRange("shutdown_grace_seconds",
              absl::GetFlag(FLAGS_shutdown_grace_seconds), 0, 86400, "s"));
  // The window is a KiB count shifted into an int of bytes.
  MODELSTATE_RETURN_IF_ERROR(InRange("stream_window_kib",
                                     absl::GetFlag(FLAGS_stream_window_kib), 0,
                                     (1 << 21) - 1, "KiB, 0: adaptive"));
  MODELSTATE_RETURN_IF_ERROR(InRange(
      "max_streams_per_identity", absl::GetFlag(FLAGS_max_streams_per_identity),
      0, std::numeric_limits<int>::max(), "0: unlimited"));
  MODELSTATE_RETURN_IF_ERROR(
      InRange("max_build_waiters", absl::GetFlag(FLAGS_max_build_waiters), 0,
              std::numeric_limits<int>::max(), "0: unlimited"));
  MODELSTATE_RETURN_IF_ERROR(InRange(
      "audit_denied_interval_s", absl::GetFlag(FLAGS_audit_denied_interval_s),
      0, 86400, "s, 0: a record per refused call"));
  // Signed, so that -1 gets this message rather than Abseil's.
  MODELSTATE_RETURN_IF_ERROR(InRange(
      "namespace_max_modules", absl::GetFlag(FLAGS_namespace_max_modules), 0,
      std::numeric_limits<int64_t>::max(), "0: unlimited"));
  MODELSTATE_RETURN_IF_ERROR(InRange("namespace_max_mib",
                                     absl::GetFlag(FLAGS_namespace_max_mib), 0,
                                     kMaxMib, "MiB, 0: unlimited"));
  // Checked here, not when the server joins: after it listens.
  if (!absl::GetFlag(FLAGS_etcd_endpoints).empty()) {
    MODELSTATE_RETURN_IF_ERROR(
        InRange("cluster_lease_seconds",
                absl::GetFlag(FLAGS_cluster_lease_seconds), 2, 86400, "s"));
  }
  return absl::OkStatus();
}

// The limit flags, in range (CheckLimitFlags), in bytes.
modelstate::Limits LimitsFromFlags() {
  modelstate::Limits limits;
  limits.max_message_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_message_mib)) << 20;
  limits.default_chunk_bytes =
      static_cast<uint32_t>(absl::GetFlag(FLAGS_chunk_kib)) << 10;
  limits.max_chunk_bytes =
      static_cast<uint32_t>(absl::GetFlag(FLAGS_max_chunk_kib)) << 10;
  limits.max_tensor_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_tensor_mib)) << 20;
  limits.max_module_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_module_mib)) << 20;
  limits.max_spec_depth = absl::GetFlag(FLAGS_max_spec_depth);
  limits.max_entries = absl::GetFlag(FLAGS_max_entries);
  limits.max_queued_events =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_queued_events));
  limits.max_subscriber_queue_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_subscriber_queue_mib))
      << 20;
  limits.max_streams_per_identity =
      absl::GetFlag(FLAGS_max_streams_per_identity);
  limits.max_build_waiters = absl::GetFlag(FLAGS_max_build_waiters);
  limits.denied_audit_interval =
      absl::Seconds(absl::GetFlag(FLAGS_audit_denied_interval_s));
  return limits;
}

// The --etcd_* and cluster flags into `config`.
absl::Status ClusterFromFlags(modelstate::server::ServerConfig& config) {
  const std::string endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
  if (endpoints.empty()) return absl::OkStatus();
  modelstate::ClusterOptions& cluster = config.cluster;
  cluster.etcd.endpoints = absl::StrSplit(endpoints, ',', absl::SkipEmpty());
  // Read and checked as the server's TLS files are (a key others may
  // write refused, a key not the certificate's refused), and re-read with
  // them at each reload (server/server_tls.h's EtcdTls).
  MODELSTATE_ASSIGN_OR_RETURN(config.etcd_files,
                              modelstate::server::EtcdTls::Create(
                                  {absl::GetFlag(FLAGS_etcd_ca_file),
                                   absl::GetFlag(FLAGS_etcd_cert_file),
                                   absl::GetFlag(FLAGS_etcd_key_file),
                                   absl::GetFlag(FLAGS_etcd_password_file)}));
  for (const std::string& warning : config.etcd_files->Warnings()) {
    LogLine(warning);
  }
  const modelstate::EtcdCredentials etcd = config.etcd_files->Credentials();
  cluster.etcd.ca_pem = etcd.ca_pem;
  cluster.etcd.cert_pem = etcd.cert_pem;
  cluster.etcd.key_pem = etcd.key_pem;
  cluster.etcd.user = absl::GetFlag(FLAGS_etcd_user);
  cluster.etcd.password = etcd.password;
  cluster.replica_id = absl::GetFlag(FLAGS_replica_id);
  if (cluster.replica_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    cluster.replica_id = host;
  }
  cluster.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  cluster.lease_seconds = absl::GetFlag(FLAGS_cluster_lease_seconds);
  cluster.key_prefix = absl::GetFlag(FLAGS_cluster_key_prefix);
  config.cluster_secret_file = absl::GetFlag(FLAGS_cluster_secret_file);
  config.cluster_ca_file = absl::GetFlag(FLAGS_cluster_ca_file);
  return absl::OkStatus();
}

absl::StatusOr<ServerConfig> ConfigFromFlags() {
  MODELSTATE_RETURN_IF_ERROR(CheckLimitFlags());
  ServerConfig config;
  config.listen = absl::GetFlag(FLAGS_listen);
  config.data_dir = absl::GetFlag(FLAGS_data_dir);
  config.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  config.shm_socket = absl::GetFlag(FLAGS_shm_socket);
  config.shared_memory_direct = absl::GetFlag(FLAGS_shared_memory_direct);
  config.scrub_interval = absl::GetFlag(FLAGS_scrub_interval);
  config.map_saved_bytes = absl::GetFlag(FLAGS_map_saved_bytes);
  config.stream_window_kib = absl::GetFlag(FLAGS_stream_window_kib);
  config.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  config.max_transport_mib = absl::GetFlag(FLAGS_max_transport_mib);
  config.shutdown_grace_seconds = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  config.limits = LimitsFromFlags();
  config.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  config.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  config.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  config.reload_interval = absl::Seconds(absl::GetFlag(FLAGS_reload_seconds));
  config.token_file = absl::GetFlag(FLAGS_token_file);
  config.plaintext = absl::GetFlag(FLAGS_plaintext);
  config.health_listen = absl::GetFlag(FLAGS_health_listen);
  config.quota_file = absl::GetFlag(FLAGS_quota_file);
  config.namespace_quota.max_modules =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_namespace_max_modules));
  config.namespace_quota.max_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_namespace_max_mib)) << 20;
  config.fallback_to_cpu = absl::GetFlag(FLAGS_fallback_to_cpu);
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  config.metrics_max_namespaces =
      static_cast<size_t>(absl::GetFlag(FLAGS_metrics_max_namespaces));
  config.audit_key_file = absl::GetFlag(FLAGS_audit_key_file);
  config.audit_witness_keys_file = absl::GetFlag(FLAGS_audit_witness_keys);
  config.audit_origin = absl::GetFlag(FLAGS_audit_origin);
  MODELSTATE_RETURN_IF_ERROR(ClusterFromFlags(config));
  MODELSTATE_RETURN_IF_ERROR(modelstate::server::CheckServerConfig(config));
  return config;
}

// --log_format: OK, or the exit code.
int SetLogFormat() {
  const std::string format = absl::GetFlag(FLAGS_log_format);
  if (format == "json") {
    modelstate::SetLogFormat(modelstate::LogFormat::kJson);
  } else if (format != "text") {
    LogLine(
        absl::StrCat("--log_format must be text or json, got '", format, "'"));
    return kBadConfig;
  }
  return 0;
}

// --emulated_cuda_devices: OK, or the exit code.
int InstallEmulatedDevices() {
  const int emulated = absl::GetFlag(FLAGS_emulated_cuda_devices);
  if (emulated == 0) return 0;
  if (emulated < 0 || emulated > 16) {
    LogLine(absl::StrCat("--emulated_cuda_devices must be in [0, 16], got ",
                         emulated));
    return kBadConfig;
  }
  modelstate::InstallEmulatedCudaDevices({.count = emulated});
  LogLine(
      absl::StrCat("TESTING ONLY: cuda:0..cuda:", emulated - 1,
                   " are emulated in host memory (--emulated_cuda_devices)"));
  return 0;
}

// Where tests and scripts find the port a ":0" address got.
void WriteReadyFile(const std::string& address) {
  const std::string ready = absl::GetFlag(FLAGS_ready_file);
  if (ready.empty()) return;
  const std::string temp = ready + ".tmp";
  std::ofstream(temp) << address << "\n";
  std::rename(temp.c_str(), ready.c_str());
}

// SIGHUP reloads; SIGINT or SIGTERM shuts down. Returns once stopped.
// How often free heap memory goes back to the system (see main's mallopt).
constexpr absl::Duration kTrimInterval = absl::Seconds(2);

void ServeUntilSignalled(Server& server) {
  absl::Notification stopped;
  std::thread trimmer([&stopped] {
    while (!stopped.WaitForNotificationWithTimeout(kTrimInterval)) {
      malloc_trim(0);
    }
  });
  std::thread waiter([&server] {
    int sig = 0;
    while ((sig = modelstate::WaitForSignal()) == SIGHUP) {
      server.Reload("SIGHUP");
    }
    LogLine(absl::StrCat("signal ", sig, ": shutting down"));
    server.Shutdown();
  });
  server.Wait();
  waiter.join();
  stopped.Notify();
  trimmer.join();
  LogLine("stopped");
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Hosts PyTorch-style Module trees over gRPC.\n"
      "Usage: modelstate-server [--listen=127.0.0.1:50051] "
      "[--data_dir=./data]");
  // --help lists this file's flags (Abseil's default looks for a file
  // named after the program).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "server_main");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  if (int code = SetLogFormat(); code != 0) return code;
  if (int code = InstallEmulatedDevices(); code != 0) return code;
  // The signals are read from a pipe by ServeUntilSignalled's thread,
  // whichever thread received them.
  if (absl::Status s = modelstate::InstallSignalPipe({SIGINT, SIGTERM, SIGHUP});
      !s.ok()) {
    LogLine(s.ToString());
    return kFailed;
  }
  // A file size limit (ulimit -f) must fail the one write that exceeds it,
  // with an error the caller gets (the audit log then refuses changes), not
  // kill the server.
  signal(SIGXFSZ, SIG_IGN);
  // The data directory holds model weights and the audit log: files are
  // created 0600 and directories 0700, whatever the caller's umask.
  umask(077);
  // Memory must go back to the system once the clients that caused it are
  // gone, and a stream must not pay a page fault per 4 KiB of every message:
  // mapping each 1 MiB message buffer afresh (as an M_MMAP_THRESHOLD of
  // 1 MiB did) made GetStateDict 20 times slower than raw gRPC on a
  // paravirtualised host, where a fault costs tens of microseconds. So
  // message buffers come from malloc's heap, whose free memory stays there
  // while streams reuse it (no trimming on each free) and goes back every
  // kTrimInterval (malloc_trim in ServeUntilSignalled). Blocks of 32 MiB
  // (the largest threshold glibc accepts) and more are still mapped and
  // unmapped on their own. One arena: malloc_trim returns the free top of
  // the main arena only, so memory freed in the per-thread arenas glibc
  // makes by default (8 per core) stayed resident: 60 MiB of them after the
  // soak test's clients left, 15 MiB with one arena. The transfer and
  // 32-client benchmarks measured the same either way (tcache keeps small
  // allocations off the arena lock).
  if (!modelstate::ReuseMessageMemory()) {
    LogLine("warning: malloc refused the mmap, trim and arena settings");
  }
  absl::StatusOr<ServerConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    LogLine(std::string(config.status().message()));
    return kBadConfig;
  }
  // Every server built from here on offers reflection (grpcurl, ...).
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(*config);
  if (!server.ok()) {
    LogLine(std::string(server.status().message()));
    return kFailed;
  }
  WriteReadyFile((*server)->address());
  ServeUntilSignalled(**server);
  return 0;
}
