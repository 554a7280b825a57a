// File: elementwise.h
// Element-wise kernels over contiguous arrays, templated on the compute
// type (float or double): the activations, and softmax (and log-softmax)
// over a row or over one dimension of a [outer, size, inner] block. float32
// takes the AVX2 paths of vector_math.h where they exist; loops over large
// arrays are split across threads with ParallelFor.
//
// Example:
//   internal::ActInPlace(internal::Act::kGELU, data, n, threads);
//   internal::SoftmaxRow(row, n);  // row = softmax(row)
#ifndef MODELSTATE_NN_KERNELS_ELEMENTWISE_H_
#define MODELSTATE_NN_KERNELS_ELEMENTWISE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "nn/kernels/parallel.h"
#include "nn/kernels/vector_math.h"

namespace modelstate::internal {

// The activations: ReLU, GELU (erf, or its tanh approximation), SiLU, tanh
// and the logistic sigmoid.
enum class Act { kReLU, kGELU, kGELUTanh, kSiLU, kTanh, kSigmoid };

template <typename T>
T ApplyAct(Act act, T x) {
  switch (act) {
    case Act::kReLU:
      // NaN stays NaN, as torch.relu keeps it.
      return x < T(0) ? T(0) : x;
    case Act::kGELU:
      return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2)));
    case Act::kGELUTanh: {
      const T k = T(M_2_SQRTPI * M_SQRT1_2);  // sqrt(2 / pi)
      return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    }
    case Act::kSiLU:
      return x / (T(1) + std::exp(-x));
    case Act::kTanh:
      return std::tanh(x);
    case Act::kSigmoid:
      return T(1) / (T(1) + std::exp(-x));
  }
  return x;
}

// The vectorised float32 kernel for `act`, or nullptr (ReLU and tanh stay
// on the scalar path: ReLU vectorises as written, tanh is rarely hot).
using FloatActKernel = void (*)(float*, int64_t);
inline FloatActKernel VectorKernel(Act act) {
  switch (act) {
    case Act::kGELU:
      return GeluErfInPlace;
    case Act::kGELUTanh:
      return GeluTanhInPlace;
    case Act::kSiLU:
      return SiluInPlace;
    case Act::kSigmoid:
      return SigmoidInPlace;
    case Act::kReLU:
    case Act::kTanh:
      break;
  }
  return nullptr;
}

template <typename T>
void ActInPlace(Act act, T* data, int64_t n, int threads) {
  if constexpr (std::is_same_v<T, float>) {
    if (FloatActKernel kernel = VectorKernel(act)) {
      // About 1 ns an element, against 20 for the scalar libm calls.
      ParallelFor(n, threads, 1, [&](int64_t begin, int64_t end) {
        kernel(data + begin, end - begin);
      });
      return;
    }
  }
  ParallelFor(n, threads, 20, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) data[i] = ApplyAct(act, data[i]);
  });
}

// Softmax over row[0, n) in place (vectorised for float).
template <typename T>
void SoftmaxRow(T* row, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    SoftmaxRowInPlace(row, n);
  } else {
    T max = -std::numeric_limits<T>::infinity();
    for (int64_t i = 0; i < n; ++i) max = std::max(max, row[i]);
    // An all -inf row gives NaN, as in PyTorch (exp(-inf - -inf)).
    T sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      row[i] = std::exp(row[i] - max);
      sum += row[i];
    }
    T inv = T(1) / sum;
    for (int64_t i = 0; i < n; ++i) row[i] *= inv;
  }
}

// Softmax over `dim` of a contiguous [outer, size, inner] view, in place.
template <typename T>
void SoftmaxInPlace(T* data, int64_t outer, int64_t size, int64_t inner,
                    int threads) {
  if (inner == 1) {
    const int64_t cost = std::is_same_v<T, float> ? size * 2 : size * 10;
    ParallelFor(outer, threads, cost, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) SoftmaxRow(data + row * size, size);
    });
    return;
  }
  ParallelFor(outer * inner, threads, size * 10, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      T* base = data + (idx / inner) * size * inner + idx % inner;
      T max = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < size; ++i) max = std::max(max, base[i * inner]);
      // An all -inf row gives NaN, as in PyTorch (exp(-inf - -inf)).
      T sum = 0;
      for (int64_t i = 0; i < size; ++i) {
        T v = std::exp(base[i * inner] - max);
        base[i * inner] = v;
        sum += v;
      }
      T inv = T(1) / sum;
      for (int64_t i = 0; i < size; ++i) base[i * inner] *= inv;
    }
  });
}

// Log-softmax over `dim` of a contiguous [outer, size, inner] view, in
// place: x - max - log(sum(exp(x - max))), as ATen's CPU kernel.
template <typename T>
void LogSoftmaxInPlace(T* data, int64_t outer, int64_t size, int64_t inner) {
  for (int64_t idx = 0; idx < outer * inner; ++idx) {
    T* base = data + (idx / inner) * size * inner + idx % inner;
    T max = -std::numeric_limits<T>::infinity();
    for (int64_t i = 0; i < size; ++i) max = std::max(max, base[i * inner]);
    T sum = 0;
    for (int64_t i = 0; i < size; ++i) sum += std::exp(base[i * inner] - max);
    const T shift = max + std::log(sum);
    for (int64_t i = 0; i < size; ++i) base[i * inner] -= shift;
  }
}

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_KERNELS_ELEMENTWISE_H_
