#include "server/metrics.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "core/storage.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/interceptor.h"
#include "httplib.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "service/authenticator.h"
#include "service/model_store.h"
#include "service/subscriber_hub.h"

namespace modelstate::server {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::InterceptorBatchMethods;
using grpc::experimental::ServerRpcInfo;

constexpr absl::string_view kServicePrefix =
    "/modelstate.v1.ModelStateService/";

const char* CodeName(int code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  return code >= 0 && code < 17 ? kNames[code] : "UNKNOWN";
}

// Codes that say the server, not the caller, has a problem.
bool IsServerError(grpc::StatusCode code) {
  return code == grpc::UNKNOWN || code == grpc::INTERNAL ||
         code == grpc::UNAVAILABLE || code == grpc::DATA_LOSS ||
         code == grpc::DEADLINE_EXCEEDED;
}

// 16 hex digits, for calls that came without an x-request-id.
std::string NewRequestId() {
  thread_local absl::InsecureBitGen bits;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(bits));
}

// One per call: counts, times and logs it.
class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(ServerMetrics* metrics, ServerRpcInfo* info)
      : metrics_(metrics),
        info_(info),
        method_(metrics->ForMethod(info->method())),
        streaming_(info->type() != ServerRpcInfo::Type::UNARY),
        start_(absl::Now()) {
    if (streaming_) method_.open_streams->Add(1);
  }
  ~MetricsInterceptor() override {
    if (streaming_) method_.open_streams->Add(-1);
  }

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      ReadRequestId(*methods->GetRecvInitialMetadata());
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("x-request-id", request_id_);
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE) &&
        method_.protobuf && methods->GetRecvMessage() != nullptr) {
      // This service's requests are generated protobuf messages.
      const auto* message = static_cast<const google::protobuf::MessageLite*>(
          methods->GetRecvMessage());
      method_.received_bytes->Increment(message->ByteSizeLong());
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      // Serializing here is the serialization the send would do anyway.
      const grpc::ByteBuffer* buffer = methods->GetSerializedSendMessage();
      if (buffer != nullptr) method_.sent_bytes->Increment(buffer->Length());
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      Finish(methods->GetSendStatus());
    }
    methods->Proceed();
  }

 private:
  void ReadRequestId(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
    auto it = metadata.find("x-request-id");
    if (it != metadata.end() && !it->second.empty()) {
      request_id_ = CappedRequestId(
          absl::string_view(it->second.data(), it->second.size()));
    } else {
      request_id_ = NewRequestId();
    }
  }

  void Finish(const grpc::Status& status) {
    const absl::Duration latency = absl::Now() - start_;
    method_.latency->ObserveDuration(latency);
    metrics_->CountCall(method_, status.error_code());
    if (status.ok() || status.error_code() == grpc::CANCELLED) return;
    Log(IsServerError(status.error_code()) ? LogLevel::kError
                                           : LogLevel::kWarning,
        absl::StrCat(method_.label, " failed: ", status.error_message()),
        {.correlation_id = request_id_,
         .fields = {
             {"method", method_.label},
             {"code", CodeName(status.error_code())},
             {"latency_ms",
              absl::StrFormat("%.3f", absl::ToDoubleMilliseconds(latency))},
             {"peer", info_->server_context()->peer()}}});
  }

  ServerMetrics* const metrics_;
  ServerRpcInfo* const info_;
  MethodMetrics& method_;
  const bool streaming_;
  const absl::Time start_;
  std::string request_id_;
};

class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(ServerMetrics* metrics)
      : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      ServerRpcInfo* info) override {
    return new MetricsInterceptor(metrics_, info);
  }

 private:
  ServerMetrics* const metrics_;
};

using Samples = metrics::CallbackFamily::Samples;

// /proc/self's figures for the process_* gauges (0 where unreadable).
double ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident) * sysconf(_SC_PAGESIZE);
}

double Threads() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  std::getline(stat, line);
  // Field 20, counted after the command name's closing parenthesis (the
  // name itself may hold spaces).
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 20 && fields >> field; ++i) {
    if (i == 20) return std::strtod(field.c_str(), nullptr);
  }
  return 0;
}

double OpenFds() {
  std::error_code error;
  double count = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end;
       !error && it != end; it.increment(error)) {
    ++count;
  }
  return count;
}

}  // namespace

ServerMetrics::ServerMetrics() {
  metrics::Registry& r = registry_;
  rpcs_ = &r.AddCounter("modelstate_rpcs_total",
                        "RPCs finished, by method and gRPC status code.",
                        {"method", "code"});
  rpc_latency_ = &r.AddHistogram(
      "modelstate_rpc_duration_seconds",
      "Time from a call's start to its status being sent, by method.",
      {"method"}, metrics::LatencyBuckets());
  received_bytes_ = &r.AddCounter(
      "modelstate_rpc_received_bytes_total",
      "Bytes of request messages received (serialized size), by method.",
      {"method"});
  sent_bytes_ = &r.AddCounter(
      "modelstate_rpc_sent_bytes_total",
      "Bytes of response messages sent (serialized size), by method.",
      {"method"});
  open_streams_ =
      &r.AddGauge("modelstate_open_streams",
                  "Streaming calls now open, by method.", {"method"});
  hook_round_trip_ = &r.AddHistogram(
      "modelstate_hook_round_trip_seconds",
      "From an event reaching the head of an interceptor's queue to its "
      "answer, by subscriber name.",
      {"subscriber"}, metrics::LatencyBuckets());
  hook_timeouts_ = &r.AddCounter(
      "modelstate_hook_timeouts_total",
      "Times an interceptor left its oldest event unanswered past its "
      "timeout (the events it held fail with it), by subscriber name.",
      {"subscriber"});
  hook_stray_answers_ = &r.AddCounter(
      "modelstate_hook_stray_answers_total",
      "Answers that changed nothing (late, duplicate, or for an event never "
      "sent to the subscriber when it held none to fail), by subscriber "
      "name; past the first few of an interval the audit log only counts "
      "them.",
      {"subscriber"});
  shared_memory_bytes_ = &r.AddCounter(
      "modelstate_shared_memory_bytes_total",
      "State_dict bytes exchanged with same-host clients through shared "
      "memory instead of gRPC messages, by direction (get: GetStateDict, "
      "load: LoadStateDict).",
      {"direction"});
  scrub_passes_ = &r.AddCounter("modelstate_scrub_passes_total",
                                "Whole scrub passes over the hosted bytes "
                                "mapped from data files (--scrub_interval).",
                                {})
                       .Labels({});
  scrub_bytes_ = &r.AddCounter("modelstate_scrub_bytes_total",
                               "Bytes the scrub read and checked against "
                               "their CRC-32C.",
                               {})
                      .Labels({});
  r.AddCallback(
      "modelstate_damaged_storages",
      "Storages whose bytes on disk were found not to match their CRC-32C "
      "(by a read or by the scrub) since the server started; they are "
      "never served.",
      {}, []() -> Samples {
        return {{{}, static_cast<double>(Storage::DamagedCount())}};
      });
  audit_append_ = &r.AddHistogram("modelstate_audit_append_seconds",
                                  "Time to append one audit record.", {},
                                  metrics::LatencyBuckets())
                       .Labels({});
  audit_sync_ =
      &r.AddHistogram("modelstate_audit_sync_seconds",
                      "Time a caller waits for its audit records to be on "
                      "disk (fdatasync, shared by concurrent callers).",
                      {}, metrics::LatencyBuckets())
           .Labels({});
  r.AddCallback(
      "modelstate_audit_checkpoint_age_seconds",
      "Seconds since a signed audit checkpoint last covered every record "
      "(absent until the first one).",
      {}, [this]() -> Samples {
        if (!latest_checkpoint_.has_value()) return {};
        return {
            {{},
             absl::ToDoubleSeconds(absl::Now() - latest_checkpoint_.value())}};
      });
  // The usual process gauges of Prometheus' client libraries.
  r.AddCallback("process_resident_memory_bytes",
                "Resident memory size in bytes.", {}, []() -> Samples {
                  return {{{}, ResidentBytes()}};
                });
  r.AddCallback("process_threads", "Number of OS threads in the process.", {},
                []() -> Samples {
                  return {{{}, Threads()}};
                });
  r.AddCallback("process_open_fds", "Number of open file descriptors.", {},
                []() -> Samples {
                  return {{{}, OpenFds()}};
                });

  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "modelstate.v1.ModelStateService");
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    const std::string& name = service->method(i)->name();
    AddMethod(absl::StrCat(kServicePrefix, name), name, true);
  }
  // The other services: health checks (health_service.h) and gRPC's
  // reflection.
  for (const char* other :
       {"grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch",
        "grpc.reflection.v1alpha.ServerReflection/"
        "ServerReflectionInfo"}) {
    AddMethod(absl::StrCat("/", other), other, true);
  }
  unknown_method_ = std::make_unique<MethodMetrics>();
  unknown_method_->label = "unknown";
  unknown_method_->latency = &rpc_latency_->Labels({"unknown"});
  unknown_method_->received_bytes = &received_bytes_->Labels({"unknown"});
  unknown_method_->sent_bytes = &sent_bytes_->Labels({"unknown"});
  unknown_method_->open_streams = &open_streams_->Labels({"unknown"});
}

void ServerMetrics::AddMethod(absl::string_view full_name, std::string label,
                              bool protobuf) {
  auto m = std::make_unique<MethodMetrics>();
  m->latency = &rpc_latency_->Labels({label});
  m->received_bytes = &received_bytes_->Labels({label});
  m->sent_bytes = &sent_bytes_->Labels({label});
  m->open_streams = &open_streams_->Labels({label});
  m->label = std::move(label);
  m->protobuf = protobuf;
  methods_[std::string(full_name)] = std::move(m);
}

MethodMetrics& ServerMetrics::ForMethod(absl::string_view full_name) {
  auto it = methods_.find(full_name);
  return it == methods_.end() ? *unknown_method_ : *it->second;
}

void ServerMetrics::CountCall(MethodMetrics& method, int code) {
  if (code < 0 || code >= static_cast<int>(method.by_code.size())) code = 2;
  metrics::Counter* counter =
      method.by_code[code].load(std::memory_order_acquire);
  if (counter == nullptr) {
    // The family returns the same child to every thread that gets here.
    counter = &rpcs_->Labels({method.label, CodeName(code)});
    method.by_code[code].store(counter, std::memory_order_release);
  }
  counter->Increment();
}

std::vector<
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
ServerMetrics::InterceptorCreators() {
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      creators;
  creators.push_back(std::make_unique<MetricsInterceptorFactory>(this));
  return creators;
}

namespace {

using NamespaceUsage = ModelStore::NamespaceUsage;

// The store's usage with at most `max_namespaces` namespaces named: the
// rest are summed into one, "_other" (its quotas are not summed), so that
// a server with many namespaces keeps a bounded number of series.
std::vector<NamespaceUsage> CappedUsage(const ModelStore& store,
                                        size_t max_namespaces) {
  std::vector<NamespaceUsage> usage = store.Usage();
  if (usage.size() <= max_namespaces) return usage;
  NamespaceUsage other;
  other.ns = "_other";
  for (size_t i = max_namespaces; i < usage.size(); ++i) {
    other.modules += usage[i].modules;
    other.bytes += usage[i].bytes;
    for (const ModelStore::DeviceUsage& d : usage[i].devices) {
      auto it = std::find_if(other.devices.begin(), other.devices.end(),
                             [&d](const ModelStore::DeviceUsage& o) {
                               return o.device == d.device;
                             });
      if (it == other.devices.end()) {
        ModelStore::DeviceUsage added;
        added.device = d.device;
        other.devices.push_back(std::move(added));
        it = other.devices.end() - 1;
      }
      it->modules += d.modules;
      it->bytes += d.bytes;
    }
  }
  usage.resize(max_namespaces);
  usage.push_back(std::move(other));
  return usage;
}

}  // namespace

std::shared_ptr<std::atomic<uint64_t>> ServerMetrics::TrackQueue(
    const std::string& subscriber) {
  auto bytes = std::make_shared<std::atomic<uint64_t>>(0);
  absl::MutexLock lock(&queues_mu_);
  // Forget the queues of streams that have ended.
  queues_.erase(
      std::remove_if(queues_.begin(), queues_.end(),
                     [](const auto& queue) { return queue.second.expired(); }),
      queues_.end());
  queues_.emplace_back(subscriber, bytes);
  return bytes;
}

void ServerMetrics::Observe(const ModelStore* store, const SubscriberHub* hub,
                            size_t max_namespaces) {
  // One walk of the store per family and scrape.
  auto usage = [store, max_namespaces](auto value) {
    return [store, max_namespaces, value]() -> Samples {
      Samples samples;
      for (const NamespaceUsage& u : CappedUsage(*store, max_namespaces)) {
        std::optional<double> v = value(u);
        if (v.has_value()) samples.push_back({{u.ns}, *v});
      }
      return samples;
    };
  };
  auto by_device = [store, max_namespaces](auto value) {
    return [store, max_namespaces, value]() -> Samples {
      Samples samples;
      for (const NamespaceUsage& u : CappedUsage(*store, max_namespaces)) {
        for (const ModelStore::DeviceUsage& d : u.devices) {
          samples.push_back({{u.ns, d.device}, value(d)});
        }
      }
      return samples;
    };
  };
  using U = NamespaceUsage;
  using D = ModelStore::DeviceUsage;
  registry_.AddCallback("modelstate_modules", "Modules hosted, by namespace.",
                        {"namespace"},
                        usage([](const U& u) -> std::optional<double> {
                          return static_cast<double>(u.modules);
                        }));
  registry_.AddCallback(
      "modelstate_hosted_bytes",
      "Tensor bytes hosted, in memory or mapped from data files (what "
      "quotas count), by namespace.",
      {"namespace"}, usage([](const U& u) -> std::optional<double> {
        return static_cast<double>(u.bytes);
      }));
  registry_.AddCallback(
      "modelstate_device_modules",
      "Modules with a tensor on the device, by namespace and device.",
      {"namespace", "device"},
      by_device([](const D& d) { return static_cast<double>(d.modules); }));
  registry_.AddCallback(
      "modelstate_device_hosted_bytes",
      "Tensor bytes held on the device, by namespace and device.",
      {"namespace", "device"},
      by_device([](const D& d) { return static_cast<double>(d.bytes); }));
  registry_.AddCallback("modelstate_quota_max_modules",
                        "A namespace's module quota (absent where unlimited).",
                        {"namespace"},
                        usage([](const U& u) -> std::optional<double> {
                          if (u.quota.max_modules == 0) return std::nullopt;
                          return static_cast<double>(u.quota.max_modules);
                        }));
  registry_.AddCallback("modelstate_quota_max_bytes",
                        "A namespace's byte quota (absent where unlimited).",
                        {"namespace"},
                        usage([](const U& u) -> std::optional<double> {
                          if (u.quota.max_bytes == 0) return std::nullopt;
                          return static_cast<double>(u.quota.max_bytes);
                        }));
  registry_.AddCallback(
      "modelstate_builds_waiting",
      "Builds waiting for another build of the same name (bounded per name "
      "by --max_build_waiters).",
      {}, [store]() -> Samples {
        return {{{}, static_cast<double>(store->BuildsWaiting())}};
      });
  registry_.AddCallback(
      "modelstate_subscriber_queue_depth",
      "Events sent to a subscriber and not yet answered, by subscriber "
      "name.",
      {"subscriber"}, [hub]() -> Samples {
        Samples samples;
        for (const SubscriberInfo& s : hub->List()) {
          samples.push_back({{s.spec.name}, static_cast<double>(s.pending)});
        }
        return samples;
      });
  registry_.AddCallback(
      "modelstate_subscriber_queue_bytes",
      "Bytes queued for writing on subscribers' streams (bounded by "
      "--max_subscriber_queue_mib each), by subscriber name.",
      {"subscriber"}, [this]() -> Samples {
        std::map<std::string, double> by_name;
        absl::MutexLock lock(&queues_mu_);
        for (const auto& [name, queue] : queues_) {
          if (std::shared_ptr<std::atomic<uint64_t>> bytes = queue.lock()) {
            by_name[name] += static_cast<double>(bytes->load());
          }
        }
        Samples samples;
        for (const auto& [name, bytes] : by_name) {
          samples.push_back({{name}, bytes});
        }
        return samples;
      });
}

namespace {

// "host:port", "[v6]:port", ":port" or "port" (loopback) into host and
// port.
absl::Status ParseListen(absl::string_view listen, std::string* host,
                         int* port) {
  absl::string_view port_text = listen;
  *host = "127.0.0.1";
  if (size_t colon = listen.rfind(':'); colon != absl::string_view::npos) {
    port_text = listen.substr(colon + 1);
    absl::string_view h = listen.substr(0, colon);
    if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
      h = h.substr(1, h.size() - 2);
    }
    if (!h.empty()) *host = std::string(h);
  }
  if (!absl::SimpleAtoi(port_text, port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: cannot parse '", listen,
                     "' as host:port (port 0 to 65535) or a port"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMetricsListen(absl::string_view listen) {
  if (listen.empty()) return absl::OkStatus();
  std::string host;
  int port = 0;
  return ParseListen(listen, &host, &port);
}

MetricsHttpServer::MetricsHttpServer() = default;

MetricsHttpServer::~MetricsHttpServer() {
  if (http_ != nullptr) http_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    absl::string_view listen, const metrics::Registry* registry) {
  std::string host;
  int port = 0;
  MODELSTATE_RETURN_IF_ERROR(ParseListen(listen, &host, &port));
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->http_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *server->http_;
  // Scrapes are rare and cheap; a few threads serve a few scrapers (each
  // keeps its connection, and so a thread, between scrapes).
  http.new_task_queue = [] { return new httplib::ThreadPool(4); };
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which
  // would let a second server share the port and half of the scrapes.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.Get("/metrics",
           [registry](const httplib::Request&, httplib::Response& response) {
             response.set_content(registry->Render(),
                                  "text/plain; version=0.0.4; charset=utf-8");
           });
  const bool bound = port == 0 ? (port = http.bind_to_any_port(host)) > 0
                               : http.bind_to_port(host, port);
  if (!bound) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on --metrics_listen ", listen));
  }
  server->address_ = absl::StrCat(
      host.find(':') == std::string::npos ? host : absl::StrCat("[", host, "]"),
      ":", port);
  server->thread_ = std::thread([&http] { http.listen_after_bind(); });
  // stop() before the loop runs would be lost and the join would hang.
  while (!http.is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return server;
}

}  // namespace modelstate::server
