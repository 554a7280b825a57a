#include "nn/kernels/parallel.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace modelstate::internal {

void ParallelFor(int64_t n, int threads, int64_t cost_per_item,
                 const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  // Starting a thread costs tens of microseconds; below ~200 us of work a
  // second thread does not pay for itself.
  constexpr int64_t kMinWorkPerThread = 200'000;
  int64_t useful = std::max<int64_t>(1, n * cost_per_item / kMinWorkPerThread);
  int64_t parts = std::min<int64_t>({static_cast<int64_t>(threads), n, useful});
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(parts - 1);
  int64_t chunk = (n + parts - 1) / parts;
  for (int64_t p = 1; p < parts; ++p) {
    int64_t begin = p * chunk;
    int64_t end = std::min(n, begin + chunk);
    if (begin >= end) break;
    workers.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  fn(0, std::min(n, chunk));
  for (std::thread& t : workers) t.join();
}

}  // namespace modelstate::internal
