// File: parallel.h
// A small parallel-for for the kernels' own loops (OpenBLAS threads its
// gemm itself).
//
// Example:
//   internal::ParallelFor(rows, threads, /*cost_per_item=*/cols * 4,
//                         [&](int64_t begin, int64_t end) {
//                           for (int64_t r = begin; r < end; ++r) Row(r);
//                         });
#ifndef MODELSTATE_NN_KERNELS_PARALLEL_H_
#define MODELSTATE_NN_KERNELS_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace modelstate::internal {

// Runs fn(begin, end) over [0, n) split into at most `threads` contiguous
// ranges, on this thread plus threads-1 new ones. Runs inline when threads
// <= 1 or the work (`n * cost_per_item`, in rough nanoseconds) is too small
// to pay for starting threads.
void ParallelFor(int64_t n, int threads, int64_t cost_per_item,
                 const std::function<void(int64_t, int64_t)>& fn);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_KERNELS_PARALLEL_H_
