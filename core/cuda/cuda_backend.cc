#include "core/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "core/cuda/convert_kernel.h"

namespace modelstate::cuda {
namespace {

// Pinned staging: kSlots buffers of kSlotBytes per transfer lane, so one
// buffer is filled (or drained) by the CPU while the others are in flight.
constexpr int kSlots = 4;
constexpr size_t kSlotBytes = size_t{4} << 20;
static_assert(kSlotBytes % DeviceBackend::kStagingGranule == 0);
// Idle lanes kept per device for the next transfer (pinned memory is slow
// to allocate); more concurrent transfers allocate temporary lanes.
constexpr size_t kMaxIdleLanes = 4;

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", cudaGetErrorName(error), " (",
                                     cudaGetErrorString(error), ")");
  if (error == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

#define CUDA_RETURN_IF_ERROR(call) \
  MODELSTATE_RETURN_IF_ERROR(CudaError((call), #call))

// Makes `index` the calling thread's current device for a scope.
class ScopedDevice {
 public:
  explicit ScopedDevice(int32_t index) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = CudaError(cudaSetDevice(index), absl::StrCat("cuda:", index));
  }
  ~ScopedDevice() {
    if (previous_ >= 0) static_cast<void>(cudaSetDevice(previous_));
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// A stream with its own pinned staging slots and one event per slot.
struct Lane {
  cudaStream_t stream = nullptr;
  char* pinned = nullptr;
  std::array<cudaEvent_t, kSlots> done{};

  ~Lane() {
    for (cudaEvent_t e : done) {
      if (e != nullptr) static_cast<void>(cudaEventDestroy(e));
    }
    if (pinned != nullptr) static_cast<void>(cudaFreeHost(pinned));
    if (stream != nullptr) static_cast<void>(cudaStreamDestroy(stream));
  }
  char* slot(int i) { return pinned + static_cast<size_t>(i) * kSlotBytes; }
};

absl::StatusOr<std::unique_ptr<Lane>> NewLane() {
  auto lane = std::make_unique<Lane>();
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
  void* pinned = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&pinned, kSlots * kSlotBytes, cudaHostAllocPortable));
  lane->pinned = static_cast<char*>(pinned);
  for (cudaEvent_t& e : lane->done) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return lane;
}

class CudaBackend : public DeviceBackend {
 public:
  DeviceType type() const override { return DeviceType::kCuda; }

  int DeviceCount() const override {
    Probe();
    return count_;
  }
  std::string UnavailableReason() const override {
    Probe();
    return reason_;
  }

  absl::StatusOr<uint64_t> TotalMemory(int32_t index) const override {
    MODELSTATE_ASSIGN_OR_RETURN(auto info, MemoryInfo(index));
    return info.second;
  }
  absl::StatusOr<uint64_t> FreeMemory(int32_t index) const override {
    MODELSTATE_ASSIGN_OR_RETURN(auto info, MemoryInfo(index));
    return info.first;
  }
  std::string DeviceName(int32_t index) const override {
    cudaDeviceProp properties;
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) {
      return absl::StrCat("cuda:", index);
    }
    return properties.name;
  }

  absl::StatusOr<void*> Allocate(int32_t index, size_t nbytes) const override {
    ScopedDevice device(index);
    MODELSTATE_RETURN_IF_ERROR(device.status());
    void* p = nullptr;
    const cudaError_t error = cudaMalloc(&p, std::max<size_t>(nbytes, 1));
    if (error == cudaErrorMemoryAllocation) {
      static_cast<void>(cudaGetLastError());  // Not sticky; clear it.
      size_t free_bytes = 0, total_bytes = 0;
      static_cast<void>(cudaMemGetInfo(&free_bytes, &total_bytes));
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda:", index, " is out of memory: tried to allocate ", nbytes,
          " bytes with ", free_bytes, " of ", total_bytes, " bytes free"));
    }
    CUDA_RETURN_IF_ERROR(error);
    return p;
  }

  void Free(int32_t index, void* ptr) const override {
    ScopedDevice device(index);
    const cudaError_t error = cudaFree(ptr);
    if (error != cudaSuccess) {
      // Nothing to return a status to: a storage is being destroyed.
      std::fprintf(stderr, "cudaFree on cuda:%d: %s\n", index,
                   cudaGetErrorString(error));
    }
  }

  absl::Status Upload(int32_t index, void* dst, size_t nbytes,
                      StagingFill fill) const override {
    ScopedDevice device(index);
    MODELSTATE_RETURN_IF_ERROR(device.status());
    MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<Lane> lane, AcquireLane(index));
    absl::Status status = absl::OkStatus();
    int piece = 0;
    for (size_t offset = 0; offset < nbytes && status.ok();
         offset += kSlotBytes, ++piece) {
      const int slot = piece % kSlots;
      const size_t length = std::min(kSlotBytes, nbytes - offset);
      // The slot's previous copy must be done before it is refilled.
      if (piece >= kSlots) {
        status = CudaError(cudaEventSynchronize(lane->done[slot]), "upload");
        if (!status.ok()) break;
      }
      fill(lane->slot(slot), offset, length);
      status = CudaError(
          cudaMemcpyAsync(static_cast<char*>(dst) + offset, lane->slot(slot),
                          length, cudaMemcpyHostToDevice, lane->stream),
          "upload");
      if (status.ok()) {
        status = CudaError(cudaEventRecord(lane->done[slot], lane->stream),
                           "upload");
      }
    }
    const absl::Status synced =
        CudaError(cudaStreamSynchronize(lane->stream), "upload");
    ReleaseLane(index, std::move(lane), synced.ok());
    return status.ok() ? synced : status;
  }

  absl::Status Download(int32_t index, const void* src, size_t nbytes,
                        StagingDrain drain) const override {
    ScopedDevice device(index);
    MODELSTATE_RETURN_IF_ERROR(device.status());
    MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<Lane> lane, AcquireLane(index));
    const size_t pieces = (nbytes + kSlotBytes - 1) / kSlotBytes;
    auto enqueue = [&](size_t piece) -> absl::Status {
      const int slot = static_cast<int>(piece % kSlots);
      const size_t offset = piece * kSlotBytes;
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          lane->slot(slot), static_cast<const char*>(src) + offset,
          std::min(kSlotBytes, nbytes - offset), cudaMemcpyDeviceToHost,
          lane->stream));
      return CudaError(cudaEventRecord(lane->done[slot], lane->stream),
                       "download");
    };
    absl::Status status = absl::OkStatus();
    for (size_t piece = 0;
         piece < std::min<size_t>(pieces, kSlots) && status.ok(); ++piece) {
      status = enqueue(piece);
    }
    for (size_t piece = 0; piece < pieces && status.ok(); ++piece) {
      const int slot = static_cast<int>(piece % kSlots);
      status = CudaError(cudaEventSynchronize(lane->done[slot]), "download");
      if (!status.ok()) break;
      const size_t offset = piece * kSlotBytes;
      drain(lane->slot(slot), offset, std::min(kSlotBytes, nbytes - offset));
      if (piece + kSlots < pieces) status = enqueue(piece + kSlots);
    }
    const absl::Status synced =
        CudaError(cudaStreamSynchronize(lane->stream), "download");
    ReleaseLane(index, std::move(lane), synced.ok());
    return status.ok() ? synced : status;
  }

  absl::Status CopyOnDevice(int32_t dst_index, void* dst, int32_t src_index,
                            const void* src, size_t nbytes) const override {
    ScopedDevice device(dst_index);
    MODELSTATE_RETURN_IF_ERROR(device.status());
    if (dst_index == src_index) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          dst, src, nbytes, cudaMemcpyDeviceToDevice, cudaStreamPerThread));
    } else {
      CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(dst, dst_index, src, src_index,
                                               nbytes, cudaStreamPerThread));
    }
    return CudaError(cudaStreamSynchronize(cudaStreamPerThread), "device copy");
  }

  absl::Status ConvertOnDevice(int32_t index, const void* src, DType src_dtype,
                               void* dst, DType dst_dtype,
                               int64_t count) const override {
    ScopedDevice device(index);
    MODELSTATE_RETURN_IF_ERROR(device.status());
    CUDA_RETURN_IF_ERROR(static_cast<cudaError_t>(LaunchConvert(
        src, static_cast<int>(src_dtype), dst, static_cast<int>(dst_dtype),
        count, cudaStreamPerThread)));
    return CudaError(cudaStreamSynchronize(cudaStreamPerThread),
                     "dtype conversion");
  }

 private:
  // Counts the GPUs once; a machine without a driver or GPU has 0 and a
  // reason.
  void Probe() const {
    std::call_once(probe_once_, [this] {
      int count = 0;
      const cudaError_t error = cudaGetDeviceCount(&count);
      if (error != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        count_ = 0;
        // Without a GPU driver this says "driver version is insufficient",
        // which alone would mislead: say what it means first.
        reason_ = absl::StrCat("built with CUDA, but no GPU is usable: ",
                               cudaGetErrorString(error));
      } else {
        count_ = count;
        if (count == 0) reason_ = "built with CUDA, but no GPU is visible";
      }
    });
  }

  absl::StatusOr<std::pair<uint64_t, uint64_t>> MemoryInfo(
      int32_t index) const {
    ScopedDevice device(index);
    MODELSTATE_RETURN_IF_ERROR(device.status());
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return std::make_pair(uint64_t{free_bytes}, uint64_t{total_bytes});
  }

  absl::StatusOr<std::unique_ptr<Lane>> AcquireLane(int32_t index) const {
    {
      MutexLock lock(&lanes_mu_);
      std::vector<std::unique_ptr<Lane>>& idle = idle_lanes_[index];
      if (!idle.empty()) {
        std::unique_ptr<Lane> lane = std::move(idle.back());
        idle.pop_back();
        return lane;
      }
    }
    return NewLane();
  }

  void ReleaseLane(int32_t index, std::unique_ptr<Lane> lane,
                   bool healthy) const {
    if (!healthy) return;  // Destroyed: its stream may be broken.
    MutexLock lock(&lanes_mu_);
    std::vector<std::unique_ptr<Lane>>& idle = idle_lanes_[index];
    if (idle.size() < kMaxIdleLanes) idle.push_back(std::move(lane));
  }

  mutable std::once_flag probe_once_;
  mutable int count_ = 0;
  mutable std::string reason_;
  mutable Mutex lanes_mu_;
  mutable absl::flat_hash_map<int32_t, std::vector<std::unique_ptr<Lane>>>
      idle_lanes_ ABSL_GUARDED_BY(lanes_mu_);
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeCudaBackend() {
  return std::make_unique<CudaBackend>();
}

}  // namespace modelstate::cuda
