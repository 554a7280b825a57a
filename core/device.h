// File: device.h
// Where a tensor's storage lives: `cpu`, `meta` (shape and dtype only, no
// storage at all) or `cuda:N` (only in a build with the CUDA backend and on a
// machine with that GPU).
//
// Example:
//   absl::StatusOr<Device> d = ParseDevice("cuda:1");
//   if (d.ok()) absl::Status s = CheckDeviceAvailable(*d);
//   // FAILED_PRECONDITION "cuda:1 is not available; this server has: cpu,
//   meta"
#ifndef MODELSTATE_CORE_DEVICE_H_
#define MODELSTATE_CORE_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace modelstate {

// Numbers are stable (they appear in the wire format, offset by one).
enum class DeviceType : uint8_t { kCpu = 0, kMeta = 1, kCuda = 2 };

// A device: a type and, for cuda, an index (>= 0). Immutable value type.
struct Device {
  DeviceType type = DeviceType::kCpu;
  int32_t index = 0;  // Always 0 for cpu and meta.

  static Device Cpu() { return Device{DeviceType::kCpu, 0}; }
  static Device Meta() { return Device{DeviceType::kMeta, 0}; }
  static Device Cuda(int32_t index) { return Device{DeviceType::kCuda, index}; }

  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_meta() const { return type == DeviceType::kMeta; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  // True when tensors on this device own bytes (everything but meta).
  bool has_storage() const { return type != DeviceType::kMeta; }

  // "cpu", "meta", "cuda:0".
  std::string ToString() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// Parses "cpu", "meta", "cuda" (= "cuda:0") and "cuda:N". Only the syntax is
// checked; see CheckDeviceAvailable. Returns INVALID_ARGUMENT naming the text
// otherwise.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// Returns OK if tensors can be placed on `device` in this process: cpu and
// meta always; cuda:N when the CUDA backend is built in and GPU N exists.
// Otherwise FAILED_PRECONDITION naming `device` and the devices this process
// has.
absl::Status CheckDeviceAvailable(const Device& device);

// Every device tensors can be placed on here, cpu and meta first.
std::vector<Device> AvailableDevices();

// A device with what it is and its memory.
struct DeviceDescription {
  Device device;
  std::string description;   // e.g. the GPU model
  uint64_t total_bytes = 0;  // 0 for meta
  uint64_t free_bytes = 0;
};

// AvailableDevices(), described. For cpu: physical memory and the memory
// available (MemAvailable).
std::vector<DeviceDescription> DescribeDevices();

}  // namespace modelstate

#endif  // MODELSTATE_CORE_DEVICE_H_
