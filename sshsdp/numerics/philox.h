// Philox-4x32-10 counter-based random number generator (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC'11; the Random123 library's philox4x32 with 10 rounds).
//
// A pure function of a 128-bit counter and a 64-bit key: no state, so any element of a
// random stream can be drawn directly, in any order, on any rank. Stochastic rounding
// (stochastic_rounding.h) keys it by (seed, step) and puts the logical element index in the
// counter, which makes runs reproduce bit for bit and resume exactly.
//
//   PhiloxBlock out = Philox4x32_10({0, 0, 0, 0}, {0, 0});
//   // out = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8} (Random123 known answer)
//   std::vector<uint32_t> words(4 * n);
//   PhiloxBlocks(first_block, c2, c3, key, n, words.data());  // counters first_block + i
//
// One round: (hi0, lo0) = 0xD2511F53·c0, (hi1, lo1) = 0xCD9E8D57·c2 (32x32 -> 64-bit
// products), c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0); between rounds the key is bumped
// by (0x9E3779B9, 0xBB67AE85) mod 2^32.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace sshsdp {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;
using PhiloxBlock = std::array<uint32_t, 4>;

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline PhiloxBlock Philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

// n consecutive blocks: block i uses counter (lo32(first + i), hi32(first + i), c2, c3) and
// writes its four words to out[4i .. 4i+3]. Same values as Philox4x32_10, computed several
// counters at a time.
void PhiloxBlocks(uint64_t first, uint32_t c2, uint32_t c3, PhiloxKey key, size_t n, uint32_t* out);

}  // namespace sshsdp
