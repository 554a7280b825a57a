// File: crc32c.h
// CRC-32C (Castagnoli, the iSCSI polynomial), the checksum the data
// directory keeps for every stored tensor so that a flipped byte on disk is
// reported by the read or scrub that meets it instead of served. Uses the
// SSE4.2 crc32 instruction when the CPU has it (chosen at run time), three
// chains of it at once over large inputs; a table otherwise.
//
// Example:
//   uint32_t crc = Crc32c("123456789");          // 0xe3069283
//   uint32_t more = Crc32cExtend(crc, "more");   // as if over both pieces
#ifndef MODELSTATE_BASE_CRC32C_H_
#define MODELSTATE_BASE_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace modelstate {

// The CRC of `previous`'s data followed by `bytes` (previous = 0 to start).
uint32_t Crc32cExtend(uint32_t previous, absl::string_view bytes);

inline uint32_t Crc32c(absl::string_view bytes) {
  return Crc32cExtend(0, bytes);
}

namespace internal {
// The portable path, exposed so tests can check both paths agree.
uint32_t Crc32cExtendPortable(uint32_t previous, absl::string_view bytes);
// One chain of the instruction (the portable path without it): what
// Crc32cExtend did before it ran three, for tests and the benchmark.
uint32_t Crc32cExtendOneStream(uint32_t previous, absl::string_view bytes);
// Whether Crc32cExtend uses the SSE4.2 instruction on this CPU.
bool Crc32cUsesHardware();
}  // namespace internal

}  // namespace modelstate

#endif  // MODELSTATE_BASE_CRC32C_H_
