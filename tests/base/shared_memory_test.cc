// SharedRing on its own: its shape limits, what Adopt refuses, and a
// producer and a consumer on two threads moving a stream many times the
// ring's size through it (also run under TSan: the consumer counter is the
// only synchronisation besides the announcement).
#include "base/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

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

}  // namespace
}  // namespace modelstate
