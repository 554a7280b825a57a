// The server's Prometheus endpoint and request logging, in process:
// what /metrics says after real calls, correlation ids in the response
// metadata and in the log, and --metrics_listen's errors.
#include "server/metrics.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "client/subscriber.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/server.h"
#include "tests/testing/in_process_server.h"
#include "tests/testing/requests.h"
#include "tests/testing/status_matchers.h"

namespace modelstate::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kLinear[] = R"({"type": "Linear", "args": [8, 4]})";
// Linear(8, 4) in float32: weight and bias.
constexpr int kLinearBytes = 4 * (8 * 4 + 4);

// GET `path` from the metrics server at `address` ("127.0.0.1:port").
httplib::Result Get(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  httplib::Client http(address.substr(0, colon),
                       std::stoi(address.substr(colon + 1)));
  return http.Get(path);
}

// The value of the sample `series` ("name{labels}") in `text`, or -1 if
// there is none.
double Sample(const std::string& text, const std::string& series) {
  const std::string key = absl::StrCat("\n", series, " ");
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size()));
}

class MetricsTest : public InProcessServerTest {
 protected:
  static void SetUpTestSuite() {
    SetLogFormat(LogFormat::kJson);
    SetLogSinkForTesting([](const std::string& line) {
      absl::MutexLock lock(&log_mu_);
      log_->push_back(line);
    });
    StartServer([](server::ServerConfig& config) {
      config.metrics_listen = "127.0.0.1:0";
      config.namespace_quota.max_bytes = 1 << 20;
    });
  }
  static void TearDownTestSuite() {
    InProcessServerTest::TearDownTestSuite();
    SetLogSinkForTesting(nullptr);
    SetLogFormat(LogFormat::kText);
  }

  std::string Scrape() {
    httplib::Result result =
        Get(server_->server().metrics_address(), "/metrics");
    EXPECT_TRUE(result) << httplib::to_string(result.error());
    if (!result) return "";
    EXPECT_EQ(result->status, 200);
    EXPECT_THAT(result->get_header_value("Content-Type"),
                StartsWith("text/plain; version=0.0.4"));
    return result->body;
  }

  // Scrapes until the text holds `expected` (up to 5 s): gauges of calls
  // change when the server lets go of a call, which may come just after
  // the client has its status. Returns the last text.
  std::string ScrapeUntil(const std::string& expected) {
    std::string text = Scrape();
    for (int i = 0; i < 250 && !absl::StrContains(text, expected); ++i) {
      absl::SleepFor(absl::Milliseconds(20));
      text = Scrape();
    }
    return text;
  }

  // GetModule of a module that does not exist, with `request_id` as
  // x-request-id unless empty; returns the x-request-id the server sent.
  std::string MissingModule(const std::string& request_id) {
    auto stub =
        v1::ModelStateService::NewStub(server_->server().InProcessChannel());
    grpc::ClientContext context;
    if (!request_id.empty()) context.AddMetadata("x-request-id", request_id);
    v1::GetModuleRequest request;
    request.set_module("team/missing");
    v1::GetModuleResponse response;
    grpc::Status status = stub->GetModule(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::NOT_FOUND);
    auto it = context.GetServerInitialMetadata().find("x-request-id");
    if (it == context.GetServerInitialMetadata().end()) return "";
    return std::string(it->second.data(), it->second.size());
  }

  // The logged JSON objects whose correlation id is `id`.
  std::vector<nlohmann::json> LoggedFor(const std::string& id) {
    absl::MutexLock lock(&log_mu_);
    std::vector<nlohmann::json> found;
    for (const std::string& line : *log_) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("correlation_id", "") == id) found.push_back(j);
    }
    return found;
  }

  static inline absl::Mutex log_mu_;
  static inline std::vector<std::string>* log_ = new std::vector<std::string>;
};

TEST_F(MetricsTest, ServesOnLoopbackApartFromGrpc) {
  const std::string address = server_->server().metrics_address();
  EXPECT_THAT(address, MatchesRegex("127\\.0\\.0\\.1:[0-9]+"));
  EXPECT_NE(address, server_->address());
  httplib::Result other = Get(address, "/");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
}

TEST_F(MetricsTest, CountsCallsByMethodAndCode) {
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/counted", kLinear)),
              IsOk());
  MissingModule("");
  const std::string text = Scrape();
  EXPECT_THAT(text, HasSubstr("# TYPE modelstate_rpcs_total counter\n"));
  EXPECT_THAT(text, HasSubstr("modelstate_rpcs_total{method=\"BuildModule\","
                              "code=\"OK\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("modelstate_rpcs_total{method=\"GetModule\","
                              "code=\"NOT_FOUND\"}"));
  EXPECT_THAT(text, HasSubstr("modelstate_rpc_duration_seconds_count{method="
                              "\"BuildModule\"} 1\n"));
  // Codes never returned have no series.
  EXPECT_THAT(text, Not(HasSubstr("method=\"BuildModule\",code=\"INTERNAL\"")));
  // The audit log was written and synced for the build.
  EXPECT_THAT(text, MatchesRegex("(.|\n)*modelstate_audit_sync_seconds_count "
                                 "[1-9][0-9]*\n(.|\n)*"));
  EXPECT_THAT(text, MatchesRegex("(.|\n)*modelstate_audit_append_seconds_count "
                                 "[1-9][0-9]*\n(.|\n)*"));
}

TEST_F(MetricsTest, ReportsModulesBytesAndQuotasByNamespace) {
  ASSERT_THAT(client_->BuildModule(BuildRequest("quota-ns/a", kLinear)),
              IsOk());
  ASSERT_THAT(client_->BuildModule(BuildRequest("quota-ns/b", kLinear)),
              IsOk());
  const std::string text = Scrape();
  EXPECT_THAT(text,
              HasSubstr("modelstate_modules{namespace=\"quota-ns\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(
                        "modelstate_hosted_bytes{namespace=\"quota-ns\"} ",
                        2 * kLinearBytes, "\n")));
  EXPECT_THAT(text, HasSubstr("modelstate_quota_max_bytes{namespace="
                              "\"quota-ns\"} 1048576\n"));
  // No module quota was set: no series for it.
  EXPECT_THAT(text, Not(HasSubstr("modelstate_quota_max_modules{")));
}

TEST_F(MetricsTest, ReportsModulesAndBytesByDevice) {
  ASSERT_THAT(client_->BuildModule(BuildRequest("dev-ns/host", kLinear)),
              IsOk());
  v1::BuildModuleRequest meta = BuildRequest("dev-ns/meta", kLinear);
  meta.set_device("meta");
  ASSERT_THAT(client_->BuildModule(meta), IsOk());
  const std::string text = Scrape();
  EXPECT_EQ(Sample(text,
                   "modelstate_device_modules{namespace=\"dev-ns\","
                   "device=\"cpu\"}"),
            1);
  EXPECT_EQ(Sample(text,
                   "modelstate_device_modules{namespace=\"dev-ns\","
                   "device=\"meta\"}"),
            1);
  EXPECT_EQ(Sample(text,
                   "modelstate_device_hosted_bytes{namespace="
                   "\"dev-ns\",device=\"cpu\"}"),
            kLinearBytes);
  // Meta tensors hold no bytes.
  EXPECT_EQ(Sample(text,
                   "modelstate_device_hosted_bytes{namespace="
                   "\"dev-ns\",device=\"meta\"}"),
            0);
}

TEST_F(MetricsTest, ReportsTheProcess) {
  const std::string text = Scrape();
  EXPECT_GT(Sample(text, "process_resident_memory_bytes"), 1 << 20);
  // gRPC's, the metrics server's and the audit's threads at least.
  EXPECT_GT(Sample(text, "process_threads"), 2);
  EXPECT_GT(Sample(text, "process_open_fds"), 3);
}

TEST_F(MetricsTest, ReportsEachSubscribersQueuedBytes) {
  v1::Subscription subscription;
  subscription.set_name("queue-watched");
  subscription.add_namespaces("queue-ns");
  absl::StatusOr<std::unique_ptr<client::Subscriber>> subscriber =
      client::Subscriber::Start(*client_, subscription,
                                [](const v1::HookEventProto&) {
                                  v1::HookAnswer answer;
                                  answer.set_verdict(v1::HookAnswer::APPROVE);
                                  return answer;
                                });
  ASSERT_THAT(subscriber, IsOk());
  const std::string series =
      "modelstate_subscriber_queue_bytes{subscriber=\"queue-watched\"}";
  // Written out (the ack): nothing queued now.
  EXPECT_EQ(Sample(Scrape(), series), 0);
  ASSERT_THAT((*subscriber)->Unsubscribe(), IsOk());
  subscriber->reset();
  // Its stream has ended: no series.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Sample(Scrape(), series) != -1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Sample(Scrape(), series), -1);
}

TEST_F(MetricsTest, CountsBytesOfStreams) {
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/streamed", kLinear)),
              IsOk());
  const std::string before = Scrape();
  v1::GetStateDictRequest request;
  request.set_module("team/streamed");
  auto stub =
      v1::ModelStateService::NewStub(server_->server().InProcessChannel());
  grpc::ClientContext context;
  auto reader = stub->GetStateDict(&context, request);
  v1::StateDictChunk chunk;
  size_t data = 0;
  while (reader->Read(&chunk)) data += chunk.data().size();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(data, static_cast<size_t>(kLinearBytes));
  const std::string after = Scrape();
  const std::string sent =
      "modelstate_rpc_sent_bytes_total{method=\"GetStateDict\"}";
  EXPECT_GE(Sample(after, sent) - Sample(before, sent), kLinearBytes);
  // The stream's gauge drops when the server lets go of the call, which
  // may come just after the client has its status.
  EXPECT_THAT(
      ScrapeUntil("modelstate_open_streams{method=\"GetStateDict\"} 0\n"),
      HasSubstr("modelstate_open_streams{method=\"GetStateDict\"} 0\n"));
}

// Health checks are counted like any call, request bytes included.
TEST_F(MetricsTest, CountsHealthRequestBytes) {
  auto health =
      grpc::health::v1::Health::NewStub(server_->server().InProcessChannel());
  const std::string received =
      "modelstate_rpc_received_bytes_total{method=\"grpc.health.v1.Health/"
      "Check\"}";
  const double before = Sample(Scrape(), received);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("not-this-one");  // 14 bytes with its tag and length
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  EXPECT_FALSE(health->Check(&context, request, &response).ok());
  EXPECT_EQ(Sample(Scrape(), received) - before,
            static_cast<double>(request.ByteSizeLong()));
}

// A health watcher that goes is let go: the server ends its call (the
// stream's gauge drops, which happens when the call object goes), and the
// watchers that stay are still counted.
TEST_F(MetricsTest, CancelledHealthWatchesAreLetGo) {
  auto health =
      grpc::health::v1::Health::NewStub(server_->server().InProcessChannel());
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>>
        reader;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < 3; ++i) {
    auto watch = std::make_unique<Watch>();
    watch->reader = health->Watch(&watch->context, {});
    grpc::health::v1::HealthCheckResponse status;
    ASSERT_TRUE(watch->reader->Read(&status));
    watches.push_back(std::move(watch));
  }
  const std::string gauge =
      "modelstate_open_streams{method=\"grpc.health.v1.Health/Watch\"} ";
  EXPECT_THAT(ScrapeUntil(gauge + "3\n"), HasSubstr(gauge + "3\n"));
  for (int i = 0; i < 2; ++i) {
    watches[i]->context.TryCancel();
    watches[i]->reader->Finish().IgnoreError();
  }
  EXPECT_THAT(ScrapeUntil(gauge + "1\n"), HasSubstr(gauge + "1\n"));
  watches[2]->context.TryCancel();
  watches[2]->reader->Finish().IgnoreError();
  EXPECT_THAT(ScrapeUntil(gauge + "0\n"), HasSubstr(gauge + "0\n"));
}

TEST_F(MetricsTest, CheckpointAgeStaysFreshWhileTheSignerWorks) {
  const std::string age_series = "modelstate_audit_checkpoint_age_seconds";
  // The start signed one; the signer refreshes the age each second, even
  // with nothing appended.
  const double first = Sample(Scrape(), age_series);
  EXPECT_GE(first, 0);
  EXPECT_LT(first, 30);
  absl::SleepFor(absl::Seconds(3));
  const double later = Sample(Scrape(), age_series);
  EXPECT_GE(later, 0);
  EXPECT_LT(later, 2.9);  // unrefreshed, it would be at least 3
}

TEST_F(MetricsTest, EchoesAndLogsTheClientsRequestId) {
  EXPECT_EQ(MissingModule("req-metrics-42"), "req-metrics-42");
  std::vector<nlohmann::json> lines = LoggedFor("req-metrics-42");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["level"], "warning");
  EXPECT_EQ(lines[0]["method"], "GetModule");
  EXPECT_EQ(lines[0]["code"], "NOT_FOUND");
  EXPECT_THAT(lines[0]["message"].get<std::string>(),
              HasSubstr("team/missing"));
}

TEST_F(MetricsTest, GeneratesARequestIdWhenTheClientSentNone) {
  const std::string id = MissingModule("");
  EXPECT_THAT(id, MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(LoggedFor(id).size(), 1u);
  EXPECT_NE(MissingModule(""), id);
}

// More namespaces than --metrics_max_namespaces: the first by name are
// named, the rest summed into "_other".
class CappedMetricsTest : public MetricsTest {
 protected:
  static void SetUpTestSuite() {
    StartServer([](server::ServerConfig& config) {
      config.metrics_listen = "127.0.0.1:0";
      config.metrics_max_namespaces = 2;
    });
  }
  static void TearDownTestSuite() { InProcessServerTest::TearDownTestSuite(); }
};

TEST_F(CappedMetricsTest, NamespacesPastTheCapAreSummed) {
  for (const char* module : {"a-ns/x", "b-ns/x", "c-ns/x", "d-ns/x"}) {
    ASSERT_THAT(client_->BuildModule(BuildRequest(module, kLinear)), IsOk());
  }
  const std::string text = Scrape();
  EXPECT_EQ(Sample(text, "modelstate_modules{namespace=\"a-ns\"}"), 1);
  EXPECT_EQ(Sample(text, "modelstate_modules{namespace=\"b-ns\"}"), 1);
  EXPECT_EQ(Sample(text, "modelstate_modules{namespace=\"_other\"}"), 2);
  EXPECT_EQ(Sample(text, "modelstate_hosted_bytes{namespace=\"_other\"}"),
            2 * kLinearBytes);
  EXPECT_EQ(Sample(text,
                   "modelstate_device_modules{namespace=\"_other\","
                   "device=\"cpu\"}"),
            2);
  EXPECT_THAT(text, Not(HasSubstr("c-ns")));
  EXPECT_THAT(text, Not(HasSubstr("d-ns")));
}

TEST(MetricsListenTest, BadAddressesFailTheStart) {
  InProcessServer bad([](server::ServerConfig& config) {
    config.metrics_listen = "127.0.0.1:http";
  });
  EXPECT_THAT(bad.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("--metrics_listen")));
  InProcessServer first([](server::ServerConfig& config) {
    config.metrics_listen = "127.0.0.1:0";
  });
  ASSERT_THAT(first.Start(), IsOk());
  const std::string taken = first.server().metrics_address();
  InProcessServer second(
      [&](server::ServerConfig& config) { config.metrics_listen = taken; });
  EXPECT_THAT(second.Start(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(taken)));
}

TEST(MetricsListenTest, APortAloneMeansLoopback) {
  static const metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<server::MetricsHttpServer>> http =
      server::MetricsHttpServer::Start(":0", &registry);
  ASSERT_THAT(http.status(), IsOk());
  EXPECT_THAT((*http)->address(), StartsWith("127.0.0.1:"));
}

}  // namespace
}  // namespace modelstate::testing
