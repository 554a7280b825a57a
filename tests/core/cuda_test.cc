// The real CUDA backend on a real GPU. Every test is named *_CUDA and skips
// when no GPU is visible (always in builds without CUDA, and on CI).
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

using ::modelstate::testing::HostBytes;
using ::modelstate::testing::RandomTensor;
using ::modelstate::testing::StatusIs;

#define SKIP_WITHOUT_GPU()                                            \
  do {                                                                \
    const DeviceBackend* cuda = FindDeviceBackend(DeviceType::kCuda); \
    if (cuda == nullptr || cuda->DeviceCount() == 0) {                \
      GTEST_SKIP() << "no GPU visible";                               \
    }                                                                 \
  } while (false)

TEST(CudaTest, RoundTripsAreBitExactForEveryDtype_CUDA) {
  SKIP_WITHOUT_GPU();
  // Larger than the 16 MiB of staging slots, ending mid-slot.
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t count = (int64_t{21} << 20) / ElementSize(dtype) + 3;
    const Tensor host = RandomTensor(dtype, count, 7);
    absl::StatusOr<Tensor> gpu = host.To(Device::Cuda(0), dtype);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_EQ(HostBytes(*gpu), HostBytes(host));
  }
}

TEST(CudaTest, ConversionsOnTheDeviceMatchTheCpuBitForBit_CUDA) {
  SKIP_WITHOUT_GPU();
  for (DType src : kAllDTypes) {
    const Tensor host = RandomTensor(src, 1 << 20, static_cast<uint64_t>(src));
    absl::StatusOr<Tensor> gpu = host.To(Device::Cuda(0), src);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    for (DType dst : kAllDTypes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(src), " -> ", DTypeName(dst)));
      absl::StatusOr<Tensor> want = host.To(Device::Cpu(), dst);
      absl::StatusOr<Tensor> on_device = gpu->To(Device::Cuda(0), dst);
      absl::StatusOr<Tensor> uploaded = host.To(Device::Cuda(0), dst);
      absl::StatusOr<Tensor> downloaded = gpu->To(Device::Cpu(), dst);
      ASSERT_TRUE(want.ok() && on_device.ok() && uploaded.ok() &&
                  downloaded.ok());
      EXPECT_EQ(HostBytes(*on_device), HostBytes(*want));
      EXPECT_EQ(HostBytes(*uploaded), HostBytes(*want));
      EXPECT_EQ(HostBytes(*downloaded), HostBytes(*want));
    }
  }
}

// More transfers at once than the backend keeps staging lanes for, each
// split among several staging threads: every one arrives whole.
TEST(CudaTest, ConcurrentTransfersEachArriveWhole_CUDA) {
  SKIP_WITHOUT_GPU();
  constexpr int kTransfers = 12;
  std::vector<Tensor> hosts;
  for (int i = 0; i < kTransfers; ++i) {
    hosts.push_back(RandomTensor(DType::kFloat32, (int64_t{6} << 20) + i, i));
  }
  std::vector<std::string> back(kTransfers);
  std::vector<absl::Status> status(kTransfers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kTransfers; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<Tensor> gpu =
          hosts[i].To(Device::Cuda(0), DType::kFloat32);
      if (!gpu.ok()) {
        status[i] = gpu.status();
        return;
      }
      absl::StatusOr<Tensor> host = gpu->To(Device::Cpu(), DType::kFloat32);
      if (!host.ok()) {
        status[i] = host.status();
        return;
      }
      back[i] = HostBytes(*host);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kTransfers; ++i) {
    MODELSTATE_EXPECT_OK(status[i]);
    EXPECT_TRUE(back[i] == HostBytes(hosts[i])) << "transfer " << i;
  }
}

// A piece that cannot be filled (a file that cannot be read) fails the
// upload with its own error, and the device works on.
TEST(CudaTest, AFailedFillIsTheUploadsError_CUDA) {
  SKIP_WITHOUT_GPU();
  const size_t n = size_t{40} << 20;
  absl::StatusOr<std::shared_ptr<Storage>> storage =
      Storage::Allocate(n, Device::Cuda(0));
  ASSERT_TRUE(storage.ok()) << storage.status();
  EXPECT_THAT(FillBytes(Device::Cuda(0), (*storage)->data(), n,
                        [](void* piece, size_t offset, size_t length) {
                          std::memset(piece, 1, length);
                          return offset >= (size_t{20} << 20)
                                     ? absl::DataLossError("cannot read")
                                     : absl::OkStatus();
                        }),
              StatusIs(absl::StatusCode::kDataLoss, "cannot read"));
  const Tensor host = RandomTensor(DType::kUInt8, 1 << 20, 3);
  absl::StatusOr<Tensor> gpu = host.To(Device::Cuda(0), DType::kUInt8);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(HostBytes(*gpu), HostBytes(host));
}

TEST(CudaTest, OutOfMemoryIsResourceExhausted_CUDA) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<uint64_t> total =
      FindDeviceBackend(DeviceType::kCuda)->TotalMemory(0);
  ASSERT_TRUE(total.ok());
  EXPECT_THAT(Storage::Allocate(*total * 2, Device::Cuda(0)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  // The device still works afterwards.
  MODELSTATE_EXPECT_OK(
      Tensor::Zeros(DType::kFloat32, {1024}, Device::Cuda(0)).status());
}

}  // namespace
}  // namespace modelstate
