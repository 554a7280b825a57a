// Everything above the device backend, run against emulated CUDA devices
// (core/emulated_device.h: host memory holding every byte inverted, odd
// staging pieces): transfers and conversions bit for bit against the CPU
// path, streaming a device-resident state_dict, Module::To, out-of-memory,
// and the errors for devices that are not there.
#include "core/device.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/device_reader.h"
#include "core/dtype.h"
#include "core/emulated_device.h"
#include "core/module.h"
#include "core/state_stream.h"
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
using ::testing::HasSubstr;

std::string RawBytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

class EmulatedDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 40 KiB + 8 bytes: transfers end mid-piece and pieces are odd sizes.
    InstallEmulatedCudaDevices(
        {.count = 2, .memory_bytes = 256 << 20, .staging_bytes = 40968});
  }
  void TearDown() override { UninstallEmulatedCudaDevices(); }
};

TEST_F(EmulatedDeviceTest, DevicesAreListedAndMissingOnesNamed) {
  EXPECT_EQ(AvailableDevices().size(), 4u);
  MODELSTATE_EXPECT_OK(CheckDeviceAvailable(Device::Cuda(1)));
  EXPECT_THAT(
      CheckDeviceAvailable(Device::Cuda(2)),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("this server has: cpu, meta, cuda:0, cuda:1")));
  std::vector<DeviceDescription> described = DescribeDevices();
  ASSERT_EQ(described.size(), 4u);
  EXPECT_EQ(described[2].device, Device::Cuda(0));
  EXPECT_EQ(described[2].total_bytes, uint64_t{256} << 20);
  EXPECT_THAT(described[3].description, HasSubstr("Emulated"));
  EXPECT_GT(described[0].total_bytes, 0u);  // cpu: physical memory
}

TEST_F(EmulatedDeviceTest, RoundTripsAreBitExactForEveryDtype) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor host = RandomTensor(dtype, 100003);
    absl::StatusOr<Tensor> on_device = host.To(Device::Cuda(1), dtype);
    ASSERT_TRUE(on_device.ok()) << on_device.status();
    EXPECT_EQ(on_device->device(), Device::Cuda(1));
    // The emulated memory is inverted: code reading it directly would see
    // other bytes.
    EXPECT_NE(RawBytes(*on_device), RawBytes(host));
    EXPECT_EQ(HostBytes(*on_device), RawBytes(host));
    // Device -> device copies, on one device and across two.
    absl::StatusOr<Tensor> across = on_device->To(Device::Cuda(0), dtype);
    ASSERT_TRUE(across.ok()) << across.status();
    EXPECT_EQ(HostBytes(*across), RawBytes(host));
    absl::StatusOr<Tensor> clone = across->Clone();
    ASSERT_TRUE(clone.ok()) << clone.status();
    EXPECT_EQ(HostBytes(*clone), RawBytes(host));
  }
}

// to(device, dtype) in every direction gives the CPU's conversion bit for
// bit: converting while uploading, while downloading, on one device (the
// kernel's per-element rules) and between two devices.
TEST_F(EmulatedDeviceTest, ConversionsMatchTheCpuForEveryPair) {
  for (DType src : kAllDTypes) {
    const Tensor host = RandomTensor(src, 30011, static_cast<uint64_t>(src));
    absl::StatusOr<Tensor> src_on_device = host.To(Device::Cuda(0), src);
    ASSERT_TRUE(src_on_device.ok()) << src_on_device.status();
    for (DType dst : kAllDTypes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(src), " -> ", DTypeName(dst)));
      absl::StatusOr<Tensor> want = host.To(Device::Cpu(), dst);
      ASSERT_TRUE(want.ok());
      const std::string expected = RawBytes(*want);
      absl::StatusOr<Tensor> uploaded = host.To(Device::Cuda(0), dst);
      ASSERT_TRUE(uploaded.ok()) << uploaded.status();
      EXPECT_EQ(HostBytes(*uploaded), expected);
      absl::StatusOr<Tensor> downloaded = src_on_device->To(Device::Cpu(), dst);
      ASSERT_TRUE(downloaded.ok()) << downloaded.status();
      EXPECT_EQ(RawBytes(*downloaded), expected);
      absl::StatusOr<Tensor> on_device =
          src_on_device->To(Device::Cuda(0), dst);
      ASSERT_TRUE(on_device.ok()) << on_device.status();
      EXPECT_EQ(HostBytes(*on_device), expected);
      absl::StatusOr<Tensor> across = src_on_device->To(Device::Cuda(1), dst);
      ASSERT_TRUE(across.ok()) << across.status();
      EXPECT_EQ(HostBytes(*across), expected);
      // CopyFrom (load_state_dict's copy) converts the same way.
      absl::StatusOr<Tensor> target =
          Tensor::Empty(dst, host.shape(), Device::Cuda(1));
      ASSERT_TRUE(target.ok());
      MODELSTATE_ASSERT_OK(target->CopyFrom(host));
      EXPECT_EQ(HostBytes(*target), expected);
    }
  }
}

TEST_F(EmulatedDeviceTest, RunningOutOfDeviceMemoryIsResourceExhausted) {
  UninstallEmulatedCudaDevices();
  InstallEmulatedCudaDevices({.count = 1, .memory_bytes = 1 << 20});
  absl::StatusOr<Tensor> fits =
      Tensor::Zeros(DType::kFloat32, {200000}, Device::Cuda(0));
  MODELSTATE_ASSERT_OK(fits.status());
  EXPECT_THAT(Tensor::Zeros(DType::kFloat32, {200000}, Device::Cuda(0)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("cuda:0 is out of memory")));
  // Freed memory is available again.
  *fits = Tensor();
  MODELSTATE_EXPECT_OK(
      Tensor::Zeros(DType::kFloat32, {200000}, Device::Cuda(0)).status());
}

TEST_F(EmulatedDeviceTest, DeviceReaderServesAnyRangeAcrossWindows) {
  const Tensor host = RandomTensor(DType::kUInt8, 100000);
  absl::StatusOr<Tensor> t = host.To(Device::Cuda(0), DType::kUInt8);
  ASSERT_TRUE(t.ok());
  const std::string want = RawBytes(host);
  for (size_t window : {1u, 1000u, 4096u, 1u << 20}) {
    DeviceReader reader(window);
    for (size_t step : {1u, 7u, 999u, 65536u}) {
      std::string got;
      while (got.size() < want.size()) {
        absl::StatusOr<absl::string_view> bytes =
            reader.Read(*t, got.size(), step);
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        ASSERT_FALSE(bytes->empty());
        ASSERT_LE(bytes->size(), step);
        got.append(bytes->data(), bytes->size());
      }
      EXPECT_EQ(got, want) << "window " << window << " step " << step;
    }
  }
}

// A reader moved to another tensor while a window of the first is being
// read ahead, and back, serves each tensor's own bytes (its buffers are
// reused from window to window and tensor to tensor).
TEST_F(EmulatedDeviceTest, DeviceReaderSwitchesTensorsMidStream) {
  const Tensor a = RandomTensor(DType::kUInt8, 10000, 1);
  const Tensor b = RandomTensor(DType::kUInt8, 10000, 2);
  absl::StatusOr<Tensor> on_a = a.To(Device::Cuda(0), DType::kUInt8);
  absl::StatusOr<Tensor> on_b = b.To(Device::Cuda(1), DType::kUInt8);
  ASSERT_TRUE(on_a.ok() && on_b.ok());
  DeviceReader reader(4096);
  for (const auto& [t, host, offset] :
       {std::tuple(&*on_a, &a, size_t{0}), std::tuple(&*on_b, &b, size_t{5000}),
        std::tuple(&*on_a, &a, size_t{4100}), std::tuple(&*on_a, &a, size_t{0}),
        std::tuple(&*on_b, &b, size_t{9999}),
        std::tuple(&*on_b, &b, size_t{0})}) {
    absl::StatusOr<absl::string_view> got = reader.Read(*t, offset, 3000);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, RawBytes(*host).substr(offset, got->size()));
    EXPECT_EQ(got->size(),
              std::min<size_t>({3000, 4096 - offset % 4096, 10000 - offset}));
  }
}

// FillBytes writes a device's bytes straight from its staging pieces, on
// cpu in one fill of everything, and the error of any piece (here the last)
// is the result.
TEST_F(EmulatedDeviceTest, FillBytesFillsThePiecesAndReportsAFailure) {
  const Tensor host = RandomTensor(DType::kUInt8, 200000, 9);
  const std::string want = RawBytes(host);
  for (Device device : {Device::Cuda(0), Device::Cpu()}) {
    absl::StatusOr<Tensor> t = Tensor::Empty(DType::kUInt8, {200000}, device);
    ASSERT_TRUE(t.ok());
    absl::StatusOr<void*> dst = t->MutableDataForOverwrite();
    ASSERT_TRUE(dst.ok());
    int pieces = 0;
    MODELSTATE_EXPECT_OK(
        FillBytes(device, *dst, want.size(),
                  [&](void* piece, size_t offset, size_t length) {
                    ++pieces;
                    std::memcpy(piece, want.data() + offset, length);
                    return absl::OkStatus();
                  }));
    EXPECT_EQ(HostBytes(*t), want);
    EXPECT_EQ(pieces, device.is_cpu() ? 1 : (200000 + 40967) / 40968);
    EXPECT_THAT(FillBytes(device, *dst, want.size(),
                          [&](void*, size_t offset, size_t length) {
                            return offset + length == want.size()
                                       ? absl::DataLossError("piece lost")
                                       : absl::OkStatus();
                          }),
                StatusIs(absl::StatusCode::kDataLoss, "piece lost"));
  }
}

// A state_dict streamed from the device equals the same one streamed from
// cpu, for any chunk size and with a target dtype (converted per element
// across the read-ahead windows, which hold 16 MiB: the big entry spans two).
TEST_F(EmulatedDeviceTest, StateDictStreamsFromTheDeviceLikeFromCpu) {
  static_assert(DeviceReader::kDefaultWindowBytes < 4500001 * 4);
  StateDict on_cpu;
  on_cpu.tensors.Set("big", RandomTensor(DType::kFloat32, 4500001, 3));
  on_cpu.tensors.Set("half", RandomTensor(DType::kFloat16, 1001, 4));
  on_cpu.tensors.Set("count", RandomTensor(DType::kInt64, 3, 5));
  on_cpu.tensors.Set("empty", RandomTensor(DType::kFloat64, 0, 6));
  on_cpu.tensors.Set("last", RandomTensor(DType::kBFloat16, 77, 7));
  StateDict on_device;
  int i = 0;
  for (const auto& item : on_cpu.tensors) {
    // Alternate devices, one entry stays on cpu.
    Device device = item.key == "count" ? Device::Cpu() : Device::Cuda(i++ % 2);
    absl::StatusOr<Tensor> t = item.value.To(device, item.value.dtype());
    ASSERT_TRUE(t.ok());
    on_device.tensors.Set(item.key, *std::move(t));
  }
  auto read_all = [](const StateDict& sd, std::optional<DType> target,
                     size_t chunk) {
    absl::StatusOr<std::unique_ptr<StateDictReader>> reader =
        StateDictReader::Create(sd, target);
    EXPECT_TRUE(reader.ok()) << reader.status();
    std::string out;
    while (true) {
      absl::StatusOr<size_t> n = (*reader)->Read(chunk, &out);
      EXPECT_TRUE(n.ok()) << n.status();
      if (!n.ok() || *n == 0) break;
    }
    return out;
  };
  for (std::optional<DType> target :
       {std::optional<DType>(), std::optional<DType>(DType::kFloat16),
        std::optional<DType>(DType::kFloat64)}) {
    const std::string want = read_all(on_cpu, target, 1 << 20);
    // Odd chunk sizes end chunks mid-element.
    for (size_t chunk : {size_t{4099}, size_t{65537}, size_t{1} << 20}) {
      EXPECT_EQ(read_all(on_device, target, chunk), want)
          << "chunk " << chunk << " target "
          << (target ? DTypeName(*target) : "none");
    }
  }
}

TEST_F(EmulatedDeviceTest, ModuleToKeepsTiesAndValues) {
  std::shared_ptr<Module> m = Module::Create("Tied");
  absl::StatusOr<Tensor> w = MakeParameter(RandomTensor(DType::kFloat32, 999));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(m->RegisterParameter("a", *w).ok());
  ASSERT_TRUE(m->RegisterParameter("b", *w).ok());
  ASSERT_TRUE(m->RegisterBuffer("n", RandomTensor(DType::kInt64, 5)).ok());
  MODELSTATE_ASSERT_OK(m->To(Device::Cuda(1), DType::kFloat16));
  StateDict sd = m->GetStateDict("", /*keep_vars=*/true);
  const Tensor& a = *sd.tensors.Find("a");
  EXPECT_EQ(a.device(), Device::Cuda(1));
  EXPECT_EQ(a.dtype(), DType::kFloat16);
  EXPECT_TRUE(a.SharesStorageWith(*sd.tensors.Find("b")));
  EXPECT_EQ(sd.tensors.Find("n")->dtype(), DType::kInt64);  // not floating
  EXPECT_EQ(sd.tensors.Find("n")->device(), Device::Cuda(1));
  absl::StatusOr<Tensor> want = w->To(Device::Cpu(), DType::kFloat16);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(HostBytes(a), RawBytes(*want));
  MODELSTATE_ASSERT_OK(m->To(Device::Cpu(), std::nullopt));
  sd = m->GetStateDict("", true);
  EXPECT_EQ(sd.tensors.Find("a")->device(), Device::Cpu());
  EXPECT_TRUE(sd.tensors.Find("a")->SharesStorageWith(*sd.tensors.Find("b")));
}

TEST(DeviceWithoutEmulationTest, CudaIsUnavailableWithTheReason) {
  if (AvailableDevices().size() > 2) GTEST_SKIP() << "a GPU is present";
#if MODELSTATE_WITH_CUDA
  const char* reason = "built with CUDA, but";
#else
  const char* reason = "built without CUDA";
#endif
  EXPECT_THAT(
      CheckDeviceAvailable(Device::Cuda(0)),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(reason)));
  EXPECT_THAT(
      RandomTensor(DType::kFloat32, 4).To(Device::Cuda(0), DType::kFloat32),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("this server has: cpu, meta")));
}

}  // namespace
}  // namespace modelstate
