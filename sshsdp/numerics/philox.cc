// Bulk Philox-4x32-10: eight counters per pass in structure-of-arrays form so the compiler
// can keep the lanes in vector registers; the tail goes through the scalar function.
#include "sshsdp/numerics/philox.h"

namespace sshsdp {

void PhiloxBlocks(uint64_t first, uint32_t c2, uint32_t c3, PhiloxKey key, size_t n,
                  uint32_t* out) {
  constexpr size_t kLanes = 8;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    uint32_t x0[kLanes], x1[kLanes], x2[kLanes], x3[kLanes];
    for (size_t l = 0; l < kLanes; ++l) {
      const uint64_t ctr = first + i + l;
      x0[l] = static_cast<uint32_t>(ctr);
      x1[l] = static_cast<uint32_t>(ctr >> 32);
      x2[l] = c2;
      x3[l] = c3;
    }
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        k0 += kPhiloxW0;
        k1 += kPhiloxW1;
      }
      for (size_t l = 0; l < kLanes; ++l) {
        const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * x0[l];
        const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * x2[l];
        const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ x1[l] ^ k0;
        const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ x3[l] ^ k1;
        x1[l] = static_cast<uint32_t>(p1);
        x3[l] = static_cast<uint32_t>(p0);
        x0[l] = n0;
        x2[l] = n2;
      }
    }
    for (size_t l = 0; l < kLanes; ++l) {
      uint32_t* o = out + 4 * (i + l);
      o[0] = x0[l];
      o[1] = x1[l];
      o[2] = x2[l];
      o[3] = x3[l];
    }
  }
  for (; i < n; ++i) {
    const uint64_t ctr = first + i;
    const PhiloxBlock b =
        Philox4x32_10({static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), c2, c3}, key);
    for (int w = 0; w < 4; ++w) out[4 * i + w] = b[w];
  }
}

}  // namespace sshsdp
