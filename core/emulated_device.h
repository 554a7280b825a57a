// File: emulated_device.h
// A stand-in for CUDA devices, in host memory, so that everything above the
// device backend (To, copies, streaming state_dicts, the service's device
// handling, restarts) is tested on machines without a GPU. Testing only:
// the server enables it with --emulated_cuda_devices.
//
// To catch code that touches device memory directly instead of through the
// backend, the emulated memory holds every byte inverted; staging pieces
// have the configured (deliberately odd) size; conversions on the device
// run one element at a time through internal/element_convert.h, the rules
// the CUDA kernels use.
//
// Example:
//   InstallEmulatedCudaDevices({.count = 2});
//   absl::StatusOr<Tensor> t = host.To(Device::Cuda(1), DType::kFloat16);
#ifndef MODELSTATE_CORE_EMULATED_DEVICE_H_
#define MODELSTATE_CORE_EMULATED_DEVICE_H_

#include <cstddef>
#include <cstdint>

namespace modelstate {

struct EmulatedCudaOptions {
  int count = 1;
  // Per device; allocations beyond it fail with RESOURCE_EXHAUSTED.
  uint64_t memory_bytes = uint64_t{4} << 30;
  // Bytes per staging piece (rounded up to a multiple of 8).
  size_t staging_bytes = 40 << 10;
};

// Registers the emulated devices as the cuda backend, replacing a real one.
// Existing cuda storages must be gone (tests call it before making any).
void InstallEmulatedCudaDevices(const EmulatedCudaOptions& options);

// Restores the backend of the build (CUDA when built with it, else none).
void UninstallEmulatedCudaDevices();

}  // namespace modelstate

#endif  // MODELSTATE_CORE_EMULATED_DEVICE_H_
