// File: internal/dtype_kernels.h
// Private to dtype.cc and its tests: the float32 <-> float16/bfloat16 array
// kernels, scalar and SIMD, plus the run-time choice between them. The scalar
// bit-level conversions they build on are in internal/element_convert.h
// (shared with the CUDA kernels). See core/dtype.h for the
// rounding and NaN rules these implement.
#ifndef MODELSTATE_CORE_INTERNAL_DTYPE_KERNELS_H_
#define MODELSTATE_CORE_INTERNAL_DTYPE_KERNELS_H_

#include <cstdint>

#include "core/internal/element_convert.h"

namespace modelstate::internal {

// Array kernels over `n` >= 0 elements: float32 on one side, float16 or
// bfloat16 bits on the other. Pointers need no alignment (tensor data from
// the wire may sit at any byte offset); src and dst must not overlap.
using NarrowKernel = void (*)(const void* src, void* dst, int64_t n);
using WidenKernel = void (*)(const void* src, void* dst, int64_t n);

void FloatToHalfScalar(const void* src, void* dst, int64_t n);
void HalfToFloatScalar(const void* src, void* dst, int64_t n);
void FloatToBFloat16Scalar(const void* src, void* dst, int64_t n);
void BFloat16ToFloatScalar(const void* src, void* dst, int64_t n);

// SIMD kernels; call only when the matching Cpu*() check is true. On
// non-x86 builds they are the scalar kernels.
void FloatToHalfF16C(const void* src, void* dst, int64_t n);
void HalfToFloatF16C(const void* src, void* dst, int64_t n);
void FloatToBFloat16Avx2(const void* src, void* dst, int64_t n);
void BFloat16ToFloatAvx2(const void* src, void* dst, int64_t n);

// Whether the CPU (and OS) support the SIMD kernels: F16C kernels need
// both AVX2 and F16C, bfloat16 kernels AVX2.
bool CpuHasAvx2F16C();
bool CpuHasAvx2();

// The kernels ConvertElements uses: the SIMD ones when the CPU has them,
// chosen on first use, else the scalar ones.
struct HalfKernels {
  NarrowKernel float_to_half;
  WidenKernel half_to_float;
  NarrowKernel float_to_bfloat16;
  WidenKernel bfloat16_to_float;
};
const HalfKernels& SelectedHalfKernels();

}  // namespace modelstate::internal

#endif  // MODELSTATE_CORE_INTERNAL_DTYPE_KERNELS_H_
