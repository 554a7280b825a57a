// SharedRing on its own: its shape limits, what Adopt refuses, and a
// producer and a consumer on two threads moving a stream many times the
// ring's size through it (also run under TSan: the consumer counter is the
// only synchronisation besides the announcement).
#include "base/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modelstate {
namespace {

using ::testing::HasSubstr;

TEST(SharedRingTest, ShapesOutsideTheLimitsAreRefused) {
  EXPECT_THAT(SharedRing::Create(1, 4096).status().message(),
              HasSubstr("1 slots"));
  EXPECT_THAT(SharedRing::Create(65, 4096).status().message(),
              HasSubstr("65 slots"));
  EXPECT_THAT(SharedRing::Create(2, 1000).status().message(),
              HasSubstr("a multiple of 4096"));
  EXPECT_THAT(SharedRing::Create(2, uint64_t{128} << 20).status().message(),
              HasSubstr("at most"));
  EXPECT_TRUE(SharedRing::Create(2, 4096).ok());
}

TEST(SharedRingTest, AdoptNeedsASealedMemfdOfTheRightSize) {
  ScopedFd fd(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(fd.get(), 4096 * 3), 0);
  const int raw = fd.get();
  EXPECT_THAT(SharedRing::Adopt(ScopedFd(dup(raw)), 2, 4096).status().message(),
              HasSubstr("sealed against growing and shrinking"));
  ASSERT_EQ(fcntl(raw, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK), 0);
  EXPECT_THAT(SharedRing::Adopt(ScopedFd(dup(raw)), 2, 8192).status().message(),
              HasSubstr("must hold"));
  absl::StatusOr<std::unique_ptr<SharedRing>> adopted =
      SharedRing::Adopt(ScopedFd(dup(raw)), 2, 4096);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  // Sealed: the owner cannot pull the pages from under the mapping.
  EXPECT_NE(ftruncate(raw, 4096), 0);
  int ends[2];
  ASSERT_EQ(pipe(ends), 0);
  ScopedFd write_end(ends[1]);
  EXPECT_THAT(SharedRing::Adopt(ScopedFd(ends[0]), 2, 4096).status().message(),
              HasSubstr("not a memfd"));
}

TEST(SharedRingTest, TwoMappingsOfOneRingSeeEachOther) {
  absl::StatusOr<std::unique_ptr<SharedRing>> mine =
      SharedRing::Create(2, 4096);
  ASSERT_TRUE(mine.ok());
  absl::StatusOr<std::unique_ptr<SharedRing>> theirs =
      SharedRing::Adopt(ScopedFd(dup((*mine)->fd())), 2, 4096);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  std::memcpy((*mine)->slot(3), "hello", 5);  // chunk 3: slot 1
  EXPECT_EQ(std::string((*theirs)->slot(1), 5), "hello");
  (*theirs)->set_consumed(7);
  EXPECT_EQ((*mine)->consumed(), 7u);
}

TEST(SharedRingTest, AStreamGoesThroughInOrder) {
  absl::StatusOr<std::unique_ptr<SharedRing>> ring =
      SharedRing::Create(3, 4096);
  ASSERT_TRUE(ring.ok());
  SharedRing& producer_side = **ring;
  absl::StatusOr<std::unique_ptr<SharedRing>> adopted =
      SharedRing::Adopt(ScopedFd(dup(producer_side.fd())), 3, 4096);
  ASSERT_TRUE(adopted.ok());
  SharedRing& consumer_side = **adopted;
  constexpr uint64_t kChunks = 500;
  std::string sent(kChunks * 4096, '\0');
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>(i * 7);
  // The announcement: the gRPC message of a real transfer.
  std::atomic<uint64_t> announced{0};
  std::thread producer([&] {
    for (uint64_t chunk = 0; chunk < kChunks; ++chunk) {
      ASSERT_TRUE(producer_side.WaitForSlot(chunk, absl::Seconds(10),
                                            [] { return false; }));
      std::memcpy(producer_side.slot(chunk), sent.data() + chunk * 4096, 4096);
      announced.store(chunk + 1, std::memory_order_release);
    }
  });
  std::string received;
  for (uint64_t chunk = 0; chunk < kChunks; ++chunk) {
    while (announced.load(std::memory_order_acquire) <= chunk) {
      std::this_thread::yield();
    }
    received.append(consumer_side.slot(chunk), 4096);
    consumer_side.set_consumed(chunk + 1);
  }
  producer.join();
  EXPECT_TRUE(received == sent);
}

TEST(SharedRingTest, AProducerWaitsForAFullRingAndGivesUp) {
  absl::StatusOr<std::unique_ptr<SharedRing>> ring =
      SharedRing::Create(2, 4096);
  ASSERT_TRUE(ring.ok());
  (*ring)->set_consumed(0);
  EXPECT_TRUE(
      (*ring)->WaitForSlot(1, absl::ZeroDuration(), [] { return false; }));
  EXPECT_FALSE(
      (*ring)->WaitForSlot(2, absl::Milliseconds(50), [] { return false; }));
  EXPECT_FALSE((*ring)->WaitForSlot(2, absl::Seconds(10), [] { return true; }));
  (*ring)->set_consumed(1);
  EXPECT_TRUE(
      (*ring)->WaitForSlot(2, absl::ZeroDuration(), [] { return false; }));
}

TEST(SharedRingTest, ADirectTableGoesThroughTheRing) {
  absl::StatusOr<std::unique_ptr<SharedRing>> ring =
      SharedRing::Create(2, 4096);
  ASSERT_TRUE(ring.ok());
  SharedRing& r = **ring;
  const uint64_t call = r.BeginDirectCall();
  EXPECT_EQ(r.BeginDirectCall(), call + 1);  // each call a new number
  EXPECT_EQ(r.direct_table(), 0u);
  // No answer yet: the server's wait ends (its caller's deadline, or the
  // call's end).
  EXPECT_EQ(r.AwaitDirectTable(
                 3, absl::Milliseconds(20), [] { return false; }, "f")
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.AwaitDirectTable(
                 3, absl::Seconds(10), [] { return true; }, "f")
                .status()
                .code(),
            absl::StatusCode::kCancelled);
  const std::vector<DirectTarget> table = {{0x1000, 12}, {0, 0}, {~0ull, 7}};
  std::thread client([&] {
    absl::SleepFor(absl::Milliseconds(5));
    EXPECT_TRUE(r.OfferDirectTable(table));
  });
  absl::StatusOr<std::optional<SharedRing::DirectTable>> got =
      r.AwaitDirectTable(
          3, absl::Seconds(10), [] { return false; }, "f");
  client.join();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->call, call + 1);
  ASSERT_EQ((*got)->targets.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*got)->targets[i].address, table[i].address);
    EXPECT_EQ((*got)->targets[i].length, table[i].length);
  }
  // The count must be the header's.
  EXPECT_THAT(r.AwaitDirectTable(
                   4, absl::Seconds(1), [] { return false; }, "f")
                  .status()
                  .message(),
              HasSubstr("f: the direct table has 3 entries; the header has 4"));
  // A table the slots cannot hold (512 targets here) is declined by the
  // client, and refused by the server if a client answers one anyway.
  r.BeginDirectCall();
  EXPECT_FALSE(r.OfferDirectTable(std::vector<DirectTarget>(513)));
  EXPECT_EQ(r.direct_table(), kDirectTableDeclined);
  got = r.AwaitDirectTable(
      513, absl::Seconds(1), [] { return false; }, "f");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  MappedRegion view(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd(), 0), 4096);
  __atomic_store_n(reinterpret_cast<uint64_t*>(view.data() + 8), 513,
                   __ATOMIC_RELEASE);
  EXPECT_THAT(
      r.AwaitDirectTable(
           513, absl::Seconds(1), [] { return false; }, "f")
          .status()
          .message(),
      HasSubstr("f: a direct table of 513 entries; the ring's slots hold at "
                "most 512"));
  EXPECT_TRUE(r.OfferDirectTable(std::vector<DirectTarget>(512)));
}

// The server writes only between BeginDirectWrite and EndDirectWrite, and
// never once the client stopped the call; a client that stops waits for a
// write in progress.
TEST(SharedRingTest, AStoppedCallIsWrittenNoMore) {
  absl::StatusOr<std::unique_ptr<SharedRing>> ring =
      SharedRing::Create(2, 4096);
  ASSERT_TRUE(ring.ok());
  SharedRing& r = **ring;
  const uint64_t call = r.BeginDirectCall();
  ASSERT_TRUE(r.BeginDirectWrite(call));
  // A write in progress: the stop waits for it, up to its limit.
  EXPECT_FALSE(r.StopDirectWrites(call, absl::Milliseconds(50)));
  std::thread server([&] {
    absl::SleepFor(absl::Milliseconds(20));
    r.EndDirectWrite();
  });
  EXPECT_TRUE(r.StopDirectWrites(call, absl::Seconds(10)));
  server.join();
  EXPECT_FALSE(r.BeginDirectWrite(call));
  // The next call is not stopped by the last one's stop.
  const uint64_t next = r.BeginDirectCall();
  ASSERT_TRUE(r.BeginDirectWrite(next));
  r.EndDirectWrite();
  // Nor is a stale writer of the stopped call let through by it.
  EXPECT_FALSE(r.BeginDirectWrite(call));
}

// The peer of a socket pair is this process: its own memory, written as a
// server writes a client's.
TEST(PeerMemoryTest, WritesThePeersMemoryAndNothingElse) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  ScopedFd a(pair[0]);
  ScopedFd b(pair[1]);
  absl::StatusOr<std::unique_ptr<PeerMemory>> peer =
      PeerMemory::OfConnection(a.get());
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::string target(100000, '\0');
  const std::string bytes(99999, 'q');
  const uint64_t at = reinterpret_cast<uintptr_t>(target.data()) + 1;
  ASSERT_TRUE((*peer)->Probe(at).ok());
  ASSERT_TRUE((*peer)->Write(bytes, at).ok());
  EXPECT_TRUE(target == std::string(1, '\0') + bytes);
  EXPECT_TRUE((*peer)->CheckAlive().ok());
  // The first page of an address space is never mapped.
  EXPECT_THAT((*peer)->Probe(64).message(), HasSubstr("not the client's"));
  EXPECT_EQ((*peer)->Write("x", 64).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PeerMemoryTest, APeerThatExitedIsNotWritten) {
  const std::string path = ::testing::TempDir() + "/peer.sock";
  unlink(path.c_str());
  ScopedFd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&address),
                 sizeof(address)),
            0);
  ASSERT_EQ(listen(listener.get(), 1), 0);
  const pid_t child = fork();
  if (child == 0) {
    absl::StatusOr<ScopedFd> c = ConnectUnixSocket(path, absl::Seconds(5));
    _exit(c.ok() ? 0 : 1);
  }
  ScopedFd connection(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_GE(connection.get(), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // Gone before it could be named, or named and then gone.
  absl::StatusOr<std::unique_ptr<PeerMemory>> peer =
      PeerMemory::OfConnection(connection.get());
  if (peer.ok()) {
    EXPECT_EQ((*peer)->CheckAlive().code(), absl::StatusCode::kUnavailable);
  } else {
    EXPECT_EQ(peer.status().code(), absl::StatusCode::kUnavailable);
  }
  unlink(path.c_str());
}

}  // namespace
}  // namespace modelstate
