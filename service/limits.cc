#include "service/limits.h"

namespace modelstate {

BuildLimits BuildLimitsFrom(const Limits& limits) {
  BuildLimits out;
  out.max_depth = limits.max_spec_depth;
  out.max_entries = limits.max_entries;
  out.max_tensor_bytes = limits.max_tensor_bytes;
  out.max_total_bytes = limits.max_module_bytes;
  return out;
}

StreamLimits StreamLimitsFrom(const Limits& limits) {
  StreamLimits out;
  out.max_tensor_bytes = limits.max_tensor_bytes;
  out.max_total_bytes = limits.max_module_bytes;
  out.max_entries = static_cast<uint64_t>(limits.max_entries);
  return out;
}

}  // namespace modelstate
