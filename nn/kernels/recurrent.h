// File: recurrent.h
// The recurrent kernels: one direction of one layer of an RNN, LSTM or GRU
// over a time-major sequence, as ATen's CPU path computes it. The input
// projections of every step come from one gemm (x W_ih^T + b_ih over all
// steps at once); each step then runs one gemm for the hidden projection
// (h W_hh^T + b_hh) and the gate arithmetic, and for an LSTM with
// proj_size one more gemm (h W_hr^T). The cells (RNNCell, LSTMCell,
// GRUCell) are the same kernel over one step.
//
// Gate order is torch's: LSTM (input, forget, cell, output), GRU (reset,
// update, new) with n = tanh(x_n + r * (h W_hn^T + b_hn)) and
// h' = (h - n) * z + n.
//
// Example:
//   internal::RecurrentShape shape{.cell = internal::Cell::kLstm, .steps = L,
//                                  .batch = N, .input = I, .hidden = H};
//   internal::RecurrentWeights<float> w{w_ih, w_hh, b_ih, b_hh, nullptr};
//   internal::RunRecurrent(shape, w, x, nullptr, h, c, out, 2 * H, 0);
#ifndef MODELSTATE_NN_KERNELS_RECURRENT_H_
#define MODELSTATE_NN_KERNELS_RECURRENT_H_

#include <cstdint>

namespace modelstate::internal {

enum class Cell { kRnnTanh, kRnnRelu, kLstm, kGru };

// Gates per hidden unit: 1 (RNN), 4 (LSTM), 3 (GRU).
int64_t GateCount(Cell cell);

// The extents of one direction of one layer.
struct RecurrentShape {
  Cell cell;
  int64_t steps;         // L
  int64_t batch;         // N
  int64_t input;         // features of each step's input
  int64_t hidden;        // hidden_size
  int64_t proj = 0;      // LSTM proj_size; 0 for none
  bool reverse = false;  // walk the steps from the last valid one back
};

// The weights of one direction of one layer (biases and w_hr may be null).
// w_ih [G*H, input], w_hh [G*H, H_out], b_ih and b_hh [G*H], w_hr
// [proj, H], where H_out is proj or H.
template <typename T>
struct RecurrentWeights {
  const T* w_ih;
  const T* w_hh;
  const T* b_ih;
  const T* b_hh;
  const T* w_hr;
};

// Runs one direction over x [steps, batch, input] (time-major, contiguous).
// `lengths` (null: every row has all steps) gives each batch row's number
// of valid steps, each in [0, steps]: a row's state stops changing after
// its last valid step (a reversed walk starts at it) and its outputs past
// it are zero, as a packed sequence padded back gives. h [batch, H_out]
// and c [batch, H] (LSTM only; null otherwise) hold the initial state and
// receive the final one. Step t's hidden state goes to
// out[(t * batch + n) * out_stride + out_offset ...] (H_out values).
// REQUIRES: extents checked with CheckBlasDims.
template <typename T>
void RunRecurrent(const RecurrentShape& shape, const RecurrentWeights<T>& w,
                  const T* x, const int64_t* lengths, T* h, T* c, T* out,
                  int64_t out_stride, int64_t out_offset);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_KERNELS_RECURRENT_H_
