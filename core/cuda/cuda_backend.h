// File: cuda/cuda_backend.h
// The CUDA device backend: cudaMalloc'd storage per GPU, host <-> device
// transfers pipelined through pinned staging buffers (filled by several
// threads for large transfers), device <-> device and
// peer copies, and dtype conversion kernels. Only in builds with
// MODELSTATE_WITH_CUDA; storage.cc installs it for DeviceType::kCuda. On a
// machine without a GPU it reports 0 devices and says why.
//
// Example (storage.cc installs the default one; cuda_bench chooses threads):
//   RegisterDeviceBackend(cuda::MakeCudaBackend(/*staging_threads=*/2));
//   MODELSTATE_ASSIGN_OR_RETURN(Tensor w,
//                               Tensor::Zeros(DType::kFloat32, {1024}));
//   MODELSTATE_ASSIGN_OR_RETURN(
//       Tensor on_gpu, w.To(Device::Cuda(0), DType::kFloat32));
#ifndef MODELSTATE_CORE_CUDA_CUDA_BACKEND_H_
#define MODELSTATE_CORE_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "core/storage.h"

namespace modelstate::cuda {

// `staging_threads`: at most this many threads (the caller's included) fill
// or drain the pinned staging buffers of one large host <-> device transfer;
// 0 means up to 8, fewer on a machine with fewer hardware threads.
std::unique_ptr<DeviceBackend> MakeCudaBackend(int staging_threads = 0);

}  // namespace modelstate::cuda

#endif  // MODELSTATE_CORE_CUDA_CUDA_BACKEND_H_
