// File: in_process_server.h
// A modelstate Server (server/server.h) started inside the test process,
// on a fresh temporary data directory: clients reach it over gRPC's
// in-process channel, with no port and no process to spawn. It also
// listens on 127.0.0.1:0, so that tools run as processes (modelstatectl,
// test subscribers) can reach it too. Tests where a process is the point
// (signals, SIGKILL, exit codes, flag parsing, a process's file size limit,
// TLS ports) use TestServer (test_server.h) instead.
//
// Example:
//   InProcessServer server([](server::ServerConfig& config) {
//     config.limits.max_tensor_bytes = 64 << 20;
//   });
//   ASSERT_THAT(server.Start(), IsOk());
//   std::unique_ptr<client::ModelStateClient> c = server.NewClient();
#ifndef MODELSTATE_TESTS_TESTING_IN_PROCESS_SERVER_H_
#define MODELSTATE_TESTS_TESTING_IN_PROCESS_SERVER_H_

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/model_state_client.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace modelstate::testing {

class InProcessServer {
 public:
  using Configure = std::function<void(server::ServerConfig&)>;

  // `configure` (may be null) adjusts the configuration before each start.
  explicit InProcessServer(Configure configure = nullptr)
      : configure_(std::move(configure)) {
    static std::atomic<int> counter{0};
    dir_ =
        std::filesystem::temp_directory_path() /
        absl::StrCat("modelstate-inproc-", getpid(), "-", counter.fetch_add(1));
    std::filesystem::create_directories(dir_);
  }
  ~InProcessServer() {
    Stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  InProcessServer(const InProcessServer&) = delete;
  InProcessServer& operator=(const InProcessServer&) = delete;

  // Starts (or restarts, on the same data directory) the server.
  absl::Status Start() {
    Stop();
    server::ServerConfig config;
    config.listen = "127.0.0.1:0";
    config.data_dir = data_dir().string();
    // Calls a test leaves open end soon at the end.
    config.shutdown_grace_seconds = 2;
    if (configure_) configure_(config);
    absl::StatusOr<std::unique_ptr<server::Server>> started =
        server::Server::Start(std::move(config));
    if (!started.ok()) return started.status();
    server_ = *std::move(started);
    return absl::OkStatus();
  }
  // Shuts the server down and waits for it (nothing if not running).
  void Stop() { server_.reset(); }

  // The configuration of the next Start.
  void set_configure(Configure configure) { configure_ = std::move(configure); }

  bool running() const { return server_ != nullptr; }
  server::Server& server() { return *server_; }
  // The TCP address, for processes.
  const std::string& address() const { return server_->address(); }
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path data_dir() const { return dir_ / "data"; }

  // A client over the in-process channel.
  std::unique_ptr<client::ModelStateClient> NewClient(
      client::ClientOptions options = {}) const {
    return std::make_unique<client::ModelStateClient>(
        server_->InProcessChannel(), std::move(options));
  }

 private:
  Configure configure_;
  std::filesystem::path dir_;
  std::unique_ptr<server::Server> server_;
};

// A test suite that shares one in-process server; each test gets a fresh
// client, and a test that leaves the server unhealthy fails. A suite with
// its own configuration defines SetUpTestSuite() calling StartServer.
class InProcessServerTest : public ::testing::Test {
 protected:
  static void StartServer(InProcessServer::Configure configure) {
    server_ = new InProcessServer(std::move(configure));
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }
  static void SetUpTestSuite() { StartServer(nullptr); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    ASSERT_TRUE(server_->running());
    client_ = server_->NewClient();
  }
  // Whatever a test sent, it never takes the server down.
  void TearDown() override {
    if (client_ != nullptr) {
      EXPECT_TRUE(client_->Health().ok());
    }
  }

  static inline InProcessServer* server_ = nullptr;
  std::unique_ptr<client::ModelStateClient> client_;
};

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_IN_PROCESS_SERVER_H_
