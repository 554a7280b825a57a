#include "core/device.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/storage.h"

namespace modelstate {

std::string Device::ToString() const {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kMeta:
      return "meta";
    case DeviceType::kCuda:
      return absl::StrCat("cuda:", index);
  }
  return "unknown";
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "meta") return Device::Meta();
  if (text == "cuda") return Device::Cuda(0);
  if (absl::StartsWith(text, "cuda:")) {
    int32_t index = 0;
    absl::string_view digits = text.substr(5);
    if (!digits.empty() &&
        digits.find_first_not_of("0123456789") == absl::string_view::npos &&
        absl::SimpleAtoi(digits, &index) && index >= 0) {
      return Device::Cuda(index);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "Invalid device '", text, "': expected cpu, meta, cuda or cuda:N"));
}

std::vector<Device> AvailableDevices() {
  std::vector<Device> devices = {Device::Cpu(), Device::Meta()};
  if (const DeviceBackend* cuda = FindDeviceBackend(DeviceType::kCuda)) {
    for (int i = 0; i < cuda->DeviceCount(); ++i) {
      devices.push_back(Device::Cuda(i));
    }
  }
  return devices;
}

namespace {

// Physical memory and MemAvailable, in bytes (0 when unknown).
std::pair<uint64_t, uint64_t> HostMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  uint64_t total =
      pages > 0 && page_size > 0
          ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)
          : 0;
  uint64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = kib << 10;
      break;
    }
  }
  return {total, available};
}

}  // namespace

std::vector<DeviceDescription> DescribeDevices() {
  std::vector<DeviceDescription> result;
  for (const Device& device : AvailableDevices()) {
    DeviceDescription d;
    d.device = device;
    if (device.is_cpu()) {
      d.description = "host memory";
      std::tie(d.total_bytes, d.free_bytes) = HostMemory();
    } else if (device.is_meta()) {
      d.description = "shapes and dtypes only, no storage";
    } else if (const DeviceBackend* b = FindDeviceBackend(device.type)) {
      d.description = b->DeviceName(device.index);
      d.total_bytes = b->TotalMemory(device.index).value_or(0);
      d.free_bytes = b->FreeMemory(device.index).value_or(0);
    }
    result.push_back(std::move(d));
  }
  return result;
}

absl::Status CheckDeviceAvailable(const Device& device) {
  std::vector<Device> devices = AvailableDevices();
  for (const Device& d : devices) {
    if (d == device) return absl::OkStatus();
  }
  std::string reason = "no such device";
  if (device.is_cuda()) {
    const DeviceBackend* cuda = FindDeviceBackend(DeviceType::kCuda);
    if (cuda == nullptr) {
      reason = "this server was built without CUDA";
    } else if (cuda->DeviceCount() == 0) {
      reason = cuda->UnavailableReason();
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "Device ", device.ToString(), " is not available (", reason,
      "); this server has: ",
      absl::StrJoin(devices, ", ", [](std::string* out, const Device& d) {
        out->append(d.ToString());
      })));
}

}  // namespace modelstate
