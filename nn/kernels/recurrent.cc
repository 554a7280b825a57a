// The recurrent kernels: input projections for all steps in one gemm, then
// per step the hidden projection on OpenBLAS and the gates in place.
#include "nn/kernels/recurrent.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/kernels/blas.h"

namespace modelstate::internal {
namespace {

template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// The new state of `rows` batch rows from their gate pre-activations:
// gx = x W_ih^T + b_ih and gh = h W_hh^T + b_hh, each [rows, G*H]. h_prev
// (GRU) and c (LSTM, updated in place) are [rows, H]; the new hidden state
// (before an LSTM's projection) goes to h_new [rows, H]. Only rows whose
// `active` entry is set (all when `active` is null) are computed.
template <typename T>
void Gates(Cell cell, int64_t rows, int64_t hidden, const T* gx, const T* gh,
           const T* h_prev, T* c, T* h_new, const bool* active) {
  const int64_t g = GateCount(cell) * hidden;
  for (int64_t r = 0; r < rows; ++r) {
    if (active != nullptr && !active[r]) continue;
    const T* x = gx + r * g;
    const T* hh = gh + r * g;
    T* out = h_new + r * hidden;
    switch (cell) {
      case Cell::kRnnTanh:
        for (int64_t j = 0; j < hidden; ++j) out[j] = std::tanh(hh[j] + x[j]);
        break;
      case Cell::kRnnRelu:
        for (int64_t j = 0; j < hidden; ++j) {
          const T v = hh[j] + x[j];
          out[j] = v < T(0) ? T(0) : v;
        }
        break;
      case Cell::kLstm: {
        T* cr = c + r * hidden;
        for (int64_t j = 0; j < hidden; ++j) {
          const T i = Sigmoid(hh[j] + x[j]);
          const T f = Sigmoid(hh[hidden + j] + x[hidden + j]);
          const T cg = std::tanh(hh[2 * hidden + j] + x[2 * hidden + j]);
          const T o = Sigmoid(hh[3 * hidden + j] + x[3 * hidden + j]);
          cr[j] = f * cr[j] + i * cg;
          out[j] = o * std::tanh(cr[j]);
        }
        break;
      }
      case Cell::kGru: {
        const T* hp = h_prev + r * hidden;
        for (int64_t j = 0; j < hidden; ++j) {
          const T reset = Sigmoid(hh[j] + x[j]);
          const T update = Sigmoid(hh[hidden + j] + x[hidden + j]);
          const T n = std::tanh(x[2 * hidden + j] + hh[2 * hidden + j] * reset);
          out[j] = (hp[j] - n) * update + n;
        }
        break;
      }
    }
  }
}

}  // namespace

int64_t GateCount(Cell cell) {
  switch (cell) {
    case Cell::kLstm:
      return 4;
    case Cell::kGru:
      return 3;
    case Cell::kRnnTanh:
    case Cell::kRnnRelu:
      break;
  }
  return 1;
}

template <typename T>
void RunRecurrent(const RecurrentShape& s, const RecurrentWeights<T>& w,
                  const T* x, const int64_t* lengths, T* h, T* c, T* out,
                  int64_t out_stride, int64_t out_offset) {
  const int64_t n = s.batch, hid = s.hidden;
  const int64_t hout = s.proj > 0 ? s.proj : hid;
  const int64_t g = GateCount(s.cell) * hid;
  // Every step's input projection in one gemm: [steps * batch, G*H].
  std::vector<T> gx(static_cast<size_t>(s.steps * n * g));
  LinearRows(x, s.steps * n, s.input, w.w_ih, g, w.b_ih, gx.data());
  std::vector<T> gh(static_cast<size_t>(n * g));
  std::vector<T> h_new(static_cast<size_t>(n * hid));
  std::vector<T> h_proj(s.proj > 0 ? static_cast<size_t>(n * hout) : 0);
  std::unique_ptr<bool[]> active;
  if (lengths != nullptr) active = std::make_unique<bool[]>(n);
  for (int64_t step = 0; step < s.steps; ++step) {
    const int64_t t = s.reverse ? s.steps - 1 - step : step;
    if (active != nullptr) {
      for (int64_t r = 0; r < n; ++r) active[r] = t < lengths[r];
    }
    // Padded steps of a row leave its state alone and output zeros.
    LinearRows(h, n, hout, w.w_hh, g, w.b_hh, gh.data());
    Gates(s.cell, n, hid, gx.data() + t * n * g, gh.data(), h, c, h_new.data(),
          active.get());
    const T* next = h_new.data();
    if (s.proj > 0) {
      LinearRows(h_new.data(), n, hid, w.w_hr, hout,
                 static_cast<const T*>(nullptr), h_proj.data());
      next = h_proj.data();
    }
    for (int64_t r = 0; r < n; ++r) {
      T* dst = out + (t * n + r) * out_stride + out_offset;
      if (active != nullptr && !active[r]) {
        std::fill(dst, dst + hout, T(0));
        continue;
      }
      std::copy(next + r * hout, next + (r + 1) * hout, h + r * hout);
      std::copy(next + r * hout, next + (r + 1) * hout, dst);
    }
  }
}

template void RunRecurrent<float>(const RecurrentShape&,
                                  const RecurrentWeights<float>&, const float*,
                                  const int64_t*, float*, float*, float*,
                                  int64_t, int64_t);
template void RunRecurrent<double>(const RecurrentShape&,
                                   const RecurrentWeights<double>&,
                                   const double*, const int64_t*, double*,
                                   double*, double*, int64_t, int64_t);

}  // namespace modelstate::internal
