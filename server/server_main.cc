// modelstate-server: hosts Module trees over gRPC.
//
//   modelstate-server --listen=127.0.0.1:50051 --data_dir=./data
//
// SIGTERM / SIGINT shut it down cleanly: new calls are refused, running
// calls get --shutdown_grace_seconds to finish, then are cancelled. SIGHUP
// re-reads --token_file and --quota_file (a bad file keeps the old one).
//
// Without --token_file there is no authentication: every caller is an admin,
// so the server then listens on loopback addresses only. Plaintext on a
// non-loopback address needs --plaintext; otherwise --tls_cert_file and
// --tls_key_file (and --tls_client_ca_file for mutual TLS).
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/signal_pipe.h"
#include "base/status_macros.h"
#include "core/emulated_device.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "server/model_state_service.h"
#include "service/audit_log.h"
#include "service/authenticator.h"
#include "service/limits.h"
#include "service/model_service.h"
#include "service/model_store.h"
#include "service/module_repository.h"
#include "service/quota.h"
#include "service/subscriber_hub.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "Address to listen on (host:port; port 0 picks a free one)");
ABSL_FLAG(std::string, data_dir, "./data",
          "Directory for durable state and the audit log");
ABSL_FLAG(int, stream_window_kib, 8192,
          "HTTP/2 receive window per stream, in KiB: how far a client may "
          "send ahead of a load being written to disk, which bounds the "
          "server's buffering (0: gRPC's adaptive window)");
ABSL_FLAG(std::string, ready_file, "",
          "Once serving, write the actual listen address to this file");
ABSL_FLAG(int, max_message_mib, 64,
          "Largest gRPC message accepted or sent, in MiB");
ABSL_FLAG(int, chunk_kib, 1024, "Default GetStateDict chunk size, in KiB");
ABSL_FLAG(int, max_chunk_kib, 16384, "Largest GetStateDict chunk size, in KiB");
ABSL_FLAG(int64_t, max_tensor_mib, 16384, "Largest single tensor, in MiB");
ABSL_FLAG(int64_t, max_module_mib, 65536,
          "Largest module (build or loaded state_dict), in MiB");
ABSL_FLAG(int, max_spec_depth, 64, "Deepest module nesting in a spec");
ABSL_FLAG(int64_t, max_entries, 1000000,
          "Most parameters, buffers and submodules in one module");
ABSL_FLAG(int, worker_threads, 0,
          "Most threads serving calls (0: gRPC's default)");
ABSL_FLAG(int, max_queued_events, 10000,
          "Events waiting for one subscriber before it is disconnected");
ABSL_FLAG(int, shutdown_grace_seconds, 10,
          "How long running calls may take to finish at shutdown");
ABSL_FLAG(std::string, tls_cert_file, "",
          "Server certificate chain (PEM); with --tls_key_file turns on TLS");
ABSL_FLAG(std::string, tls_key_file, "", "Server private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "CA bundle (PEM) that client certificates must chain to: mutual "
          "TLS; a certificate's CN names a principal of --token_file");
ABSL_FLAG(std::string, token_file, "",
          "Principals, their token hashes and roles (JSON; see README "
          "\"Deploy\"); turns on authentication; re-read on SIGHUP");
ABSL_FLAG(bool, plaintext, false,
          "Allow plaintext on a non-loopback --listen address");
ABSL_FLAG(std::string, health_listen, "",
          "A second, plaintext address serving only grpc.health.v1 (for "
          "probes that cannot present credentials); empty: none");
ABSL_FLAG(std::string, quota_file, "",
          "Per-namespace quotas (JSON; see README); re-read on SIGHUP");
ABSL_FLAG(uint64_t, namespace_max_modules, 0,
          "Most modules in one namespace (0: unlimited; --quota_file may "
          "override per namespace)");
ABSL_FLAG(uint64_t, namespace_max_mib, 0,
          "Most tensor MiB held by one namespace (0: unlimited; "
          "--quota_file may override per namespace)");
ABSL_FLAG(int, max_streams_per_identity, 16,
          "Streams (state_dict transfers, audit watches, subscriptions) one "
          "authenticated identity may have open at once (0: unlimited)");
ABSL_FLAG(bool, fallback_to_cpu, false,
          "On start, restore modules saved on a device this server does not "
          "have (e.g. cuda:1 on a machine without that GPU) onto cpu instead "
          "of leaving them unloaded");
ABSL_FLAG(int, emulated_cuda_devices, 0,
          "TESTING ONLY: stand in N host-memory devices for cuda:0..N-1 "
          "(replacing real GPUs), so that device handling is tested without "
          "a GPU");

namespace {

using modelstate::internal::LogLine;

// 127.0.0.0/8, ::1 and localhost: reachable from this machine only.
bool IsLoopback(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  return host == "localhost" || host == "[::1]" || host == "::1" ||
         host.rfind("127.", 0) == 0;
}

absl::StatusOr<std::string> ReadPem(const std::string& flag,
                                    const std::string& path) {
  absl::StatusOr<std::string> text = modelstate::ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", text.status().message()));
  }
  return text;
}

// TLS when --tls_cert_file is given, requiring verified client
// certificates when --tls_client_ca_file is; plaintext otherwise.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials() {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert_file);
  const std::string key = absl::GetFlag(FLAGS_tls_key_file);
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca_file);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file go together");
  }
  if (cert.empty()) {
    if (!client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca_file needs --tls_cert_file and --tls_key_file");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options(
      client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  MODELSTATE_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem("tls_cert_file", cert));
  MODELSTATE_ASSIGN_OR_RETURN(pair.private_key, ReadPem("tls_key_file", key));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!client_ca.empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(options.pem_root_certs,
                                ReadPem("tls_client_ca_file", client_ca));
  }
  return grpc::SslServerCredentials(options);
}

modelstate::NamespaceQuota DefaultQuota() {
  modelstate::NamespaceQuota quota;
  quota.max_modules = absl::GetFlag(FLAGS_namespace_max_modules);
  quota.max_bytes = absl::GetFlag(FLAGS_namespace_max_mib) << 20;
  return quota;
}

absl::StatusOr<modelstate::QuotaPolicy> LoadQuotas() {
  const std::string path = absl::GetFlag(FLAGS_quota_file);
  if (path.empty()) {
    modelstate::QuotaPolicy policy;
    policy.defaults = DefaultQuota();
    return policy;
  }
  return modelstate::QuotaPolicy::ReadFile(path, DefaultQuota());
}

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
  MODELSTATE_RETURN_IF_ERROR(InRange("max_entries",
                                     absl::GetFlag(FLAGS_max_entries), 1,
                                     std::numeric_limits<int64_t>::max(), ""));
  MODELSTATE_RETURN_IF_ERROR(InRange("worker_threads",
                                     absl::GetFlag(FLAGS_worker_threads), 0,
                                     100000, "0: gRPC's default"));
  MODELSTATE_RETURN_IF_ERROR(InRange("max_queued_events",
                                     absl::GetFlag(FLAGS_max_queued_events), 1,
                                     std::numeric_limits<int>::max(), ""));
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
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Hosts PyTorch-style Module trees over gRPC.\n"
      "Usage: modelstate-server [--listen=127.0.0.1:50051] "
      "[--data_dir=./data]");
  absl::ParseCommandLine(argc, argv);
  if (int emulated = absl::GetFlag(FLAGS_emulated_cuda_devices);
      emulated != 0) {
    if (emulated < 0 || emulated > 16) {
      LogLine(absl::StrCat("--emulated_cuda_devices must be in [0, 16], got ",
                           emulated));
      return 2;
    }
    modelstate::InstallEmulatedCudaDevices({.count = emulated});
    LogLine(
        absl::StrCat("TESTING ONLY: cuda:0..cuda:", emulated - 1,
                     " are emulated in host memory (--emulated_cuda_devices)"));
  }
  // SIGINT and SIGTERM shut down, SIGHUP reloads; the waiter thread below
  // reads them from a pipe, whichever thread received them.
  if (absl::Status s = modelstate::InstallSignalPipe({SIGINT, SIGTERM, SIGHUP});
      !s.ok()) {
    LogLine(s.ToString());
    return 1;
  }
  // A file size limit (ulimit -f) must fail the one write that exceeds it,
  // with an error the caller gets (the audit log then refuses changes), not
  // kill the server.
  signal(SIGXFSZ, SIG_IGN);

  if (absl::Status limits = CheckLimitFlags(); !limits.ok()) {
    LogLine(std::string(limits.message()));
    return 2;
  }
  // Who may connect, and how, before anything else: a misconfigured
  // server must not start at all.
  const std::string listen = absl::GetFlag(FLAGS_listen);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentials();
  if (!credentials.ok()) {
    LogLine(std::string(credentials.status().message()));
    return 2;
  }
  const bool tls = !absl::GetFlag(FLAGS_tls_cert_file).empty();
  const bool mtls = !absl::GetFlag(FLAGS_tls_client_ca_file).empty();
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (mtls && token_file.empty()) {
    LogLine(
        "--tls_client_ca_file needs --token_file: its principals give "
        "certificate identities (CN) their roles");
    return 2;
  }
  if (!IsLoopback(listen)) {
    if (token_file.empty()) {
      LogLine(absl::StrCat(
          "refusing to listen on ", listen,
          " without authentication: pass --token_file (and TLS), or listen "
          "on a loopback address"));
      return 2;
    }
    if (!tls && !absl::GetFlag(FLAGS_plaintext)) {
      LogLine(absl::StrCat("refusing plaintext on ", listen,
                           ": pass --tls_cert_file and --tls_key_file, or "
                           "--plaintext to allow it"));
      return 2;
    }
  }
  absl::StatusOr<std::unique_ptr<modelstate::Authenticator>> auth =
      modelstate::Authenticator::Create(token_file, mtls);
  if (!auth.ok()) {
    LogLine(absl::StrCat("--token_file: ", auth.status().message()));
    return 2;
  }
  absl::StatusOr<modelstate::QuotaPolicy> quotas = LoadQuotas();
  if (!quotas.ok()) {
    LogLine(absl::StrCat("--quota_file: ", quotas.status().message()));
    return 2;
  }

  modelstate::ModelServiceOptions options;
  modelstate::Limits& limits = options.limits;
  limits.max_streams_per_identity =
      absl::GetFlag(FLAGS_max_streams_per_identity);
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
  // In range (CheckLimitFlags): fits an int.
  const int max_message = absl::GetFlag(FLAGS_max_message_mib) << 20;
  limits.max_queued_events =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_queued_events));
  limits.max_message_bytes = static_cast<uint64_t>(max_message);

  std::filesystem::path data_dir = absl::GetFlag(FLAGS_data_dir);
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) {
    LogLine(absl::StrCat("cannot create --data_dir ", data_dir.string(), ": ",
                         ec.message()));
    return 1;
  }
  // Loads stage their bytes in unlinked files here (nothing to clean up).
  options.staging_dir = (data_dir / "staging").string();
  std::filesystem::create_directories(options.staging_dir, ec);
  if (ec) {
    LogLine(absl::StrCat("cannot create ", options.staging_dir, ": ",
                         ec.message()));
    return 1;
  }
  std::string audit_path = (data_dir / "audit.log").string();
  options.audit_path = audit_path;
  absl::StatusOr<std::unique_ptr<modelstate::AuditLog>> audit =
      modelstate::AuditLog::Open(audit_path);
  if (!audit.ok()) {
    LogLine(
        absl::StrCat("cannot open the audit log: ", audit.status().ToString()));
    return 1;
  }
  if ((*audit)->recovered_torn_tail()) {
    LogLine(absl::StrCat(audit_path,
                         ": removed a torn last record left by a crash"));
  }
  modelstate::SubscriberHub hub(audit->get());
  absl::StatusOr<size_t> owned_names = hub.RestoreNameOwners();
  if (!owned_names.ok()) {
    LogLine(absl::StrCat("cannot read subscriber names from the audit log: ",
                         owned_names.status().ToString()));
    return 1;
  }
  std::string modules_dir = (data_dir / "modules").string();
  absl::StatusOr<std::unique_ptr<modelstate::ModuleRepository>> repository =
      modelstate::ModuleRepository::Open(modules_dir);
  if (!repository.ok()) {
    LogLine(absl::StrCat("cannot open the module directory: ",
                         repository.status().ToString()));
    return 1;
  }
  modelstate::ModelStore store;
  store.set_decider(&hub);
  store.set_audit_log(audit->get());
  store.set_repository(repository->get());
  store.set_quotas(*quotas);
  // Everything saved comes back before the first request is served.
  absl::Time restore_start = absl::Now();
  const bool fallback_to_cpu = absl::GetFlag(FLAGS_fallback_to_cpu);
  modelstate::ModelStore::RestoreReport restored =
      store.Restore(fallback_to_cpu);
  for (const absl::Status& error : restored.errors) {
    LogLine(absl::StrCat("not restored: ", error.ToString()));
    if (absl::IsFailedPrecondition(error) && !fallback_to_cpu) {
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
  modelstate::ModelService model_service(&store, &hub, audit->get(),
                                         auth->get(), options);
  modelstate::server::ModelStateServiceImpl service(&model_service);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // A second server on the same port must fail, not share connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  if (int window = absl::GetFlag(FLAGS_stream_window_kib); window > 0) {
    // A fixed window instead of gRPC's adaptive one, which on loopback
    // grows until a slow consumer has tens of MiB queued in the server.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               window << 10);
  }
  if (int threads = absl::GetFlag(FLAGS_worker_threads); threads > 0) {
    grpc::ResourceQuota quota("modelstate");
    quota.SetMaxThreads(threads);
    builder.SetResourceQuota(quota);
  }
  int port = 0;
  builder.AddListeningPort(listen, *credentials, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LogLine(absl::StrCat("cannot listen on ", listen));
    return 1;
  }
  std::string host = listen.substr(0, listen.rfind(':'));
  std::string address = absl::StrCat(host, ":", port);
  LogLine(absl::StrCat(
      "modelstate-server listening on ", address,
      tls ? (mtls ? " (mutual TLS)" : " (TLS)") : " (plaintext)",
      (*auth)->enabled()
          ? absl::StrCat("; ", token_file, " authenticates callers")
          : "; no authentication (no --token_file): loopback only, every "
            "caller is an admin"));
  // Probes that cannot present credentials get health and nothing else.
  std::unique_ptr<grpc::Server> health_server;
  if (std::string health = absl::GetFlag(FLAGS_health_listen);
      !health.empty()) {
    grpc::ServerBuilder health_builder;
    int health_port = 0;
    health_builder.AddListeningPort(health, grpc::InsecureServerCredentials(),
                                    &health_port);
    health_server = health_builder.BuildAndStart();
    if (health_server == nullptr || health_port == 0) {
      LogLine(absl::StrCat("cannot listen on --health_listen ", health));
      server->Shutdown();
      return 1;
    }
    LogLine(absl::StrCat("health checks (only) on ", health));
  }
  if (std::string ready = absl::GetFlag(FLAGS_ready_file); !ready.empty()) {
    std::string temp = ready + ".tmp";
    std::ofstream(temp) << address << "\n";
    std::rename(temp.c_str(), ready.c_str());
  }

  std::thread waiter([&] {
    int sig = 0;
    while ((sig = modelstate::WaitForSignal()) == SIGHUP) {
      if ((*auth)->enabled()) {
        absl::StatusOr<size_t> loaded = (*auth)->Reload();
        LogLine(loaded.ok()
                    ? absl::StrCat("SIGHUP: ", *loaded, " principals from ",
                                   token_file)
                    : absl::StrCat("SIGHUP: kept the principals in force: ",
                                   loaded.status().message()));
      }
      absl::StatusOr<modelstate::QuotaPolicy> fresh = LoadQuotas();
      if (fresh.ok()) {
        store.set_quotas(*std::move(fresh));
      } else {
        LogLine(absl::StrCat("SIGHUP: kept the quotas in force: ",
                             fresh.status().message()));
      }
    }
    LogLine(absl::StrCat("signal ", sig, ": shutting down"));
    if (health_server != nullptr) {
      health_server->GetHealthCheckService()->Shutdown();
    }
    server->GetHealthCheckService()->Shutdown();
    hub.CloseAll(absl::UnavailableError("server shutting down"));
    server->Shutdown(absl::ToChronoTime(
        absl::Now() +
        absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds))));
  });
  server->Wait();
  waiter.join();
  if (health_server != nullptr) health_server->Shutdown();
  LogLine("stopped");
  return 0;
}
