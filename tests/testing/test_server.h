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

#include <sys/wait.h>

#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/model_state_client.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"

namespace modelstate::testing {

class TestServer : public ServerProcess {
 public:
  // `flags` are passed to the server as they are.
  explicit TestServer(std::vector<std::string> flags = {})
      : ServerProcess(MODELSTATE_SERVER_BINARY, std::move(flags)) {}
  // When the test (or, for a shared server, the suite) failed, prints how
  // the server ended and the end of its log, which goes with its directory:
  // a crash seen by the client only as "Socket closed" shows its cause.
  ~TestServer() {
    const bool was_running = running();
    const int status = Stop();
    if (!CurrentTestFailed()) return;
    constexpr size_t kTail = 16 << 10;
    std::string log = Log();
    if (log.size() > kTail) log.erase(0, log.size() - kTail);
    std::string ended = "was not running";
    if (was_running) {
      ended = WIFSIGNALED(status)
                  ? absl::StrCat("ended by signal ", WTERMSIG(status))
                  : absl::StrCat("exited with ", WEXITSTATUS(status));
    }
    std::cerr << "[test server " << dir().string() << "] " << ended
              << "; the end of its log:\n"
              << log << "\n";
  }

 private:
  static bool CurrentTestFailed() {
    const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
    if (const ::testing::TestInfo* test = unit.current_test_info()) {
      return test->result()->Failed();
    }
    const ::testing::TestSuite* suite = unit.current_test_suite();
    return suite != nullptr && suite->failed_test_count() > 0;
  }
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
