#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/convert_kernel.h"
#include "core/internal/element_convert.h"

namespace modelstate::cuda {
namespace {

// Grid-stride loop: any count with a bounded grid.
template <typename Dst, typename Src>
__global__ void ConvertKernel(const Src* src, Dst* dst, int64_t count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    dst[i] = internal::ConvertOne<Dst, Src>(src[i]);
  }
}

}  // namespace

int LaunchConvert(const void* src, int src_dtype, void* dst, int dst_dtype,
                  int64_t count, void* stream) {
  if (count <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(
      std::min<int64_t>((count + kThreads - 1) / kThreads, 65535));
  cudaError_t result = cudaErrorInvalidValue;
  internal::VisitElementType(src_dtype, [&](auto src_tag) {
    using Src = decltype(src_tag);
    internal::VisitElementType(dst_dtype, [&](auto dst_tag) {
      using Dst = decltype(dst_tag);
      ConvertKernel<Dst, Src>
          <<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
              static_cast<const Src*>(src), static_cast<Dst*>(dst), count);
      result = cudaGetLastError();
    });
  });
  return result;
}

}  // namespace modelstate::cuda
