#include "core/tensor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "core/device.h"
#include "core/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/proc_status.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::IsOkAndHolds;
using ::modelstate::testing::ProcStatusBytes;
using ::modelstate::testing::StatusIs;
using ::testing::HasSubstr;

TEST(DeviceTest, ParsesEverySpelling) {
  EXPECT_THAT(ParseDevice("cpu"), IsOkAndHolds(Device::Cpu()));
  EXPECT_THAT(ParseDevice("meta"), IsOkAndHolds(Device::Meta()));
  EXPECT_THAT(ParseDevice("cuda"), IsOkAndHolds(Device::Cuda(0)));
  EXPECT_THAT(ParseDevice("cuda:3"), IsOkAndHolds(Device::Cuda(3)));
  for (const char* bad :
       {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "cuda:1a"}) {
    EXPECT_THAT(ParseDevice(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(std::string("'") + bad + "'")))
        << bad;
  }
  EXPECT_EQ(Device::Cuda(2).ToString(), "cuda:2");
}

TEST(DeviceTest, UnavailableCudaNamesTheDevicesWeHave) {
  if (AvailableDevices().size() > 2) GTEST_SKIP() << "a GPU is present";
  EXPECT_THAT(CheckDeviceAvailable(Device::Cuda(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("this server has: cpu, meta")));
  EXPECT_THAT(Tensor::Empty(DType::kFloat32, {2}, Device::Cuda(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  MODELSTATE_EXPECT_OK(CheckDeviceAvailable(Device::Meta()));
}

TEST(TensorTest, ShapesAreCheckedWithPyTorchsText) {
  EXPECT_THAT(
      Tensor::Empty(DType::kFloat32, {2, -1}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "Trying to create tensor with negative dimension -1: [2, -1]"));
  EXPECT_THAT(
      CheckedNumElements({int64_t{1} << 40, int64_t{1} << 40}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2^63-1")));
  EXPECT_THAT(
      CheckedNumBytes(int64_t{1} << 62, DType::kFloat64),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
  EXPECT_THAT(CheckedNumElements({}), IsOkAndHolds(1));
  EXPECT_THAT(CheckedNumElements({3, 0, 5}), IsOkAndHolds(0));
  EXPECT_EQ(TorchSizeString({4, 3}), "torch.Size([4, 3])");
  EXPECT_EQ(TorchSizeString({}), "torch.Size([])");
}

TEST(TensorTest, FromBytesMovesTheBufferInsteadOfCopying) {
  std::string bytes(4096 * 4, '\0');
  const char* original = bytes.data();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      Tensor t, Tensor::FromBytes(DType::kFloat32, {4096}, std::move(bytes)));
  EXPECT_EQ(t.raw_data(), original);
  EXPECT_THAT(Tensor::FromBytes(DType::kFloat32, {3}, std::string(11, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Expected 12 bytes")));
}

TEST(TensorTest, DetachSharesStorageAndCloneCopies) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor t,
                                  Tensor::Full(DType::kFloat32, {3}, 1.5));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor p, MakeParameter(t));
  Tensor d = p.Detach();
  EXPECT_FALSE(d.is_same(p));
  EXPECT_TRUE(d.SharesStorageWith(p));
  EXPECT_FALSE(d.requires_grad());
  EXPECT_FALSE(d.is_parameter());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor c, p.Clone());
  EXPECT_FALSE(c.SharesStorageWith(p));
  EXPECT_TRUE(TensorsEqual(c, d));
}

TEST(TensorTest, WritesNeverChangeBytesASnapshotStillViews) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor t,
                                  Tensor::Full(DType::kFloat32, {4}, 1.0));
  Tensor snapshot = t.Detach();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor twos,
                                  Tensor::Full(DType::kFloat32, {4}, 2.0));
  ASSERT_THAT(t.CopyFrom(twos), IsOk());
  EXPECT_EQ(snapshot.data<float>()[0], 1.0f);
  EXPECT_EQ(t.data<float>()[0], 2.0f);
  EXPECT_FALSE(t.SharesStorageWith(snapshot));
  // Without a snapshot the write is in place.
  const void* before = t.raw_data();
  ASSERT_THAT(t.CopyFrom(snapshot), IsOk());
  EXPECT_EQ(t.raw_data(), before);
  EXPECT_EQ(t.data<float>()[3], 1.0f);
}

TEST(TensorTest, CopyFromConvertsAndChecksSizes) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor dst,
                                  Tensor::Zeros(DType::kInt64, {2}));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      Tensor src, Tensor::FromDoubles(DType::kFloat64, {2}, {3.7, -2.5}));
  ASSERT_THAT(dst.CopyFrom(src), IsOk());
  EXPECT_EQ(dst.data<int64_t>()[0], 3);
  EXPECT_EQ(dst.data<int64_t>()[1], -2);
  EXPECT_EQ(dst.dtype(), DType::kInt64);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor three,
                                  Tensor::Zeros(DType::kFloat32, {3}));
  EXPECT_THAT(dst.CopyFrom(three),
              StatusIs(absl::StatusCode::kInvalidArgument));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      Tensor meta, Tensor::Empty(DType::kInt64, {2}, Device::Meta()));
  EXPECT_THAT(dst.CopyFrom(meta),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Cannot copy out of meta tensor; no data!"));
  EXPECT_THAT(meta.CopyFrom(dst), IsOk());
}

TEST(TensorTest, ToReturnsTheSameObjectWhenNothingChanges) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor t,
                                  Tensor::Full(DType::kFloat32, {2}, 0.1));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor same,
                                  t.To(Device::Cpu(), DType::kFloat32));
  EXPECT_TRUE(same.is_same(t));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor half,
                                  t.To(Device::Cpu(), DType::kFloat16));
  EXPECT_EQ(half.dtype(), DType::kFloat16);
  EXPECT_EQ(half.data<uint16_t>()[0], FloatToHalfBits(0.1f));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor meta,
                                  t.To(Device::Meta(), DType::kFloat32));
  EXPECT_EQ(meta.raw_data(), nullptr);
  EXPECT_EQ(meta.storage(), nullptr);
  EXPECT_THAT(meta.To(Device::Cpu(), DType::kFloat32),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TensorTest, ParametersNeedFloatingPointToRequireGrad) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor ints,
                                  Tensor::Zeros(DType::kInt64, {2}));
  EXPECT_THAT(MakeParameter(ints),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Only Tensors of floating point and complex dtype can "
                       "require gradients"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor p, MakeParameter(ints, false));
  EXPECT_TRUE(p.is_parameter());
  EXPECT_TRUE(p.SharesStorageWith(ints));
  EXPECT_THAT(MakeParameter(Tensor()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TensorTest, SetDataKeepsIdentity) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      Tensor p, MakeParameter(*Tensor::Zeros(DType::kFloat32, {2})));
  Tensor alias = p;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor d,
                                  Tensor::Zeros(DType::kFloat64, {2}));
  p.SetData(d);
  EXPECT_EQ(alias.dtype(), DType::kFloat64);
  EXPECT_TRUE(alias.is_parameter());
  EXPECT_TRUE(alias.requires_grad());
}

TEST(TensorTest, TypeNamesAreLegacyTorchNames) {
  EXPECT_EQ(Tensor::Zeros(DType::kFloat32, {1})->TypeName(),
            "torch.FloatTensor");
  EXPECT_EQ(Tensor::Zeros(DType::kInt64, {1})->TypeName(), "torch.LongTensor");
  EXPECT_EQ(Tensor::Zeros(DType::kFloat16, {1})->TypeName(),
            "torch.HalfTensor");
  EXPECT_EQ(Tensor::Zeros(DType::kFloat32, {2, 3})->DebugString(),
            "float32[2, 3] on cpu");
}

TEST(TensorTest, MetaTensorsHaveNoStorageWhateverTheirSize) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      Tensor huge,
      Tensor::Empty(DType::kFloat32, {1'000'000, 1'000'000}, Device::Meta()));
  EXPECT_EQ(huge.numel(), int64_t{1'000'000'000'000});
  EXPECT_EQ(huge.storage(), nullptr);
  EXPECT_EQ(huge.nbytes(), size_t{4'000'000'000'000});
}

TEST(TensorTest, ContentHashIsSha256OfTheBytes) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor t,
                                  Tensor::FromBytes(DType::kUInt8, {3}, "abc"));
  EXPECT_EQ(ContentHash(t),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(StorageTest, LargeAllocationsAreMappedAndAligned) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto big,
                                  Storage::Allocate(8 << 20, Device::Cpu()));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto small,
                                  Storage::Allocate(100, Device::Cpu()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big->data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small->data()) % 64, 0u);
  std::memset(big->data(), 1, big->nbytes());
  EXPECT_THAT(Storage::Allocate(1, Device::Meta()),
              StatusIs(absl::StatusCode::kInternal));
}

TEST(StorageTest, ReuseScopeRecyclesFreedMappingsOfTheSameSize) {
  ScopedStorageReuse::ReleaseCached();
  constexpr size_t kSize = 3 << 20;
  void* first = nullptr;
  {
    ScopedStorageReuse reuse;
    MODELSTATE_ASSERT_OK_AND_ASSIGN(auto s,
                                    Storage::Allocate(kSize, Device::Cpu()));
    std::memset(s->data(), 7, kSize);
    first = s->data();
  }
  EXPECT_EQ(ScopedStorageReuse::CachedBytes(), kSize);
  // Any allocation of that size takes it back, bytes and all (they are
  // uninitialised by contract); another size does not.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      auto other, Storage::Allocate(kSize + 8192, Device::Cpu()));
  EXPECT_NE(other->data(), first);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto again,
                                  Storage::Allocate(kSize, Device::Cpu()));
  EXPECT_EQ(again->data(), first);
  EXPECT_EQ(static_cast<const char*>(again->data())[kSize - 1], 7);
  EXPECT_EQ(ScopedStorageReuse::CachedBytes(), 0u);
  // Allocated outside any scope: unmapped when released, never cached.
  again.reset();
  other.reset();
  EXPECT_EQ(ScopedStorageReuse::CachedBytes(), 0u);
}

TEST(StorageTest, ReuseCacheKeepsAtMostEightMappingsAnd64MiB) {
  ScopedStorageReuse::ReleaseCached();
  ScopedStorageReuse reuse;
  {
    std::vector<std::shared_ptr<Storage>> held;
    for (int i = 0; i < 10; ++i) {
      MODELSTATE_ASSERT_OK_AND_ASSIGN(
          auto s, Storage::Allocate(size_t{1} << 20, Device::Cpu()));
      held.push_back(std::move(s));
    }
  }
  EXPECT_EQ(ScopedStorageReuse::CachedBytes(), size_t{8} << 20);
  {
    // 3 x 20 MiB push out the small ones to stay within 64 MiB.
    std::vector<std::shared_ptr<Storage>> held;
    for (int i = 0; i < 3; ++i) {
      MODELSTATE_ASSERT_OK_AND_ASSIGN(
          auto s, Storage::Allocate(size_t{20} << 20, Device::Cpu()));
      held.push_back(std::move(s));
    }
  }
  EXPECT_EQ(ScopedStorageReuse::CachedBytes(), size_t{64} << 20);
  {
    // A single mapping over the limit is never kept.
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        auto s, Storage::Allocate(size_t{65} << 20, Device::Cpu()));
  }
  EXPECT_EQ(ScopedStorageReuse::CachedBytes(), size_t{64} << 20);
  ScopedStorageReuse::ReleaseCached();
  EXPECT_EQ(ScopedStorageReuse::CachedBytes(), 0u);
}

// Pages of [data, data + nbytes) in memory, by mincore.
size_t ResidentPages(const void* data, size_t nbytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((nbytes + page - 1) / page);
  if (mincore(const_cast<void*>(data), nbytes, resident.data()) != 0) return 0;
  size_t count = 0;
  for (unsigned char r : resident) count += r & 1;
  return count;
}

// Polls `done` for up to 30 s.
template <typename Fn>
bool Eventually(Fn done) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(StorageTest, FreshLargeMappingsAreFaultedInBeforeAnyoneTouchesThem) {
  constexpr size_t kSize = size_t{32} << 20;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto s,
                                  Storage::Allocate(kSize, Device::Cpu()));
  const size_t pages = kSize / static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Nobody here touches the bytes: a thread of the core faults them in.
  EXPECT_TRUE(Eventually([&] {
    return ResidentPages(s->data(), kSize) == pages;
  })) << ResidentPages(s->data(), kSize)
      << " of " << pages << " resident";
  const char* bytes = static_cast<const char*>(s->data());
  for (size_t i = 0; i < kSize; i += 4096) ASSERT_EQ(bytes[i], 0) << i;
}

TEST(StorageTest, FaultingInNeverChangesBytesAndStopsForFreedMappings) {
  // Filled while being faulted in: every byte written stays written.
  constexpr size_t kSize = size_t{64} << 20;
  for (int round = 1; round <= 4; ++round) {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(auto s,
                                    Storage::Allocate(kSize, Device::Cpu()));
    std::memset(s->data(), round, kSize);
    ASSERT_TRUE(Eventually([&] {
      return ResidentPages(s->data(), kSize) ==
             kSize / static_cast<size_t>(sysconf(_SC_PAGESIZE));
    }));
    const char* bytes = static_cast<const char*>(s->data());
    for (size_t i = 0; i < kSize; i += 512) ASSERT_EQ(bytes[i], round) << i;
  }
  // Freed or shrunk while being faulted in: the pages go back at once and
  // nothing is faulted into a mapping that is gone.
  const uint64_t before = ProcStatusBytes(0, "VmRSS");
  for (int i = 0; i < 16; ++i) {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        auto freed, Storage::Allocate(size_t{256} << 20, Device::Cpu()));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(auto shrunk,
                                    Storage::Allocate(kSize, Device::Cpu()));
    shrunk->ShrinkTo(size_t{1} << 20);
    std::memset(shrunk->data(), 1, size_t{1} << 20);
    freed.reset();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(ProcStatusBytes(0, "VmRSS"), before + (uint64_t{64} << 20))
      << "before " << before << ", after " << ProcStatusBytes(0, "VmRSS");
}

// Whether every page of [data, data + nbytes) is mapped: mincore fails
// with ENOMEM for a range with any unmapped page.
bool Mapped(const void* data, size_t nbytes) {
  std::vector<unsigned char> resident(nbytes / 4096 + 1);
  return mincore(const_cast<void*>(data), nbytes, resident.data()) == 0;
}

TEST(StorageTest, TailsGivenUpInADeferredUnmapScopeGoBackWhenItEnds) {
  constexpr size_t kSize = size_t{32} << 20;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto s,
                                  Storage::Allocate(kSize, Device::Cpu()));
  const char* tail = static_cast<const char*>(s->data()) + kSize / 2;
  {
    const ScopedDeferredUnmap outer;
    {
      const ScopedDeferredUnmap inner;  // nested: the outer one decides
      s->ShrinkTo(kSize / 2);
    }
    // Long enough for the background unmapper to have done it, had it been
    // handed the tail.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(Mapped(tail, kSize / 2));
    EXPECT_EQ(s->nbytes(), kSize / 2);
  }
  EXPECT_TRUE(Eventually([&] { return !Mapped(tail, kSize / 2); }));
  std::memset(s->data(), 7, kSize / 2);  // the kept half stays usable
  // Outside any scope, a tail goes back on its own.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto t,
                                  Storage::Allocate(kSize, Device::Cpu()));
  t->ShrinkTo(kSize / 4);
  const char* t_tail = static_cast<const char*>(t->data()) + kSize / 4;
  EXPECT_TRUE(Eventually([&] { return !Mapped(t_tail, kSize / 4 * 3); }));
}

// Storages made in a batched-prefault scope are faulted in once it ends;
// one freed inside it is not (its range could be another mapping's).
TEST(TensorTest, ABytesLimitHoldsNewTensorsOnThisThreadWhileItLives) {
  {
    ScopedTensorBytesLimit limit(64);
    EXPECT_THAT(Tensor::Empty(DType::kFloat32, {16}).status(), IsOk());
    EXPECT_THAT(Tensor::Zeros(DType::kFloat32, {17}).status(),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("A float32[17] tensor needs 68 bytes, over "
                                   "the max_tensor_bytes limit of 64")));
    // Metadata only: nothing is allocated.
    EXPECT_THAT(Tensor::Empty(DType::kFloat32, {17}, Device::Meta()).status(),
                IsOk());
    {
      ScopedTensorBytesLimit inner(8);
      EXPECT_THAT(Tensor::Empty(DType::kFloat32, {16}).status(),
                  StatusIs(absl::StatusCode::kResourceExhausted));
    }
    EXPECT_THAT(Tensor::Empty(DType::kFloat32, {16}).status(), IsOk());
    // Other threads are not held.
    absl::Status elsewhere;
    std::thread([&] {
      elsewhere = Tensor::Empty(DType::kFloat32, {1024}).status();
    }).join();
    EXPECT_THAT(elsewhere, IsOk());
  }
  EXPECT_THAT(Tensor::Empty(DType::kFloat32, {1024}).status(), IsOk());
}

TEST(StorageTest, BatchedPrefaultsStartWhenTheScopeEnds) {
  constexpr size_t kSize = size_t{32} << 20;
  const size_t pages = kSize / static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::shared_ptr<Storage> kept;
  {
    const ScopedBatchedPrefault batch;
    MODELSTATE_ASSERT_OK_AND_ASSIGN(kept,
                                    Storage::Allocate(kSize, Device::Cpu()));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(auto freed,
                                    Storage::Allocate(kSize, Device::Cpu()));
    freed.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(ResidentPages(kept->data(), kSize), 0u);
  }
  EXPECT_TRUE(Eventually([&] {
    return ResidentPages(kept->data(), kSize) == pages;
  })) << ResidentPages(kept->data(), kSize)
      << " of " << pages;
}

}  // namespace
}  // namespace modelstate

namespace modelstate {
namespace {

// Values that exercise rounding, overflow, subnormals, NaN and signed zero.
Tensor Awkward(DType dtype, int64_t n) {
  std::vector<double> values;
  const double specials[] = {0.0,  -0.0,     1.0 / 3,  65504.0, 65520.0,
                             1e-8, -1e-5,    3.0e38,   -2.5,    1e300,
                             NAN,  INFINITY, -INFINITY};
  for (int64_t i = 0; i < n; ++i) {
    values.push_back(i % 17 == 0 ? specials[(i / 17) % 13]
                                 : (i - n / 2) * 0.0137);
  }
  return *Tensor::FromDoubles(dtype, {n}, values);
}

TEST(TensorTest, ConvertInPlaceMatchesToAndReturnsTheRest) {
  // Above the mapped-storage threshold, with an odd tail for the kernels.
  const int64_t n = (1 << 20) / 4 * 3 + 16384 * 2 + 7;
  // Every pair that does not widen: the kernels run over their own input.
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      if (ElementSize(to) > ElementSize(from)) continue;
      SCOPED_TRACE(absl::StrCat(DTypeName(from), " -> ", DTypeName(to)));
      Tensor t = Awkward(from, n);
      Tensor want = *t.To(Device::Cpu(), to);
      const void* before = t.raw_data();
      ASSERT_TRUE(t.CanConvertInPlace(to));
      ASSERT_THAT(t.ConvertInPlace(to), IsOk());
      EXPECT_EQ(t.dtype(), to);
      EXPECT_EQ(t.raw_data(), before);  // the same bytes, no new buffer
      EXPECT_EQ(t.storage()->nbytes(),
                static_cast<size_t>(n) * ElementSize(to));
      EXPECT_TRUE(TensorsEqual(t, want));
    }
  }
}

TEST(TensorTest, ConvertInPlaceOnlyWhereNobodyElseSeesTheBytes) {
  Tensor t = Awkward(DType::kFloat32, 100);
  EXPECT_FALSE(t.CanConvertInPlace(DType::kFloat64));  // wider
  Tensor snapshot = t.Detach();
  EXPECT_FALSE(t.CanConvertInPlace(DType::kFloat16));  // shared storage
  EXPECT_THAT(
      t.ConvertInPlace(DType::kFloat16),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in place")));
  snapshot = Tensor();
  EXPECT_TRUE(t.CanConvertInPlace(DType::kFloat16));
  Tensor meta = *Tensor::Empty(DType::kFloat32, {4}, Device::Meta());
  EXPECT_FALSE(meta.CanConvertInPlace(DType::kFloat16));
}

}  // namespace
}  // namespace modelstate
