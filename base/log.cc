#include "base/log.h"

#include <cstdio>
#include <string>

namespace modelstate::internal {

void LogLine(const std::string& message) {
  std::fprintf(stderr, "[modelstate] %s\n", message.c_str());
  std::fflush(stderr);
}

}  // namespace modelstate::internal
