#include "core/emulated_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "core/internal/element_convert.h"
#include "core/storage.h"
#if MODELSTATE_WITH_CUDA
#include "core/cuda/cuda_backend.h"
#endif

namespace modelstate {
namespace {

// Device bytes are host bytes inverted.
void Invert(const void* src, void* dst, size_t nbytes) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < nbytes; ++i)
    out[i] = static_cast<unsigned char>(~in[i]);
}

template <typename Dst, typename Src>
void ConvertInverted(const void* src, void* dst, int64_t count) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < count; ++i) {
    Src value;
    Invert(in + i * sizeof(Src), &value, sizeof(Src));
    const Dst converted = internal::ConvertOne<Dst, Src>(value);
    Invert(&converted, out + i * sizeof(Dst), sizeof(Dst));
  }
}

class EmulatedCudaBackend : public DeviceBackend {
 public:
  explicit EmulatedCudaBackend(const EmulatedCudaOptions& options)
      : options_(options), used_(static_cast<size_t>(options.count)) {
    options_.staging_bytes =
        std::max<size_t>(kStagingGranule, (options.staging_bytes + 7) / 8 * 8);
  }

  DeviceType type() const override { return DeviceType::kCuda; }
  int DeviceCount() const override { return options_.count; }
  std::string UnavailableReason() const override {
    return options_.count == 0 ? "no emulated CUDA devices" : "";
  }
  absl::StatusOr<uint64_t> TotalMemory(int32_t index) const override {
    MODELSTATE_RETURN_IF_ERROR(CheckIndex(index));
    return options_.memory_bytes;
  }
  absl::StatusOr<uint64_t> FreeMemory(int32_t index) const override {
    MODELSTATE_RETURN_IF_ERROR(CheckIndex(index));
    MutexLock lock(&mu_);
    return options_.memory_bytes - used_[static_cast<size_t>(index)];
  }
  std::string DeviceName(int32_t index) const override {
    return absl::StrCat("Emulated CUDA device ", index, " (host memory)");
  }

  absl::StatusOr<void*> Allocate(int32_t index, size_t nbytes) const override {
    MODELSTATE_RETURN_IF_ERROR(CheckIndex(index));
    const size_t charged = std::max<size_t>(nbytes, 1);
    {
      MutexLock lock(&mu_);
      uint64_t& used = used_[static_cast<size_t>(index)];
      if (charged > options_.memory_bytes - used) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cuda:", index, " is out of memory: tried to allocate ", nbytes,
            " bytes with ", options_.memory_bytes - used, " of ",
            options_.memory_bytes, " bytes free"));
      }
      used += charged;
    }
    auto* block = static_cast<size_t*>(std::malloc(charged + 16));
    if (block == nullptr) {
      Release(index, charged);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", nbytes, " bytes on cuda:", index));
    }
    block[0] = charged;  // The 16-byte header keeps the payload aligned.
    return static_cast<void*>(block + 2);
  }

  void Free(int32_t index, void* ptr) const override {
    size_t* block = static_cast<size_t*>(ptr) - 2;
    Release(index, block[0]);
    std::free(block);
  }

  absl::Status Upload(int32_t index, void* dst, size_t nbytes,
                      StagingFill fill) const override {
    MODELSTATE_RETURN_IF_ERROR(CheckIndex(index));
    std::vector<char> staging(options_.staging_bytes);
    for (size_t offset = 0; offset < nbytes; offset += staging.size()) {
      const size_t length = std::min(staging.size(), nbytes - offset);
      fill(staging.data(), offset, length);
      Invert(staging.data(), static_cast<char*>(dst) + offset, length);
    }
    return absl::OkStatus();
  }

  absl::Status Download(int32_t index, const void* src, size_t nbytes,
                        StagingDrain drain) const override {
    MODELSTATE_RETURN_IF_ERROR(CheckIndex(index));
    std::vector<char> staging(options_.staging_bytes);
    for (size_t offset = 0; offset < nbytes; offset += staging.size()) {
      const size_t length = std::min(staging.size(), nbytes - offset);
      Invert(static_cast<const char*>(src) + offset, staging.data(), length);
      drain(staging.data(), offset, length);
    }
    return absl::OkStatus();
  }

  absl::Status CopyOnDevice(int32_t dst_index, void* dst, int32_t src_index,
                            const void* src, size_t nbytes) const override {
    MODELSTATE_RETURN_IF_ERROR(CheckIndex(dst_index));
    MODELSTATE_RETURN_IF_ERROR(CheckIndex(src_index));
    std::memmove(dst, src, nbytes);
    return absl::OkStatus();
  }

  absl::Status ConvertOnDevice(int32_t index, const void* src, DType src_dtype,
                               void* dst, DType dst_dtype,
                               int64_t count) const override {
    MODELSTATE_RETURN_IF_ERROR(CheckIndex(index));
    internal::VisitElementType(static_cast<int>(src_dtype), [&](auto src_tag) {
      internal::VisitElementType(
          static_cast<int>(dst_dtype), [&](auto dst_tag) {
            ConvertInverted<decltype(dst_tag), decltype(src_tag)>(src, dst,
                                                                  count);
          });
    });
    return absl::OkStatus();
  }

 private:
  absl::Status CheckIndex(int32_t index) const {
    if (index < 0 || index >= options_.count) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda:", index, " does not exist (", options_.count,
                       " emulated devices)"));
    }
    return absl::OkStatus();
  }
  void Release(int32_t index, size_t charged) const {
    MutexLock lock(&mu_);
    used_[static_cast<size_t>(index)] -= charged;
  }

  EmulatedCudaOptions options_;
  mutable Mutex mu_;
  mutable std::vector<uint64_t> used_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void InstallEmulatedCudaDevices(const EmulatedCudaOptions& options) {
  RegisterDeviceBackend(std::make_unique<EmulatedCudaBackend>(options));
}

void UninstallEmulatedCudaDevices() {
#if MODELSTATE_WITH_CUDA
  RegisterDeviceBackend(cuda::MakeCudaBackend());
#else
  RemoveDeviceBackend(DeviceType::kCuda);
#endif
}

}  // namespace modelstate
