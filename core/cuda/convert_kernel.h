// File: cuda/convert_kernel.h
// dtype conversion on a CUDA device with the CPU's results bit for bit (the
// rules of internal/element_convert.h, compiled for the device). Declared
// without CUDA types so that host C++ can call it.
//
// Example (as the backend's ConvertOnDevice does):
//   int error = LaunchConvert(src, static_cast<int>(DType::kFloat32), dst,
//                             static_cast<int>(DType::kFloat16), count,
//                             cudaStreamPerThread);
//   if (error == 0) error = cudaStreamSynchronize(cudaStreamPerThread);
#ifndef MODELSTATE_CORE_CUDA_CONVERT_KERNEL_H_
#define MODELSTATE_CORE_CUDA_CONVERT_KERNEL_H_

#include <cstdint>

namespace modelstate::cuda {

// Enqueues the conversion of `count` elements from `src` (dtype number
// `src_dtype`, core/dtype.h's order) into `dst` (`dst_dtype`) on `stream`
// (a cudaStream_t) of the current device. Returns the cudaError_t of the
// launch (as int; 0 is success); an unknown dtype number gives
// cudaErrorInvalidValue.
int LaunchConvert(const void* src, int src_dtype, void* dst, int dst_dtype,
                  int64_t count, void* stream);

}  // namespace modelstate::cuda

#endif  // MODELSTATE_CORE_CUDA_CONVERT_KERNEL_H_
