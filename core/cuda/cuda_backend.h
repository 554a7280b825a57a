// File: cuda/cuda_backend.h
// The CUDA device backend: cudaMalloc'd storage per GPU, host <-> device
// transfers pipelined through pinned staging buffers, device <-> device and
// peer copies, and dtype conversion kernels. Only in builds with
// MODELSTATE_WITH_CUDA; storage.cc installs it for DeviceType::kCuda. On a
// machine without a GPU it reports 0 devices and says why.
#ifndef MODELSTATE_CORE_CUDA_CUDA_BACKEND_H_
#define MODELSTATE_CORE_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "core/storage.h"

namespace modelstate::cuda {

std::unique_ptr<DeviceBackend> MakeCudaBackend();

}  // namespace modelstate::cuda

#endif  // MODELSTATE_CORE_CUDA_CUDA_BACKEND_H_
