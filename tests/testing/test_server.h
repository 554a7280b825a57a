// File: test_server.h
// The real modelstate-server binary for integration tests (ServerProcess
// with the binary the build made), and a fixture for suites that share one.
//
// Example:
//   TestServer server;
//   ASSERT_TRUE(server.Start().ok());
//   std::unique_ptr<client::ModelStateClient> c = server.NewClient();
#ifndef MODELSTATE_TESTS_TESTING_TEST_SERVER_H_
#define MODELSTATE_TESTS_TESTING_TEST_SERVER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/model_state_client.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"

namespace modelstate::testing {

class TestServer : public ServerProcess {
 public:
  // `flags` are passed to the server as they are.
  explicit TestServer(std::vector<std::string> flags = {})
      : ServerProcess(MODELSTATE_SERVER_BINARY, std::move(flags)) {}
};

// A test suite that shares one real server; each test gets a fresh client,
// and a test that leaves the server unhealthy fails. A suite with flags
// defines its own SetUpTestSuite() that calls StartServer(flags).
class SharedServerTest : public ::testing::Test {
 protected:
  static void StartServer(std::vector<std::string> flags) {
    server_ = new TestServer(std::move(flags));
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }
  static void SetUpTestSuite() { StartServer({}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    client_ = server_->NewClient();
    ASSERT_NE(client_, nullptr);
  }
  // Whatever a test sent, it never takes the server down.
  void TearDown() override {
    if (client_ != nullptr) {
      EXPECT_TRUE(client_->Health().ok());
    }
  }

  static inline TestServer* server_ = nullptr;
  std::unique_ptr<client::ModelStateClient> client_;
};

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_TEST_SERVER_H_
