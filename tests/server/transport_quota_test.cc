// File: transport_quota_test.cc
// --max_transport_mib against the real server binary. gRPC receives a unary
// request whole before the server can look at its token, so many concurrent
// large requests with a bad token hold the sum of their sizes; with a
// transport quota gRPC cancels streams once its buffers pass the quota, and
// the server's peak memory stays near a small multiple of it.
//
// Example:
//   ctest -R TransportQuota
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "client/model_state_client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "tests/testing/proc_status.h"
#include "tests/testing/requests.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BuildRequest;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::kRssIsTheProgram;
using ::modelstate::testing::ProcStatusBytes;
using ::modelstate::testing::TestServer;

constexpr uint64_t kMiB = uint64_t{1} << 20;
// 24 callers of 16 MiB each: the flood the README's figures describe (24 x
// 60 MiB), scaled to what a test machine spares; the test's own memory is
// one payload that every call shares.
constexpr int kCallers = 24;
constexpr int kRounds = 1;
constexpr uint64_t kRequestBytes = 16 * kMiB;
constexpr int kMaxMessageMib = 17;
constexpr int kQuotaMib = 2 * kMaxMessageMib;  // the least the flag allows
// The bound asserted over the baseline: gRPC's quota is soft (it reclaims
// after the fact) and each request received is copied once more when it is
// parsed, so 4x the quota; without the quota the flood goes well past it.
constexpr uint64_t kPeakOverBaseline = 4 * kQuotaMib * kMiB;

// A BuildModuleRequest of `bytes` bytes: field 15, length-delimited, which
// the server's proto does not know (gRPC reads it whole all the same).
grpc::ByteBuffer LargeRequest(uint64_t bytes) {
  std::string message = "\x7a";
  uint64_t length = bytes - 1 - 4;
  for (int i = 0; i < 4; ++i) {  // a 4-byte varint, for any 28-bit length
    message.push_back(static_cast<char>((length & 0x7f) | (i < 3 ? 0x80 : 0)));
    length >>= 7;
  }
  message.resize(bytes, 'x');
  grpc::Slice slice(message);
  return grpc::ByteBuffer(&slice, 1);
}

// One unary BuildModule carrying `request`, with `token`, on its own
// connection (channels with equal arguments would share one).
grpc::Status CallAlone(const std::string& address, int connection,
                       const grpc::ByteBuffer& request,
                       const std::string& token) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt("modelstate.test.connection", connection);
  grpc::GenericStub stub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + token);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&context, "/modelstate.v1.ModelStateService/BuildModule",
                 grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return status;
}

struct Flood {
  uint64_t baseline = 0;  // VmRSS before
  uint64_t peak = 0;      // VmHWM after
  std::map<grpc::StatusCode, int> codes;
};

// kCallers clients, each on its own connection, send kRounds large
// requests each with a bad token, all at once.
Flood FloodWithBadTokens(const TestServer& server) {
  Flood flood;
  flood.baseline = ProcStatusBytes(server.pid(), "VmRSS");
  const grpc::ByteBuffer request = LargeRequest(kRequestBytes);
  std::mutex mu;
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int round = 0; round < kRounds; ++round) {
        const grpc::Status status =
            CallAlone(server.address(), i, request, "not-a-token");
        std::lock_guard<std::mutex> lock(mu);
        ++flood.codes[status.error_code()];
      }
    });
  }
  for (std::thread& t : callers) t.join();
  flood.peak = ProcStatusBytes(server.pid(), "VmHWM");
  return flood;
}

std::filesystem::path WriteTokenFile() {
  const std::filesystem::path tokens =
      std::filesystem::temp_directory_path() /
      absl::StrCat("transport-quota-tokens-", getpid(), ".json");
  std::ofstream(tokens) << R"({"principals": [{"identity": "root", )"
                        << R"("token_sha256": ")" << Sha256Hex("root-token")
                        << R"(", "roles": {"admin": ["*"]}}]})";
  std::filesystem::permissions(tokens, std::filesystem::perms::owner_read |
                                           std::filesystem::perms::owner_write);
  return tokens;
}

std::string Describe(const Flood& flood) {
  std::string codes;
  for (const auto& [code, count] : flood.codes) {
    absl::StrAppend(&codes, " code ", code, " x", count);
  }
  return absl::StrCat((flood.peak - flood.baseline) >> 20,
                      " MiB over a baseline of ", flood.baseline >> 20, " MiB;",
                      codes);
}

TEST(TransportQuotaTest, ABadTokenFloodIsHeldToTheQuota) {
  const std::filesystem::path tokens = WriteTokenFile();
  const std::vector<std::string> flags = {
      "--token_file=" + tokens.string(),
      absl::StrCat("--max_message_mib=", kMaxMessageMib)};

  // Without the quota: the flood's sum is received (what the bound is for).
  Flood unbounded;
  {
    TestServer server(flags);
    ASSERT_THAT(server.Start(), IsOk());
    unbounded = FloodWithBadTokens(server);
  }
  std::cerr << "without --max_transport_mib: " << Describe(unbounded) << "\n";
  EXPECT_EQ(unbounded.codes[grpc::StatusCode::UNAUTHENTICATED],
            kCallers * kRounds);

  std::vector<std::string> quota_flags = flags;
  quota_flags.push_back(absl::StrCat("--max_transport_mib=", kQuotaMib));
  TestServer server(quota_flags);
  ASSERT_THAT(server.Start(), IsOk());
  Flood bounded = FloodWithBadTokens(server);
  std::cerr << "with --max_transport_mib=" << kQuotaMib << ": "
            << Describe(bounded) << "\n";
  // Every call is refused: by the server (UNAUTHENTICATED) when gRPC
  // received it, by gRPC (RESOURCE_EXHAUSTED, or UNAVAILABLE when it closed
  // an idle connection to reclaim its buffers) when it did not.
  int refused = 0;
  for (const auto& [code, count] : bounded.codes) {
    EXPECT_TRUE(code == grpc::StatusCode::UNAUTHENTICATED ||
                code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                code == grpc::StatusCode::UNAVAILABLE)
        << code;
    refused += count;
  }
  EXPECT_EQ(refused, kCallers * kRounds);
  EXPECT_GT(bounded.codes[grpc::StatusCode::RESOURCE_EXHAUSTED], 0);
  if (kRssIsTheProgram) {
    EXPECT_LT(bounded.peak - bounded.baseline, kPeakOverBaseline);
    // Else the flood proves nothing about the quota.
    EXPECT_GT(unbounded.peak - unbounded.baseline, kPeakOverBaseline);
  }

  // The server serves as before: a request of the flood's size with a good
  // token gets through gRPC to the server, which finds no module name in it.
  EXPECT_EQ(CallAlone(server.address(), kCallers, LargeRequest(kRequestBytes),
                      "root-token")
                .error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  client::ClientOptions options;
  options.bearer_token = "root-token";
  std::unique_ptr<client::ModelStateClient> c = server.NewClient(options);
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(c->BuildModule(BuildRequest(
                  "t/after", R"({"type": "Linear", "args": [4, 2]})")),
              IsOk());
  std::error_code ignored;
  std::filesystem::remove(tokens, ignored);
}

}  // namespace
}  // namespace modelstate
