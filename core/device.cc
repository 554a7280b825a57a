#include "core/device.h"

#include <string>
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

absl::Status CheckDeviceAvailable(const Device& device) {
  std::vector<Device> devices = AvailableDevices();
  for (const Device& d : devices) {
    if (d == device) return absl::OkStatus();
  }
  std::string reason =
      device.is_cuda() && FindDeviceBackend(DeviceType::kCuda) == nullptr
          ? "this server was built without CUDA"
          : "no such device";
  return absl::FailedPreconditionError(absl::StrCat(
      "Device ", device.ToString(), " is not available (", reason,
      "); this server has: ",
      absl::StrJoin(devices, ", ", [](std::string* out, const Device& d) {
        out->append(d.ToString());
      })));
}

}  // namespace modelstate
