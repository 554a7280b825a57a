// File: metrics.h
// The server's Prometheus metrics (README "Operations" lists them): a gRPC
// server interceptor counts every call by method and status code, times it,
// counts the bytes of its messages and the streams open; the subscriber hub
// and the audit log observe hook round trips, hook timeouts and audit
// append/sync latency into families made here; hosted modules and bytes,
// quotas, usage by device and subscriber queue depths are read from the
// store and the hub when scraped (at most a bounded number of namespaces
// by name; the rest as one), and the queued bytes of each Subscribe stream
// from the stream; process_* gauges from /proc/self. MetricsHttpServer serves
// them at /metrics (cpp-httplib), apart from the gRPC port. The interceptor
// also gives each call its correlation id (the client's "x-request-id", else a
// generated one), sends it back as "x-request-id" initial metadata, and logs
// each call that fails (base/log.h) with it.
//
// Example:
//   ServerMetrics metrics;
//   hub.set_metrics(&metrics.hook_round_trip(), &metrics.hook_timeouts());
//   audit.set_metrics(&metrics.audit_append(), &metrics.audit_sync());
//   metrics.Observe(&store, &hub);
//   builder.experimental().SetInterceptorCreators(
//       metrics.InterceptorCreators());
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::unique_ptr<MetricsHttpServer> http,
//       MetricsHttpServer::Start("127.0.0.1:9464", &metrics.registry()));
//   // curl http://127.0.0.1:9464/metrics
#ifndef MODELSTATE_SERVER_METRICS_H_
#define MODELSTATE_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/metrics.h"
#include "grpcpp/support/server_interceptor.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace modelstate {
class ModelStore;
class SubscriberHub;
}  // namespace modelstate

namespace modelstate::server {

// The metrics of one RPC method, looked up once per call without a lock.
struct MethodMetrics {
  std::string label;  // "BuildModule"; "grpc.health.v1.Health/Check"
  // Its messages are generated protobuf messages (every service the server
  // runs: this one, health, reflection), so received bytes can be counted
  // from the parsed message.
  bool protobuf = false;
  metrics::Histogram* latency = nullptr;
  metrics::Counter* received_bytes = nullptr;
  metrics::Counter* sent_bytes = nullptr;
  metrics::Gauge* open_streams = nullptr;
  // By grpc::StatusCode, made on first use.
  std::array<std::atomic<metrics::Counter*>, 17> by_code{};
};

// Thread-safe.
class ServerMetrics {
 public:
  ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  metrics::Registry& registry() { return registry_; }

  // Gauges read at scrape time from `store` and `hub` (not owned; they
  // must outlive every scrape). Namespaces past the first
  // `max_namespaces` (in name order) are summed into namespace="_other".
  // Call once.
  void Observe(const ModelStore* store, const SubscriberHub* hub,
               size_t max_namespaces = 100);
  // A Subscribe stream's queued bytes, kept up to date by the stream while
  // it holds the result, summed by subscriber name at scrape time
  // (modelstate_subscriber_queue_bytes).
  std::shared_ptr<std::atomic<uint64_t>> TrackQueue(
      const std::string& subscriber);

  // For SubscriberHub::set_metrics and AuditLog::set_metrics.
  metrics::Family<metrics::Histogram>& hook_round_trip() {
    return *hook_round_trip_;
  }
  metrics::Family<metrics::Counter>& hook_timeouts() { return *hook_timeouts_; }
  metrics::Family<metrics::Counter>& hook_stray_answers() {
    return *hook_stray_answers_;
  }
  // modelstate_shared_memory_bytes_total{direction="get"|"load"}.
  metrics::Counter& shared_memory_bytes(absl::string_view direction) {
    return shared_memory_bytes_->Labels({std::string(direction)});
  }
  // modelstate_scrub_passes_total and modelstate_scrub_bytes_total.
  void CountScrubPass(uint64_t bytes) {
    scrub_passes_->Increment();
    scrub_bytes_->Increment(bytes);
  }
  metrics::Histogram& audit_append() { return *audit_append_; }
  metrics::Histogram& audit_sync() { return *audit_sync_; }
  // Set by the checkpoint signer whenever the latest signed checkpoint
  // covers every record (after each signature, and each idle interval); the
  // gauge modelstate_audit_checkpoint_age_seconds is now minus this, and
  // absent until the first Set.
  metrics::Timestamp& latest_checkpoint() { return latest_checkpoint_; }

  // The interceptor, for ServerBuilder::experimental()
  // .SetInterceptorCreators (a new vector each call).
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
  InterceptorCreators();

  // The method's metrics ("/modelstate.v1.ModelStateService/BuildModule");
  // one shared entry for methods no service here declares.
  MethodMetrics& ForMethod(absl::string_view full_name);
  // Counts one call of `method` that ended with `code`.
  void CountCall(MethodMetrics& method, int code);

 private:
  void AddMethod(absl::string_view full_name, std::string label, bool protobuf);

  metrics::Registry registry_;
  metrics::Family<metrics::Counter>* rpcs_;
  metrics::Family<metrics::Histogram>* rpc_latency_;
  metrics::Family<metrics::Counter>* received_bytes_;
  metrics::Family<metrics::Counter>* sent_bytes_;
  metrics::Family<metrics::Gauge>* open_streams_;
  metrics::Family<metrics::Histogram>* hook_round_trip_;
  metrics::Family<metrics::Counter>* hook_timeouts_;
  metrics::Family<metrics::Counter>* hook_stray_answers_;
  metrics::Family<metrics::Counter>* shared_memory_bytes_;
  metrics::Counter* scrub_passes_;
  metrics::Counter* scrub_bytes_;
  metrics::Histogram* audit_append_;
  metrics::Histogram* audit_sync_;
  metrics::Timestamp latest_checkpoint_;
  absl::Mutex queues_mu_;
  std::vector<std::pair<std::string, std::weak_ptr<std::atomic<uint64_t>>>>
      queues_ ABSL_GUARDED_BY(queues_mu_);
  // Filled in the constructor, read-only after: lookups take no lock.
  absl::flat_hash_map<std::string, std::unique_ptr<MethodMetrics>> methods_;
  std::unique_ptr<MethodMetrics> unknown_method_;
};

// OK if `listen` is empty or a --metrics_listen address MetricsHttpServer
// can parse; INVALID_ARGUMENT naming the flag otherwise.
absl::Status CheckMetricsListen(absl::string_view listen);

// Serves a registry's text at GET /metrics over HTTP/1.1. Thread-safe.
class MetricsHttpServer {
 public:
  // `listen`: "host:port" (port 0 picks a free one), or just a port
  // ("9464" or ":9464"), which means 127.0.0.1. INVALID_ARGUMENT for an
  // address that cannot be parsed; UNAVAILABLE if it cannot be bound.
  // `registry` is not owned and must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      absl::string_view listen, const metrics::Registry* registry);
  // Stops serving and joins the serving thread.
  ~MetricsHttpServer();

  // "127.0.0.1:9464": the port actually bound.
  const std::string& address() const { return address_; }

 private:
  MetricsHttpServer();
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::string address_;
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_METRICS_H_
