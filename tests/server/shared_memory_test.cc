// The same-host shared-memory path against an in-process server: the C++
// client finds it, moves state_dicts through memfds with the same results
// as gRPC messages (tensors over the mapping itself, private to the
// client), and every misuse of the socket or the tokens is refused with a
// clear error; the opt-outs and a server without it fall back to messages.
#include "base/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/model_state_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/convert.h"
#include "server/shared_memory_exchange.h"
#include "tests/testing/in_process_server.h"
#include "tests/testing/requests.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"
#include "tests/testing/test_server.h"

namespace modelstate::testing {
namespace {

using ::testing::HasSubstr;

// Linear(256, 256) and a BatchNorm1d: aligned weights big enough to be
// viewed in place, small vectors that are copied, and buffers.
constexpr char kSpec[] = R"({"type": "Sequential", "children": [
  {"spec": {"type": "Linear", "args": [256, 256]}},
  {"spec": {"type": "BatchNorm1d", "args": [256]}}]})";

// A ring of two one-page slots: a small module's transfer wraps around it
// many times.
client::ClientOptions SmallRing() {
  client::ClientOptions options;
  options.ring_slots = 2;
  options.ring_slot_bytes = 4096;
  return options;
}

// The default ring, its slots only (no direct table).
client::ClientOptions SlotsOnly(client::ClientOptions options = {}) {
  options.shared_memory_direct = false;
  return options;
}

// A MemorySink that counts how its bytes arrived: copied in by Append, or
// written by the server where Destinations said (Placed).
class CountingMemorySink : public client::MemorySink {
 public:
  explicit CountingMemorySink(bool offer = true,
                              const StateDict* into = nullptr)
      : MemorySink(into), offer_(offer) {}
  absl::Status Append(absl::string_view bytes) override {
    appended += bytes.size();
    return MemorySink::Append(bytes);
  }
  std::vector<absl::Span<char>> Destinations() override {
    if (!offer_) return {};
    return MemorySink::Destinations();
  }
  absl::Status Placed(uint64_t n) override {
    placed += n;
    return MemorySink::Placed(n);
  }
  uint64_t appended = 0;
  uint64_t placed = 0;

 private:
  const bool offer_;
};

// Sends `request` ('R' and what follows) with `fd` to the socket at
// `path`: the answer's text, or "ok" for a registration.
std::string RawRegister(const std::string& path, const std::string& request,
                        int fd) {
  absl::StatusOr<ScopedFd> socket = ConnectUnixSocket(path, absl::Seconds(5));
  if (!socket.ok()) return socket.status().ToString();
  if (!SendWithFd(socket->get(), request, fd).ok()) return "send failed";
  char code = 1;
  ScopedFd ignored;
  absl::StatusOr<size_t> n = ReceiveWithFd(socket->get(), &code, 1, &ignored);
  if (!n.ok() || *n == 0) return "no answer";
  // A registration keeps the connection open: read only the token.
  std::string rest(code == 0 ? kRingTokenBytes : 4096, '\0');
  n = ReceiveWithFd(socket->get(), rest.data(), rest.size(), &ignored);
  if (!n.ok()) return "no answer";
  return code == 0 ? "ok" : rest.substr(0, *n);
}

class SharedMemoryTest : public InProcessServerTest {
 protected:
  static void SetUpTestSuite() {
    StartServer([](server::ServerConfig& config) {
      config.metrics_listen = "127.0.0.1:0";
    });
  }

  void SetUp() override {
    InProcessServerTest::SetUp();
    module_ = absl::StrCat("shm/m", counter_++);
    ASSERT_THAT(client_->BuildModule(BuildRequest(module_, kSpec, 7)), IsOk());
  }

  // modelstate_shared_memory_bytes_total{direction}, or 0 before any.
  double SharedBytes(const std::string& direction) {
    const std::string address = server_->server().metrics_address();
    const size_t colon = address.rfind(':');
    httplib::Client http(address.substr(0, colon),
                         std::stoi(address.substr(colon + 1)));
    httplib::Result result = http.Get("/metrics");
    EXPECT_TRUE(result);
    if (!result) return -1;
    const std::string key =
        absl::StrCat("\nmodelstate_shared_memory_bytes_total{direction=\"",
                     direction, "\"} ");
    const size_t at = result->body.find(key);
    return at == std::string::npos
               ? 0
               : std::stod(result->body.substr(at + key.size()));
  }

  // A LoadStateDict start for `module_` with `state`'s header.
  v1::LoadStateDictRequest Start(const StateDict& state) {
    absl::StatusOr<std::unique_ptr<client::MemorySource>> source =
        client::MemorySource::Create(state);
    EXPECT_THAT(source.status(), IsOk());
    v1::LoadStateDictRequest message;
    message.mutable_start()->set_module(module_);
    convert::LayoutToHeader((*source)->layout(),
                            message.mutable_start()->mutable_header());
    return message;
  }

  // Sends `messages` as one LoadStateDict call on the raw stub.
  absl::Status RawLoad(const std::vector<v1::LoadStateDictRequest>& messages) {
    auto context = client_->NewContext(absl::Seconds(30));
    v1::LoadStateDictResponse response;
    auto writer = client_->stub().LoadStateDict(context.get(), &response);
    for (const auto& m : messages) writer->Write(m);
    writer->WritesDone();
    return convert::FromGrpcStatus(writer->Finish());
  }

  // A client that moves every byte as gRPC messages.
  std::unique_ptr<client::ModelStateClient> MessagesClient() {
    client::ClientOptions off;
    off.shared_memory = false;
    return server_->NewClient(off);
  }

  // A ring of two one-page slots, registered on the server's socket.
  struct Registered {
    std::unique_ptr<SharedRing> ring;
    RingRegistration registration;
  };
  Registered RegisterSmallRing() {
    Registered out;
    absl::StatusOr<std::unique_ptr<SharedRing>> ring =
        SharedRing::Create(2, 4096);
    EXPECT_THAT(ring.status(), IsOk());
    if (!ring.ok()) return out;
    out.ring = *std::move(ring);
    absl::StatusOr<RingRegistration> registration =
        RegisterRing(SocketPath(), *out.ring);
    EXPECT_THAT(registration.status(), IsOk());
    if (registration.ok()) out.registration = *std::move(registration);
    return out;
  }

  // A GetStateDict of `module` through the ring registered as `token`,
  // offering a direct table.
  static v1::GetStateDictRequest DirectGet(const std::string& module,
                                           const std::string& token) {
    v1::GetStateDictRequest get;
    get.set_module(module);
    get.set_shared_memory_ring(token);
    get.set_shared_memory_direct(true);
    return get;
  }

  std::string SocketPath() {
    return (server_->data_dir() / "shm.sock").string();
  }

  void ExpectUnchanged() {
    absl::StatusOr<StateDict> now = client_->GetStateDict(module_);
    ASSERT_THAT(now.status(), IsOk());
    ExpectSameState(*now, LocalBuild(kSpec, 7)->GetStateDict());
  }

  static inline int counter_ = 0;
  std::string module_;
};

TEST_F(SharedMemoryTest, InfoNamesTheSocketAndThisHost) {
  absl::StatusOr<v1::GetSharedMemoryInfoResponse> info =
      client_->GetSharedMemoryInfo();
  ASSERT_THAT(info.status(), IsOk());
  EXPECT_EQ(info->socket_path(), SocketPath());
  EXPECT_EQ(info->boot_id(), BootId());
  EXPECT_FALSE(info->boot_id().empty());
  // The socket is the server user's alone, like the rest of the data dir.
  EXPECT_EQ(
      std::filesystem::status(SocketPath()).permissions(),
      std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST_F(SharedMemoryTest, GetStateDictThroughTheRingMatchesMessages) {
  const StateDict want = LocalBuild(kSpec, 7)->GetStateDict();
  const uint64_t total = (256 * 256 + 256 + 4 * 256) * 4 + 8;
  for (const client::ClientOptions& options :
       {SlotsOnly(), SlotsOnly(SmallRing())}) {
    const double before = SharedBytes("get");
    auto shared = server_->NewClient(options);
    std::vector<uint64_t> progress;
    client::GetStateDictOptions get;
    get.progress = [&](uint64_t done, uint64_t) { progress.push_back(done); };
    client::MemorySink sink;
    ASSERT_THAT(shared->GetStateDict(module_, get, sink), IsOk());
    ExpectSameState(sink.state_dict(), want);
    EXPECT_EQ(SharedBytes("get") - before, total);
    // One progress report per chunk: a slot's worth at a time.
    EXPECT_EQ(progress.size(),
              (total + options.ring_slot_bytes - 1) / options.ring_slot_bytes);
    EXPECT_EQ(progress.back(), total);
    // The ring is reused: a second fetch on the same client.
    absl::StatusOr<StateDict> again = shared->GetStateDict(module_);
    ASSERT_THAT(again.status(), IsOk());
    ExpectSameState(*again, want);
  }
  absl::StatusOr<StateDict> messages = MessagesClient()->GetStateDict(module_);
  ASSERT_THAT(messages.status(), IsOk());
  ExpectSameState(*messages, want);
}

TEST_F(SharedMemoryTest, GetStateDictWritesStraightIntoTheNewTensors) {
  const StateDict want = LocalBuild(kSpec, 7)->GetStateDict();
  const uint64_t total = (256 * 256 + 256 + 4 * 256) * 4 + 8;
  for (const client::ClientOptions& options :
       {client::ClientOptions(), SmallRing()}) {
    const double before = SharedBytes("get");
    auto shared = server_->NewClient(options);
    std::vector<uint64_t> progress;
    client::GetStateDictOptions get;
    get.progress = [&](uint64_t done, uint64_t) { progress.push_back(done); };
    CountingMemorySink sink;
    ASSERT_THAT(shared->GetStateDict(module_, get, sink), IsOk());
    ExpectSameState(sink.state_dict(), want);
    EXPECT_EQ(sink.placed, total);
    EXPECT_EQ(sink.appended, 0u);
    EXPECT_EQ(SharedBytes("get") - before, total);
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back(), total);
    // Converted on the fly, and a filtered selection, land the same way.
    client::GetStateDictOptions half;
    half.target_dtype = DType::kFloat16;
    half.key_prefix = "1.";
    CountingMemorySink converted;
    ASSERT_THAT(shared->GetStateDict(module_, half, converted), IsOk());
    EXPECT_GT(converted.placed, 0u);
    absl::StatusOr<StateDict> by_messages =
        MessagesClient()->GetStateDict(module_, half);
    ASSERT_THAT(by_messages.status(), IsOk());
    ExpectSameState(converted.state_dict(), *by_messages);
  }
}

// A replica refreshed in place: on this host the server writes into the
// caller's tensors themselves (no new memory); through the slots or as
// messages the bytes are copied there; all three leave the same state.
TEST_F(SharedMemoryTest, GetStateDictIntoWritesTheCallersTensors) {
  const StateDict want = LocalBuild(kSpec, 7)->GetStateDict();
  const uint64_t total = (256 * 256 + 256 + 4 * 256) * 4 + 8;
  struct Way {
    const char* name;
    std::unique_ptr<client::ModelStateClient> client;
    bool placed;
  };
  Way ways[] = {{"direct", server_->NewClient(), true},
                {"slots", server_->NewClient(SlotsOnly(SmallRing())), false},
                {"messages", MessagesClient(), false}};
  for (Way& way : ways) {
    SCOPED_TRACE(way.name);
    StateDict into;
    for (const auto& item : LocalBuild(kSpec, 99)->GetStateDict().tensors) {
      into.tensors.Set(item.key, *item.value.Clone());
    }
    std::vector<const void*> memory;
    for (const auto& item : into.tensors)
      memory.push_back(item.value.raw_data());
    CountingMemorySink sink(/*offer=*/true, &into);
    ASSERT_THAT(way.client->GetStateDict(module_, {}, sink), IsOk());
    ExpectSameState(into, want);
    EXPECT_EQ(sink.placed, way.placed ? total : 0);
    EXPECT_EQ(sink.placed + sink.appended, total);
    size_t i = 0;
    for (const auto& item : into.tensors) {
      EXPECT_EQ(item.value.raw_data(), memory[i++]) << item.key;
      EXPECT_TRUE(
          sink.state_dict().tensors.Find(item.key)->is_same(item.value));
    }
    // The convenience call, a second time over the same tensors.
    ASSERT_THAT(way.client->GetStateDictInto(module_, into), IsOk());
    ExpectSameState(into, want);
  }
}

// Targets that do not fit are refused before any byte moves, naming the
// key; the caller's tensors are untouched, and the client works after.
TEST_F(SharedMemoryTest, GetStateDictIntoRefusesTargetsThatDoNotFit) {
  auto shared = server_->NewClient();
  StateDict into = LocalBuild(kSpec, 99)->GetStateDict();
  const StateDict before = LocalBuild(kSpec, 99)->GetStateDict();
  into.tensors.Erase("1.running_var");
  EXPECT_THAT(shared->GetStateDictInto(module_, into),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("into: no tensor for '1.running_var'")));
  client::GetStateDictOptions half;
  half.target_dtype = DType::kFloat16;
  EXPECT_THAT(shared->GetStateDictInto(module_, into, half),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("into['0.weight']: float32 [256, 256], but "
                                 "the fetched entry is float16 [256, 256]")));
  for (const auto& item : into.tensors) {
    EXPECT_TRUE(TensorsEqual(item.value, *before.tensors.Find(item.key)))
        << item.key;
  }
  // A selection needs only its own keys (the Linear's, not the missing
  // BatchNorm buffer).
  client::GetStateDictOptions linear;
  linear.key_prefix = "0.";
  const Tensor threes = *Tensor::Full(DType::kFloat32, {256}, 3.0);
  into.tensors.Set("1.weight", *threes.Clone());
  ASSERT_THAT(shared->GetStateDictInto(module_, into, linear), IsOk());
  const StateDict want = LocalBuild(kSpec, 7)->GetStateDict();
  EXPECT_TRUE(TensorsEqual(*into.tensors.Find("0.weight"),
                           *want.tensors.Find("0.weight")));
  EXPECT_TRUE(TensorsEqual(*into.tensors.Find("1.weight"), threes));
}

TEST_F(SharedMemoryTest, DirectWritesFallBackToTheSlots) {
  const StateDict want = LocalBuild(kSpec, 7)->GetStateDict();
  const uint64_t total = (256 * 256 + 256 + 4 * 256) * 4 + 8;
  // The client's opt-out, and a sink with no memory to offer.
  CountingMemorySink opted_out;
  ASSERT_THAT(
      server_->NewClient(SlotsOnly())->GetStateDict(module_, {}, opted_out),
      IsOk());
  CountingMemorySink declined(/*offer=*/false);
  ASSERT_THAT(server_->NewClient()->GetStateDict(module_, {}, declined),
              IsOk());
  for (CountingMemorySink* sink : {&opted_out, &declined}) {
    ExpectSameState(sink->state_dict(), want);
    EXPECT_EQ(sink->appended, total);
    EXPECT_EQ(sink->placed, 0u);
  }
  // A server that writes into no client's memory.
  InProcessServer server([](server::ServerConfig& config) {
    config.shared_memory_direct = false;
  });
  ASSERT_THAT(server.Start(), IsOk());
  auto client = server.NewClient();
  ASSERT_THAT(client->BuildModule(BuildRequest("m", kSpec, 7)), IsOk());
  CountingMemorySink offered;
  ASSERT_THAT(client->GetStateDict("m", {}, offered), IsOk());
  ExpectSameState(offered.state_dict(), want);
  EXPECT_EQ(offered.appended, total);
  EXPECT_EQ(offered.placed, 0u);
}

TEST_F(SharedMemoryTest, BadDirectTablesAreRefused) {
  Registered registered = RegisterSmallRing();
  ASSERT_FALSE(registered.registration.token.empty());
  SharedRing& ring = *registered.ring;
  std::vector<char> memory(256 * 256 * 4);
  // Answers the header with `table` (its size, or `count` when not 0);
  // the call's status.
  auto fetch = [&](const std::vector<DirectTarget>& table, uint64_t count) {
    ring.set_consumed(0);
    ring.BeginDirectCall();
    auto context = client_->NewContext(absl::Seconds(30));
    auto reader = client_->stub().GetStateDict(
        context.get(), DirectGet(module_, registered.registration.token));
    v1::StateDictChunk chunk;
    EXPECT_TRUE(reader->Read(&chunk));
    EXPECT_TRUE(chunk.has_header());
    if (count == 0) {
      EXPECT_TRUE(ring.OfferDirectTable(table));
    } else {
      // Only the wrong count is published (offering the table first would
      // let the server take its true count before this one lands). The
      // answer word is the memfd's bytes 8 to 15.
      MappedRegion view(
          mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ring.fd(), 0),
          4096);
      __atomic_store_n(reinterpret_cast<uint64_t*>(view.data() + 8), count,
                       __ATOMIC_RELEASE);
    }
    while (reader->Read(&chunk)) {
    }
    return convert::FromGrpcStatus(reader->Finish());
  };
  const StateDict state = LocalBuild(kSpec, 7)->GetStateDict();
  std::vector<DirectTarget> right;
  for (const auto& item : state.tensors) {
    right.push_back(
        {reinterpret_cast<uintptr_t>(memory.data()), item.value.nbytes()});
  }
  EXPECT_THAT(fetch({right[0]}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shared_memory_direct: the direct table has "
                                 "1 entries; the header has 7")));
  std::vector<DirectTarget> short_bias = right;
  short_bias[1].length = 4;
  EXPECT_THAT(fetch(short_bias, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("entry '0.bias' has 4 bytes at")));
  EXPECT_THAT(fetch(right, 1000000),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shared_memory_direct: the direct table has "
                                 "1000000 entries; the header has 7")));
  // The address range may not wrap around.
  std::vector<DirectTarget> wrapping = right;
  wrapping[0].address = ~uint64_t{0} - 16;
  EXPECT_THAT(fetch(wrapping, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("entry '0.weight' has 262144 bytes at")));
  // Memory that goes missing part-way: the entry is named.
  std::vector<DirectTarget> gone = right;
  gone[1].address = 64;
  EXPECT_THAT(fetch(gone, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not the client's memory: Bad address "
                                 "(entry '0.bias')")));
  // Memory this process does not have (the first page is never mapped).
  std::vector<DirectTarget> nowhere = right;
  for (DirectTarget& target : nowhere) target.address = 64;
  EXPECT_THAT(fetch(nowhere, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not the client's memory")));
  // Each entry written over the same bytes: the last one's are there.
  ASSERT_THAT(fetch(right, 0), IsOk());
  const Tensor* last = state.tensors.Find("1.num_batches_tracked");
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(std::memcmp(memory.data(), last->raw_data(), last->nbytes()), 0);
  ExpectUnchanged();
}

// A client that stops a call (its deadline, a failure of its own) must
// know that nothing more is written where its table said before it frees
// that memory.
TEST_F(SharedMemoryTest, AStoppedDirectCallWritesNothingMore) {
  const std::string module = module_ + "-big";
  ASSERT_THAT(client_->BuildModule(BuildRequest(
                  module, R"({"type": "Linear", "args": [4096, 4096]})", 3)),
              IsOk());
  Registered registered = RegisterSmallRing();
  ASSERT_FALSE(registered.registration.token.empty());
  SharedRing& ring = *registered.ring;
  ring.set_consumed(0);
  const uint64_t call = ring.BeginDirectCall();
  std::vector<char> weight(size_t{4096} * 4096 * 4);
  std::vector<char> bias(4096 * 4);
  auto context = client_->NewContext(absl::Seconds(30));
  auto reader = client_->stub().GetStateDict(
      context.get(), DirectGet(module, registered.registration.token));
  v1::StateDictChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  ASSERT_TRUE(chunk.has_header());
  ASSERT_TRUE(ring.OfferDirectTable(
      {{reinterpret_cast<uintptr_t>(weight.data()), weight.size()},
       {reinterpret_cast<uintptr_t>(bias.data()), bias.size()}}));
  ASSERT_TRUE(ring.StopDirectWrites(call, absl::Seconds(10)));
  // From here on the memory is the client's alone.
  std::memset(weight.data(), 0x5a, weight.size());
  std::memset(bias.data(), 0x5a, bias.size());
  while (reader->Read(&chunk)) {
  }
  EXPECT_THAT(convert::FromGrpcStatus(reader->Finish()),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("shared_memory_direct: the client stopped "
                                 "the call")));
  EXPECT_TRUE(std::all_of(weight.begin(), weight.end(),
                          [](char c) { return c == 0x5a; }));
  EXPECT_TRUE(
      std::all_of(bias.begin(), bias.end(), [](char c) { return c == 0x5a; }));
}

TEST_F(SharedMemoryTest, LoadStateDictThroughTheRing) {
  for (const client::ClientOptions& options :
       {client::ClientOptions(), SmallRing()}) {
    StateDict state = LocalBuild(kSpec, 99)->GetStateDict();
    const double before = SharedBytes("load");
    absl::StatusOr<v1::LoadStateDictResponse> loaded =
        server_->NewClient(options)->LoadStateDict(module_, state);
    ASSERT_THAT(loaded.status(), IsOk());
    EXPECT_EQ(loaded->repr(), "<All keys matched successfully>");
    EXPECT_GT(SharedBytes("load"), before);
    absl::StatusOr<StateDict> back = MessagesClient()->GetStateDict(module_);
    ASSERT_THAT(back.status(), IsOk());
    ExpectSameState(*back, state);
  }
}

TEST_F(SharedMemoryTest, StrictErrorsAreTheSameAsWithMessages) {
  StateDict state = LocalBuild(kSpec, 1)->GetStateDict();
  state.tensors.Erase("1.running_var");
  state.tensors.Set("extra", Filled(DType::kFloat32, {1024}, 1.0));
  // Not atomic, so that the bytes travel before the load fails.
  client::LoadStateDictOptions partial;
  partial.load.atomic = false;
  const double before = SharedBytes("load");
  absl::StatusOr<v1::LoadStateDictResponse> shared =
      client_->LoadStateDict(module_, state, partial);
  absl::StatusOr<v1::LoadStateDictResponse> messages =
      MessagesClient()->LoadStateDict(module_, state, partial);
  ASSERT_FALSE(shared.ok());
  EXPECT_GT(SharedBytes("load"), before);  // the bytes went through the ring
  EXPECT_EQ(shared.status(), messages.status());
  EXPECT_THAT(shared.status().message(),
              HasSubstr("Missing key(s) in state_dict: \"1.running_var\""));
}

TEST_F(SharedMemoryTest, OptOutsUseMessages) {
  const double get = SharedBytes("get");
  const double load = SharedBytes("load");
  ASSERT_THAT(MessagesClient()->GetStateDict(module_).status(), IsOk());
  setenv("MODELSTATE_SHARED_MEMORY", "0", 1);
  auto by_env = server_->NewClient();
  absl::StatusOr<StateDict> state = by_env->GetStateDict(module_);
  ASSERT_THAT(state.status(), IsOk());
  ASSERT_THAT(by_env->LoadStateDict(module_, *state).status(), IsOk());
  unsetenv("MODELSTATE_SHARED_MEMORY");
  EXPECT_EQ(SharedBytes("get"), get);
  EXPECT_EQ(SharedBytes("load"), load);
}

TEST_F(SharedMemoryTest, UnknownRingsAreRefused) {
  v1::GetStateDictRequest get;
  get.set_module(module_);
  get.set_shared_memory_ring(std::string(16, 'x'));
  auto context = client_->NewContext(absl::Seconds(30));
  auto reader = client_->stub().GetStateDict(context.get(), get);
  v1::StateDictChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_THAT(convert::FromGrpcStatus(reader->Finish()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shared_memory_ring: no ring is registered")));
  v1::LoadStateDictRequest start = Start(LocalBuild(kSpec, 3)->GetStateDict());
  start.mutable_start()->set_shared_memory_ring(std::string(16, 'x'));
  EXPECT_THAT(RawLoad({start}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("start.shared_memory_ring: no ring")));
  ExpectUnchanged();
}

TEST_F(SharedMemoryTest, StrayMessagesAreRefused) {
  StateDict state = LocalBuild(kSpec, 3)->GetStateDict();
  v1::LoadStateDictRequest ring_bytes;
  ring_bytes.set_ring_bytes(4096);
  EXPECT_THAT(RawLoad({Start(state), ring_bytes}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ring_bytes: the start named no "
                                 "shared_memory_ring")));
  Registered registered = RegisterSmallRing();
  ASSERT_FALSE(registered.registration.token.empty());
  v1::LoadStateDictRequest start = Start(state);
  start.mutable_start()->set_shared_memory_ring(registered.registration.token);
  v1::LoadStateDictRequest data;
  data.set_data("abcd");
  EXPECT_THAT(RawLoad({start, data}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data:")));
  ring_bytes.set_ring_bytes(4097);
  EXPECT_THAT(RawLoad({start, ring_bytes}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ring_bytes: 4097; from 1 to the slot size")));
  ExpectUnchanged();
}

TEST_F(SharedMemoryTest, ARingServesOneCallAtATime) {
  Registered registered = RegisterSmallRing();
  ASSERT_FALSE(registered.registration.token.empty());
  registered.ring->set_consumed(0);
  v1::GetStateDictRequest get;
  get.set_module(module_);
  get.set_shared_memory_ring(registered.registration.token);
  // The first call fills both slots, then waits 10 s for a consumer that
  // never comes; the second waits 2 s for the ring, then is refused.
  auto first_context = client_->NewContext(absl::Seconds(30));
  auto first = client_->stub().GetStateDict(first_context.get(), get);
  v1::StateDictChunk chunk;
  ASSERT_TRUE(first->Read(&chunk));
  ASSERT_TRUE(chunk.has_header());
  ASSERT_TRUE(first->Read(&chunk));
  EXPECT_EQ(chunk.ring_bytes(), 4096u);
  auto second_context = client_->NewContext(absl::Seconds(30));
  auto second = client_->stub().GetStateDict(second_context.get(), get);
  EXPECT_FALSE(second->Read(&chunk));
  EXPECT_THAT(convert::FromGrpcStatus(second->Finish()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("another call is using this ring")));
  first_context->TryCancel();
  while (first->Read(&chunk)) {
  }
  EXPECT_EQ(first->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// A client that refuses a fetch midway (a target that does not fit)
// cancels it and may start its next call before the server has unwound
// the first: that next call waits for the ring instead of being refused.
TEST_F(SharedMemoryTest, TheNextCallWaitsForTheCancelledOne) {
  const uint64_t total = (256 * 256 + 256 + 4 * 256) * 4 + 8;
  Registered registered = RegisterSmallRing();
  ASSERT_FALSE(registered.registration.token.empty());
  SharedRing& ring = *registered.ring;
  ring.set_consumed(0);
  v1::GetStateDictRequest get;
  get.set_module(module_);
  get.set_shared_memory_ring(registered.registration.token);
  auto first_context = client_->NewContext(absl::Seconds(30));
  auto first = client_->stub().GetStateDict(first_context.get(), get);
  v1::StateDictChunk chunk;
  ASSERT_TRUE(first->Read(&chunk));
  ASSERT_TRUE(chunk.has_header());
  std::atomic<bool> second_ended{false};
  absl::Status second_status;
  uint64_t second_bytes = 0;
  std::thread second([&] {
    auto context = client_->NewContext(absl::Seconds(30));
    auto reader = client_->stub().GetStateDict(context.get(), get);
    v1::StateDictChunk piece;
    uint64_t consumed = 0;
    while (reader->Read(&piece)) {
      if (piece.payload_case() != v1::StateDictChunk::kRingBytes) continue;
      second_bytes += piece.ring_bytes();
      ring.set_consumed(++consumed);
    }
    second_status = convert::FromGrpcStatus(reader->Finish());
    second_ended = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(second_ended.load()) << second_status;
  first_context->TryCancel();
  while (first->Read(&chunk)) {
  }
  EXPECT_EQ(first->Finish().error_code(), grpc::StatusCode::CANCELLED);
  second.join();
  EXPECT_THAT(second_status, IsOk());
  EXPECT_EQ(second_bytes, total);
}

TEST_F(SharedMemoryTest, ARingLastsAsLongAsItsRegistration) {
  Registered registered = RegisterSmallRing();
  ASSERT_FALSE(registered.registration.token.empty());
  v1::LoadStateDictRequest start = Start(LocalBuild(kSpec, 3)->GetStateDict());
  start.mutable_start()->set_shared_memory_ring(registered.registration.token);
  v1::LoadStateDictRequest nothing;  // fails after the ring was lent
  nothing.set_data("x");
  EXPECT_THAT(RawLoad({start, nothing}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data:")));
  // The client closes the connection (or exits): the server lets go.
  ASSERT_THAT(registered.registration.connection.Close("registration"), IsOk());
  absl::Status refused;
  for (int i = 0; i < 100; ++i) {
    refused = RawLoad({start, nothing});
    if (absl::StrContains(refused.message(), "no ring is registered")) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("start.shared_memory_ring: no ring "
                                          "is registered")));
}

// The rings a server keeps are bounded in count and bytes; a registration
// beyond is refused (before the ring is mapped) and the client falls back
// to messages. A ring given back makes room again.
TEST(SharedMemoryExchangeTest, RingsAreBoundedInCountAndBytes) {
  const std::string socket = (std::filesystem::temp_directory_path() /
                              absl::StrCat("shm-limits-", getpid(), ".sock"))
                                 .string();
  SharedMemoryExchange::Options options;
  options.socket_path = socket;
  options.max_rings = 1;
  options.max_ring_bytes = 4 * 4096;  // a header and 3 slot pages
  absl::StatusOr<std::unique_ptr<SharedMemoryExchange>> exchange =
      SharedMemoryExchange::Start(options);
  ASSERT_THAT(exchange.status(), IsOk());
  auto ring = [](uint32_t slots) { return *SharedRing::Create(slots, 4096); };
  std::unique_ptr<SharedRing> big = ring(4);
  EXPECT_THAT(RegisterRing(socket, *big).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("(at most 1 and 16384 bytes)")));
  std::unique_ptr<SharedRing> first = ring(2), second = ring(2);
  absl::StatusOr<RingRegistration> kept = RegisterRing(socket, *first);
  ASSERT_THAT(kept.status(), IsOk());
  EXPECT_THAT(RegisterRing(socket, *second).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("holds 1 rings of 12288 bytes already")));
  // Its registration closed, the first ring is forgotten: room again.
  kept = absl::CancelledError("closed");
  absl::StatusOr<RingRegistration> again = RegisterRing(socket, *second);
  for (int i = 0; i < 100 && !again.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    again = RegisterRing(socket, *second);
  }
  EXPECT_THAT(again.status(), IsOk());
}

TEST_F(SharedMemoryTest, BadRingsAreRefusedAtRegistration) {
  const std::string request = absl::StrCat("R", EncodeU32(2), EncodeU32(4096));
  ScopedFd unsealed(memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(unsealed.get(), 4096 * 3), 0);
  EXPECT_THAT(RawRegister(SocketPath(), request, unsealed.get()),
              HasSubstr("must be sealed against growing and shrinking"));
  ASSERT_EQ(fcntl(unsealed.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK), 0);
  EXPECT_EQ(RawRegister(SocketPath(), request, unsealed.get()), "ok");
  EXPECT_THAT(RawRegister(SocketPath(),
                          absl::StrCat("R", EncodeU32(2), EncodeU32(8192)),
                          unsealed.get()),
              HasSubstr("must hold 4096 + slots * slot_bytes"));
  EXPECT_THAT(RawRegister(SocketPath(),
                          absl::StrCat("R", EncodeU32(1), EncodeU32(8192)),
                          unsealed.get()),
              HasSubstr("1 slots"));
  EXPECT_THAT(
      RawRegister(SocketPath(), absl::StrCat("R", EncodeU32(2), EncodeU32(100)),
                  unsealed.get()),
      HasSubstr("a multiple of 4096"));
  EXPECT_THAT(RawRegister(SocketPath(), request, -1),
              HasSubstr("must carry the ring's memfd"));
  ScopedFd plain(open((server_->data_dir() / "audit.log").c_str(), O_RDONLY));
  EXPECT_THAT(RawRegister(SocketPath(), request, plain.get()),
              HasSubstr("not a memfd"));
  EXPECT_THAT(RawRegister(SocketPath(), "Q", -1), HasSubstr("unknown request"));
  ScopedFd write_sealed(
      memfd_create("write-sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(write_sealed.get(), 4096 * 3), 0);
  ASSERT_EQ(fcntl(write_sealed.get(), F_ADD_SEALS,
                  F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_WRITE),
            0);
  EXPECT_THAT(RawRegister(SocketPath(), request, write_sealed.get()),
              HasSubstr("must not be sealed against writes"));
}

// Whether a child of this process may write this process's memory (what
// a server started by the test does to its client): the kernel's answer
// here, so that the test expects what this machine allows.
bool ChildMayWriteParent() {
  static char target = 0;
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child == 0) {
    char one = 1;
    iovec local{&one, 1};
    iovec remote{&target, 1};
    _exit(process_vm_writev(parent, &local, 1, &remote, 1, 0) == 1 ? 0 : 1);
  }
  int status = 1;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// A server in a process of its own: it writes the client's tensors itself
// where the kernel lets it, and sends through the slots where it does not
// (the client not dumpable, the server without CAP_SYS_PTRACE).
TEST(SharedMemoryProcessTest, DirectWritesCrossProcessesOrFallBack) {
  const StateDict want = LocalBuild(kSpec, 5)->GetStateDict();
  const uint64_t total = (256 * 256 + 256 + 4 * 256) * 4 + 8;
  const bool allowed = ChildMayWriteParent();
  for (bool refused : {false, true}) {
    SCOPED_TRACE(refused ? "refused" : "as the kernel allows");
    TestServer server;
    server.set_without_ptrace(refused);
    ASSERT_THAT(server.Start(), IsOk());
    auto client = server.NewClient();
    ASSERT_THAT(client->BuildModule(BuildRequest("m", kSpec, 5)), IsOk());
    if (refused) {
      ASSERT_EQ(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), 0);
    }
    CountingMemorySink sink;
    const absl::Status got = client->GetStateDict("m", {}, sink);
    if (refused) prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    ASSERT_THAT(got, IsOk());
    ExpectSameState(sink.state_dict(), want);
    const bool direct = allowed && !refused;
    EXPECT_EQ(sink.placed, direct ? total : 0u);
    EXPECT_EQ(sink.appended, direct ? 0u : total);
  }
}

TEST(SharedMemoryServerTest, OffMeansMessages) {
  InProcessServer server(
      [](server::ServerConfig& config) { config.shared_memory = false; });
  ASSERT_THAT(server.Start(), IsOk());
  auto client = server.NewClient();
  absl::StatusOr<v1::GetSharedMemoryInfoResponse> info =
      client->GetSharedMemoryInfo();
  ASSERT_THAT(info.status(), IsOk());
  EXPECT_EQ(info->socket_path(), "");
  EXPECT_FALSE(std::filesystem::exists(server.data_dir() / "shm.sock"));
  ASSERT_THAT(client->BuildModule(BuildRequest("m", kSpec, 2)), IsOk());
  absl::StatusOr<StateDict> state = client->GetStateDict("m");
  ASSERT_THAT(state.status(), IsOk());
  ExpectSameState(*state, LocalBuild(kSpec, 2)->GetStateDict());
  ASSERT_THAT(client->LoadStateDict("m", *state).status(), IsOk());
}

TEST(SharedMemoryServerTest, AnExplicitSocketThatCannotBeBoundStopsTheStart) {
  InProcessServer server([](server::ServerConfig& config) {
    config.shm_socket = "/nonexistent-dir/shm.sock";
  });
  absl::Status started = server.Start();
  EXPECT_FALSE(started.ok());
  EXPECT_THAT(started.message(),
              HasSubstr("cannot open the shared memory socket"));
}

}  // namespace
}  // namespace modelstate::testing
