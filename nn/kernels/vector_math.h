// File: vector_math.h
// Private to nn's kernels and their tests: float32 activations and softmax
// over contiguous arrays, eight lanes at a time on CPUs with AVX2 and FMA.
//
// The vector paths evaluate exp and erf with polynomial approximations
// (relative error a few float ulps, about 2e-7 at worst) instead of calling
// libm's scalar std::exp / std::erf per element, which made GELU and softmax
// a large share of a transformer block's forward. Special values behave as
// the textbook formulas do in float: exp(-inf) is exactly 0, so masked
// attention scores vanish exactly; NaN propagates; gelu(-inf) is NaN like
// PyTorch's. Tails shorter than a vector take the same vector code through
// masked loads; CPUs without AVX2 + FMA evaluate the formulas with libm.
//
// Example:
//   internal::GeluErfInPlace(data, n);  // data[i] = gelu(data[i])
#ifndef MODELSTATE_NN_KERNELS_VECTOR_MATH_H_
#define MODELSTATE_NN_KERNELS_VECTOR_MATH_H_

#include <cstdint>

namespace modelstate::internal {

// x * Phi(x), Phi the normal CDF: 0.5 x (1 + erf(x / sqrt 2)).
void GeluErfInPlace(float* data, int64_t n);
// GELU's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// evaluated as x / (1 + exp(-2 u)), the same function without the
// cancellation in 1 + tanh for negative x.
void GeluTanhInPlace(float* data, int64_t n);
// x / (1 + exp(-x)).
void SiluInPlace(float* data, int64_t n);
// 1 / (1 + exp(-x)).
void SigmoidInPlace(float* data, int64_t n);
// exp(x - max) / sum over row[0, n), in place. A row with no finite maximum
// (all -inf, or +inf or NaN anywhere) becomes all NaN, as in PyTorch.
void SoftmaxRowInPlace(float* row, int64_t n);

// max |data[i]| over [0, n), +inf when any element is NaN; 0 when n = 0.
float MaxAbs(const float* data, int64_t n);

// Whether the AVX2 + FMA paths run on this CPU.
bool VectorMathUsesAvx2();

// Element-wise exp through the vector path where there is one (tests).
void ExpInPlace(float* data, int64_t n);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_KERNELS_VECTOR_MATH_H_
