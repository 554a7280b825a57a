// The real CUDA backend on a real GPU. Every test is named *_CUDA and skips
// when no GPU is visible (always in builds without CUDA, and on CI).
#include <cstdint>
#include <random>
#include <string>
#include <utility>

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
