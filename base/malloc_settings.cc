#include "base/malloc_settings.h"

#include <malloc.h>

namespace modelstate {

bool ReuseMessageMemory() {
  // Evaluated in order, all three even when one fails: whatever malloc
  // accepts still helps.
  const bool mmap = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  const bool arena = mallopt(M_ARENA_MAX, 1) == 1;
  return mmap && trim && arena;
}

}  // namespace modelstate
