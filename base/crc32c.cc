#include "base/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace modelstate {
namespace {

// The reflected Castagnoli polynomial.
constexpr uint32_t kPolynomial = 0x82f63b78u;

// Eight tables so the portable path consumes eight bytes per step
// ("slicing by 8"): table[k][b] is the CRC of byte b followed by k zero
// bytes.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    }
    t[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
  return t;
}

constexpr Tables kTables = MakeTables();

#if defined(__x86_64__)
// The instruction's own pace: one crc32 on eight bytes at a time.
__attribute__((target("sse4.2"))) uint32_t ExtendOneStream(
    uint32_t previous, absl::string_view bytes) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  uint64_t crc = ~previous;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n, ++p) {
    crc = _mm_crc32_u8(static_cast<uint32_t>(crc), static_cast<uint8_t>(*p));
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    crc = _mm_crc32_u64(crc, word);
  }
  for (; n > 0; --n, ++p) {
    crc = _mm_crc32_u8(static_cast<uint32_t>(crc), static_cast<uint8_t>(*p));
  }
  return ~static_cast<uint32_t>(crc);
}

// A crc32 instruction takes three cycles to finish but the CPU starts a new
// one every cycle, so one chain of them runs at a third of the speed the
// CPU has. Three chains over three adjacent stretches of kStretch bytes run
// together; their CRCs are then joined. The CRC register is linear over
// GF(2): the register after stretches A, B, C is Z(Z(a) ^ b) ^ c, where a is
// the register after A (from the running value), b and c those after B and
// C alone (from zero), and Z is the effect of kStretch zero bytes.
constexpr size_t kStretch = 4096;

// Z tabulated for each byte of the register (Z is linear, so the four
// bytes' images XOR together).
using ShiftTables = std::array<std::array<uint32_t, 256>, 4>;

const ShiftTables& StretchShift() {
  static const ShiftTables* const tables = [] {
    std::array<uint32_t, 32> basis;  // Z of each single bit
    for (int bit = 0; bit < 32; ++bit) {
      uint32_t r = 1u << bit;
      for (size_t i = 0; i < kStretch; ++i) r = (r >> 8) ^ kTables[0][r & 0xff];
      basis[bit] = r;
    }
    auto* t = new ShiftTables();
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t image = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if ((b >> bit) & 1u) image ^= basis[8 * k + bit];
        }
        (*t)[k][b] = image;
      }
    }
    return t;
  }();
  return *tables;
}

uint32_t ShiftOverStretch(const ShiftTables& z, uint32_t r) {
  return z[0][r & 0xff] ^ z[1][(r >> 8) & 0xff] ^ z[2][(r >> 16) & 0xff] ^
         z[3][r >> 24];
}

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(
    uint32_t previous, absl::string_view bytes) {
  if (bytes.size() < 3 * kStretch) return ExtendOneStream(previous, bytes);
  const ShiftTables& z = StretchShift();
  const char* p = bytes.data();
  size_t n = bytes.size();
  uint32_t crc = ~previous;
  auto word = [](const char* at) {
    uint64_t w;
    std::memcpy(&w, at, 8);
    return w;
  };
  for (; n >= 3 * kStretch; n -= 3 * kStretch, p += 3 * kStretch) {
    uint64_t a = crc;
    uint64_t b = 0;
    uint64_t c = 0;
    for (size_t i = 0; i < kStretch; i += 8) {
      a = _mm_crc32_u64(a, word(p + i));
      b = _mm_crc32_u64(b, word(p + kStretch + i));
      c = _mm_crc32_u64(c, word(p + 2 * kStretch + i));
    }
    crc = ShiftOverStretch(z, ShiftOverStretch(z, static_cast<uint32_t>(a)) ^
                                  static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(c);
  }
  return ExtendOneStream(~crc, absl::string_view(p, n));
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

namespace internal {

uint32_t Crc32cExtendPortable(uint32_t previous, absl::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t n = bytes.size();
  uint32_t crc = ~previous;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t low;
    uint32_t high;
    std::memcpy(&low, p, 4);  // the tables assume a little-endian host
    std::memcpy(&high, p + 4, 4);
    low ^= crc;
    crc = kTables[7][low & 0xff] ^ kTables[6][(low >> 8) & 0xff] ^
          kTables[5][(low >> 16) & 0xff] ^ kTables[4][low >> 24] ^
          kTables[3][high & 0xff] ^ kTables[2][(high >> 8) & 0xff] ^
          kTables[1][(high >> 16) & 0xff] ^ kTables[0][high >> 24];
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ kTables[0][(crc ^ *p) & 0xff];
  return ~crc;
}

uint32_t Crc32cExtendOneStream(uint32_t previous, absl::string_view bytes) {
#if defined(__x86_64__)
  if (HasSse42()) return ExtendOneStream(previous, bytes);
#endif
  return Crc32cExtendPortable(previous, bytes);
}

bool Crc32cUsesHardware() {
#if defined(__x86_64__)
  return HasSse42();
#else
  return false;
#endif
}

}  // namespace internal

uint32_t Crc32cExtend(uint32_t previous, absl::string_view bytes) {
#if defined(__x86_64__)
  if (HasSse42()) return ExtendHardware(previous, bytes);
#endif
  return internal::Crc32cExtendPortable(previous, bytes);
}

}  // namespace modelstate
