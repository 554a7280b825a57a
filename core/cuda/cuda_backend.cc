#include "core/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "core/cuda/convert_kernel.h"

namespace modelstate::cuda {
namespace {

// Pinned staging: each transfer worker owns a lane of kSlots buffers of
// kSlotBytes, so it fills (or drains) one while the other is in flight. A
// copy engine moves a slot in a fraction of the time the CPU takes to fill
// it, so the CPU copies set the pace: large transfers split their pieces
// among several workers (the caller and up to staging_threads - 1 more).
constexpr int kSlots = 2;
constexpr size_t kSlotBytes = size_t{4} << 20;
static_assert(kSlotBytes % DeviceBackend::kStagingGranule == 0);
// Without a stated number: as many staging threads as this, or the
// machine's hardware threads if fewer. On an H200's 16-CPU host, 8 threads
// staged 44.7 GB/s of the link's 55 and 16 no more (BENCHMARKS.md, CUDA).
constexpr int kDefaultStagingThreads = 8;

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

// Hands out the pieces of one transfer to its workers, lowest first, and
// keeps the first error; after one, no more pieces are handed out.
class PieceCursor {
 public:
  explicit PieceCursor(size_t pieces) : pieces_(pieces) {}

  std::optional<size_t> Next() {
    if (failed_.load(std::memory_order_acquire)) return std::nullopt;
    const size_t piece = next_.fetch_add(1, std::memory_order_relaxed);
    if (piece >= pieces_) return std::nullopt;
    return piece;
  }
  void Fail(absl::Status status) {
    MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = std::move(status);
    failed_.store(true, std::memory_order_release);
  }
  absl::Status status() const {
    MutexLock lock(&mu_);
    return first_error_;
  }

 private:
  const size_t pieces_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> failed_{false};
  mutable Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

class CudaBackend : public DeviceBackend {
 public:
  explicit CudaBackend(int staging_threads)
      : staging_threads_(
            staging_threads > 0
                ? staging_threads
                : std::clamp(
                      static_cast<int>(std::thread::hardware_concurrency()), 1,
                      kDefaultStagingThreads)) {}

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
    return RunWorkers(
        index, nbytes, [&](Lane& lane, PieceCursor& cursor) -> absl::Status {
          int used = 0;
          while (std::optional<size_t> piece = cursor.Next()) {
            const int slot = used++ % kSlots;
            // The slot's previous copy must be done before it is refilled.
            if (used > kSlots) {
              CUDA_RETURN_IF_ERROR(cudaEventSynchronize(lane.done[slot]));
            }
            const size_t offset = *piece * kSlotBytes;
            const size_t length = std::min(kSlotBytes, nbytes - offset);
            fill(lane.slot(slot), offset, length);
            CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                static_cast<char*>(dst) + offset, lane.slot(slot), length,
                cudaMemcpyHostToDevice, lane.stream));
            CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.done[slot], lane.stream));
          }
          return absl::OkStatus();
        });
  }

  absl::Status Download(int32_t index, const void* src, size_t nbytes,
                        StagingDrain drain) const override {
    return RunWorkers(
        index, nbytes, [&](Lane& lane, PieceCursor& cursor) -> absl::Status {
          // Up to kSlots pieces in flight; the oldest (`head`) is drained
          // while the others copy.
          std::array<size_t, kSlots> piece_in{};
          int head = 0;
          int queued = 0;
          while (true) {
            for (; queued < kSlots; ++queued) {
              std::optional<size_t> piece = cursor.Next();
              if (!piece) break;
              const int slot = (head + queued) % kSlots;
              const size_t offset = *piece * kSlotBytes;
              CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                  lane.slot(slot), static_cast<const char*>(src) + offset,
                  std::min(kSlotBytes, nbytes - offset), cudaMemcpyDeviceToHost,
                  lane.stream));
              CUDA_RETURN_IF_ERROR(
                  cudaEventRecord(lane.done[slot], lane.stream));
              piece_in[slot] = *piece;
            }
            if (queued == 0) return absl::OkStatus();
            CUDA_RETURN_IF_ERROR(cudaEventSynchronize(lane.done[head]));
            const size_t offset = piece_in[head] * kSlotBytes;
            drain(lane.slot(head), offset,
                  std::min(kSlotBytes, nbytes - offset));
            head = (head + 1) % kSlots;
            --queued;
          }
        });
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

  // The workers of one transfer: the calling thread and up to
  // staging_threads_ - 1 more, each with its own lane and `index` as its
  // current device, moving the pieces of `nbytes` that `cursor` hands out.
  // Returns once every worker's copies are done, with the first error.
  absl::Status RunWorkers(
      int32_t index, size_t nbytes,
      absl::FunctionRef<absl::Status(Lane&, PieceCursor&)> work) const {
    const size_t pieces = (nbytes + kSlotBytes - 1) / kSlotBytes;
    // Up to one worker per piece: a thread starts in tens of microseconds,
    // a piece takes hundreds to fill.
    const size_t workers =
        std::clamp<size_t>(pieces, 1, static_cast<size_t>(staging_threads_));
    PieceCursor cursor(pieces);
    auto run = [&] {
      ScopedDevice device(index);
      absl::Status status = device.status();
      if (status.ok()) {
        absl::StatusOr<std::unique_ptr<Lane>> lane = AcquireLane(index);
        status = lane.status();
        if (status.ok()) {
          status = work(**lane, cursor);
          const absl::Status synced = CudaError(
              cudaStreamSynchronize((*lane)->stream), "staging copies");
          ReleaseLane(index, *std::move(lane), synced.ok());
          if (status.ok()) status = synced;
        }
      }
      if (!status.ok()) cursor.Fail(std::move(status));
    };
    std::vector<std::thread> helpers;
    helpers.reserve(workers - 1);
    for (size_t i = 1; i < workers; ++i) helpers.emplace_back(run);
    run();
    for (std::thread& helper : helpers) helper.join();
    return cursor.status();
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
    // As many as one transfer's workers use; concurrent transfers beyond
    // that allocate lanes of their own and free them afterwards.
    if (idle.size() < static_cast<size_t>(staging_threads_)) {
      idle.push_back(std::move(lane));
    }
  }

  const int staging_threads_;
  mutable std::once_flag probe_once_;
  mutable int count_ = 0;
  mutable std::string reason_;
  mutable Mutex lanes_mu_;
  mutable absl::flat_hash_map<int32_t, std::vector<std::unique_ptr<Lane>>>
      idle_lanes_ ABSL_GUARDED_BY(lanes_mu_);
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeCudaBackend(int staging_threads) {
  return std::make_unique<CudaBackend>(staging_threads);
}

}  // namespace modelstate::cuda
