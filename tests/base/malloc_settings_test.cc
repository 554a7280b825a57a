// ReuseMessageMemory changes this whole process's malloc, so its test has a
// binary of its own.
#include "base/malloc_settings.h"

#include <sys/resource.h>

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"

// AddressSanitizer and ThreadSanitizer bring allocators of their own, for
// which glibc's mallopt settings mean nothing.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kGlibcMalloc = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kGlibcMalloc = false;
#else
constexpr bool kGlibcMalloc = true;
#endif
#else
constexpr bool kGlibcMalloc = true;
#endif

namespace modelstate {
namespace {

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Allocates `count` blocks of `bytes`, writes every page, frees them.
void TouchBlocks(int count, size_t bytes) {
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < count; ++i) {
    blocks.emplace_back(new char[bytes]);
    std::memset(blocks.back().get(), i, bytes);
    // The writes must happen: the compiler may not drop them.
    asm volatile("" : : "r"(blocks.back().get()) : "memory");
  }
}

// What a stream does with gRPC's read buffers: 1 MiB blocks allocated,
// filled and freed, again and again. With glibc's defaults the second
// round meets fresh pages (the first round's were unmapped or trimmed),
// a fault per 4 KiB; with the settings it reuses the heap's memory.
TEST(ReuseMessageMemoryTest, FreedMessageBuffersAreReusedWithoutFaults) {
  if (!kGlibcMalloc) GTEST_SKIP() << "a sanitizer's allocator, not glibc's";
  ASSERT_TRUE(ReuseMessageMemory());
  constexpr int kBlocks = 16;
  constexpr size_t kBytes = 1 << 20;
  TouchBlocks(kBlocks, kBytes);  // the heap grows to hold them once
  const long before = MinorFaults();
  for (int round = 0; round < 4; ++round) TouchBlocks(kBlocks, kBytes);
  const long faults = MinorFaults() - before;
  // 4 rounds of 16 MiB are 16,384 pages; a few faults for the vector.
  EXPECT_LT(faults, 64) << faults << " minor faults";
}

}  // namespace
}  // namespace modelstate
