#include "core/hook_list.h"

#include <atomic>

namespace modelstate::internal {

uint64_t NextHookId() {
  // One counter for every hook of every kind and list (PyTorch 4.12).
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

}  // namespace modelstate::internal
