// Bulk stochastic rounding to bf16: Philox draws generated a tile at a time, addressed by
// logical element index (see stochastic_rounding.h).
#include "sshsdp/numerics/stochastic_rounding.h"

#include <algorithm>
#include <limits>

#include "sshsdp/base/error.h"
#include "sshsdp/numerics/philox.h"

namespace sshsdp {
namespace {

constexpr size_t kTileBlocks = 64;  // 512 elements per Philox batch
constexpr size_t kElemsPerBlock = 8;

}  // namespace

void CheckSrRange(const SrKey& key, size_t n, uint64_t first) {
  SSHSDP_CHECK(key.step <= std::numeric_limits<uint32_t>::max(), NumericsError,
               "stochastic rounding: step {} does not fit the 32-bit Philox counter word",
               key.step);
  SSHSDP_CHECK(n <= std::numeric_limits<uint64_t>::max() - first, NumericsError,
               "stochastic rounding: element range [{}, {} + {}) overflows 64 bits", first, first,
               n);
}

namespace {

PhiloxKey KeyOf(const SrKey& key) {
  return {static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32)};
}

// Calls out(i, SR(value(i))) for i in [0, n), element i drawing at first + i.
template <typename Value, typename Out>
void RoundEach(size_t n, const SrKey& key, uint64_t first, Value&& value, Out&& out) {
  CheckSrRange(key, n, first);
  const PhiloxKey pk = KeyOf(key);
  const uint32_t step = static_cast<uint32_t>(key.step);
  uint32_t words[4 * kTileBlocks];
  uint16_t draws[kElemsPerBlock * kTileBlocks];
  size_t i = 0;
  while (i < n) {
    const uint64_t e = first + i;
    const size_t offset = static_cast<size_t>(e % kElemsPerBlock);
    const size_t count = std::min(n - i, kTileBlocks * kElemsPerBlock - offset);
    const size_t nblocks = (offset + count + kElemsPerBlock - 1) / kElemsPerBlock;
    PhiloxBlocks(e / kElemsPerBlock, step, key.stream, pk, nblocks, words);
    for (size_t w = 0; w < 4 * nblocks; ++w) {  // low half first
      draws[2 * w] = static_cast<uint16_t>(words[w]);
      draws[2 * w + 1] = static_cast<uint16_t>(words[w] >> 16);
    }
    for (size_t t = 0; t < count; ++t)
      out(i + t, StochasticRoundBf16(value(i + t), draws[offset + t]));
    i += count;
  }
}

}  // namespace

uint16_t SrDraw(const SrKey& key, uint64_t index) {
  CheckSrRange(key, 1, index);
  const uint64_t block = index / kElemsPerBlock;
  const PhiloxBlock b =
      Philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                     static_cast<uint32_t>(key.step), key.stream},
                    KeyOf(key));
  const size_t j = static_cast<size_t>(index % kElemsPerBlock);
  return static_cast<uint16_t>(b[j / 2] >> (16 * (j & 1)));
}

void StochasticRoundBf16(const float* src, bf16* dst, size_t n, const SrKey& key,
                         uint64_t first_element_index) {
  RoundEach(
      n, key, first_element_index, [&](size_t i) { return src[i]; },
      [&](size_t i, bf16 h) { dst[i] = h; });
}

void StochasticRoundSumBf16(const float* const* srcs, size_t num_srcs, bf16* dst, size_t n,
                            const SrKey& key, uint64_t first_element_index) {
  SSHSDP_CHECK(num_srcs >= 1, NumericsError, "StochasticRoundSumBf16 needs at least one source");
  RoundEach(
      n, key, first_element_index,
      [&](size_t i) {
        float s = srcs[0][i];
        for (size_t j = 1; j < num_srcs; ++j) s += srcs[j][i];
        return s;
      },
      [&](size_t i, bf16 h) { dst[i] = h; });
}

void StochasticRoundSumBf16(const bf16* const* srcs, size_t num_srcs, bf16* dst, size_t n,
                            const SrKey& key, uint64_t first_element_index) {
  SSHSDP_CHECK(num_srcs >= 1, NumericsError, "StochasticRoundSumBf16 needs at least one source");
  RoundEach(
      n, key, first_element_index,
      [&](size_t i) {
        float s = Bf16ToFloat(srcs[0][i]);
        for (size_t j = 1; j < num_srcs; ++j) s += Bf16ToFloat(srcs[j][i]);
        return s;
      },
      [&](size_t i, bf16 h) { dst[i] = h; });
}

void StochasticRoundAccumulateBf16(bf16* acc, const float* src, size_t n, const SrKey& key,
                                   uint64_t first_element_index) {
  RoundEach(
      n, key, first_element_index, [&](size_t i) { return Bf16ToFloat(acc[i]) + src[i]; },
      [&](size_t i, bf16 h) { acc[i] = h; });
}

}  // namespace sshsdp
