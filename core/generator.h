// File: generator.h
// A random generator that reproduces PyTorch's CPU generator bit for bit:
// `Generator g(seed)` is `torch.manual_seed(seed)`, and the Fill* functions
// consume random numbers exactly as ATen's CPU kernels for
// `tensor.uniform_(from, to)` and `tensor.normal_(mean, std)` do on a
// contiguous tensor of the same dtype and element count.
//
// The reference is PyTorch 1.13 as its x86-64 builds run by default (the AVX2
// kernels, which use fused multiply-adds and, for float32 normal_ of 16 or
// more elements, a vectorised log/sin/cos). Float32 and float64 results
// therefore match `ATEN_CPU_CAPABILITY=avx2` (PyTorch's default on such CPUs;
// `avx512` gives the same values), not `ATEN_CPU_CAPABILITY=default`.
//
// Example:
//   Generator gen(0);
//   std::vector<float> w(6);
//   gen.FillUniform(DType::kFloat32, w.data(), 6, -0.57735, 0.57735);
//   // == torch.manual_seed(0); torch.empty(6).uniform_(-0.57735, 0.57735)
#ifndef MODELSTATE_CORE_GENERATOR_H_
#define MODELSTATE_CORE_GENERATOR_H_

#include <cstdint>
#include <optional>

#include "core/dtype.h"

namespace modelstate {

// Thread-compatible: one generator must not be used by two threads at once.
class Generator {
 public:
  // Seeds like torch.manual_seed(seed). Like PyTorch's mt19937, only the low
  // 32 bits of `seed` matter.
  explicit Generator(uint64_t seed);

  // The next 32 / 64 random bits (at::CPUGeneratorImpl::random/random64; the
  // first 32-bit draw is the high half of the 64-bit value).
  uint32_t Random();
  uint64_t Random64();

  // Fills `count` elements at `data` (of floating `dtype`) like
  // `tensor.uniform_(from, to)`. REQUIRES: IsFloatingPoint(dtype).
  void FillUniform(DType dtype, void* data, int64_t count, double from,
                   double to);

  // Fills `count` elements at `data` (of floating `dtype`) like
  // `tensor.normal_(mean, std)`. REQUIRES: IsFloatingPoint(dtype).
  void FillNormal(DType dtype, void* data, int64_t count, double mean,
                  double std);

 private:
  static constexpr int kStateSize = 624;

  // Runs mt19937's twist over state_ and tempers the new block into output_.
  void Refill();
  // Skips `count` 32-bit draws.
  void Discard(int64_t count);
  // One N(0, 1) sample from ATen's at::normal_distribution<double>, which
  // makes two at a time and caches the second.
  double NextStandardNormal();

  // The per-dtype bodies of FillUniform / FillNormal. `Reduced` ones take
  // kFloat16 or kBFloat16.
  void FillUniformReduced(DType dtype, uint16_t* data, int64_t count,
                          double from, double to);
  void FillNormalReduced(DType dtype, uint16_t* data, int64_t count,
                         double mean, double std);
  void FillUniformFloat(float* data, int64_t count, double from, double to);
  void FillUniformDouble(double* data, int64_t count, double from, double to);
  void FillNormalFloat(float* data, int64_t count, double mean, double std);
  void FillNormalDouble(double* data, int64_t count, double mean, double std);

  // mt19937 state, as at::mt19937 keeps it.
  uint32_t state_[kStateSize];
  // The tempered outputs of the current block of state_; output_[index_] is
  // the next draw, and index_ == kStateSize means the block is used up.
  uint32_t output_[kStateSize];
  int index_;
  // Box-Muller's second sample, cached as CPUGeneratorImpl caches it. (ATen
  // also has a float cache, but uniform_/normal_ never use it.)
  std::optional<double> next_double_normal_;
};

namespace generator_internal {
// For tests: true makes every Generator use the portable kernels even where
// the CPU has AVX2 and FMA (both give the same bits).
void ForcePortableKernelsForTesting(bool force);
}  // namespace generator_internal

}  // namespace modelstate

#endif  // MODELSTATE_CORE_GENERATOR_H_
