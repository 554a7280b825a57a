// File: generator.h
// A random generator that reproduces PyTorch's CPU generator bit for bit:
// `Generator g(seed)` is `torch.manual_seed(seed)`, and the Fill* functions
// consume random numbers exactly as ATen's CPU kernels for
// `tensor.uniform_(from, to)` and `tensor.normal_(mean, std)` do on a
// contiguous tensor of the same dtype and element count.
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
  // Seeds like torch.manual_seed(seed).
  explicit Generator(uint64_t seed);

  // The next 32 / 64 random bits (at::CPUGeneratorImpl::random/random64).
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
  // mt19937 state.
  uint32_t state_[624];
  int index_;
  // Box-Muller's second sample, cached as ATen caches it.
  std::optional<double> next_double_normal_;
  std::optional<float> next_float_normal_;
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_GENERATOR_H_
