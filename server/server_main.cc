// modelstate-server: hosts Module trees over gRPC.
//
//   modelstate-server --listen=127.0.0.1:50051 --data_dir=./data
//
// SIGTERM / SIGINT shut it down cleanly: new calls are refused, running
// calls get --shutdown_grace_seconds to finish, then are cancelled.
#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
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
#include "core/audit_log.h"
#include "core/log.h"
#include "core/model_store.h"
#include "core/module_repository.h"
#include "core/subscriber_hub.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "server/model_state_service.h"

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

namespace {

using modelstate::internal::LogLine;

// Blocks SIGINT and SIGTERM in this thread and every thread started later,
// so that only the waiter thread receives them.
sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Hosts PyTorch-style Module trees over gRPC.\n"
      "Usage: modelstate-server [--listen=127.0.0.1:50051] "
      "[--data_dir=./data]");
  absl::ParseCommandLine(argc, argv);
  sigset_t signals = BlockShutdownSignals();

  modelstate::server::ServiceOptions options;
  options.default_chunk_bytes =
      static_cast<uint32_t>(absl::GetFlag(FLAGS_chunk_kib)) << 10;
  options.max_chunk_bytes =
      static_cast<uint32_t>(absl::GetFlag(FLAGS_max_chunk_kib)) << 10;
  options.max_tensor_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_tensor_mib)) << 20;
  options.max_module_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_module_mib)) << 20;
  options.max_spec_depth = absl::GetFlag(FLAGS_max_spec_depth);
  options.max_entries = absl::GetFlag(FLAGS_max_entries);
  int max_message = absl::GetFlag(FLAGS_max_message_mib) << 20;
  if (options.max_chunk_bytes + (1 << 20) >
      static_cast<uint32_t>(max_message)) {
    LogLine(
        "--max_chunk_kib must leave room for framing within --max_message_mib");
    return 2;
  }

  options.max_queued_events =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_queued_events));

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
  // Everything saved comes back before the first request is served.
  absl::Time restore_start = absl::Now();
  modelstate::ModelStore::RestoreReport restored = store.Restore();
  for (const absl::Status& error : restored.errors) {
    LogLine(absl::StrCat("not restored: ", error.ToString()));
  }
  LogLine(
      absl::StrFormat("restored %d modules (%d bytes) from %s in %.3f s%s",
                      restored.modules, restored.bytes, modules_dir,
                      absl::ToDoubleSeconds(absl::Now() - restore_start),
                      restored.recovered == 0
                          ? ""
                          : absl::StrCat("; recorded ", restored.recovered,
                                         " changes the audit log had missed")));
  modelstate::server::ModelStateServiceImpl service(&store, &hub, audit->get(),
                                                    audit_path, options);

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
  std::string listen = absl::GetFlag(FLAGS_listen);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LogLine(absl::StrCat("cannot listen on ", listen));
    return 1;
  }
  std::string host = listen.substr(0, listen.rfind(':'));
  std::string address = absl::StrCat(host, ":", port);
  LogLine(absl::StrCat("modelstate-server listening on ", address));
  if (std::string ready = absl::GetFlag(FLAGS_ready_file); !ready.empty()) {
    std::string temp = ready + ".tmp";
    std::ofstream(temp) << address << "\n";
    std::rename(temp.c_str(), ready.c_str());
  }

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    LogLine(absl::StrCat("signal ", sig, ": shutting down"));
    server->GetHealthCheckService()->Shutdown();
    hub.CloseAll(absl::UnavailableError("server shutting down"));
    server->Shutdown(absl::ToChronoTime(
        absl::Now() +
        absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds))));
  });
  server->Wait();
  waiter.join();
  LogLine("stopped");
  return 0;
}
