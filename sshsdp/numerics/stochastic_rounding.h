// fp32 -> bf16 stochastic rounding (SR) with reproducible, position-addressed random bits.
// Used by the `bf16sr` gradient reduction mode (paper §4.3): node-local fp32 partial sums
// are stored as bf16 with SR, so rounding errors average out instead of biasing the sum.
//
//   SrKey key{.seed = run_seed, .step = optimizer_step, .stream = bucket_id};
//   StochasticRoundBf16(partial, out, n, key, /*first_element_index=*/shard_offset);
//   StochasticRoundSumBf16(srcs, num_srcs, out, n, key, shard_offset);  // fp32 sum, then SR
//
// Rule: add a uniform random 16-bit integer r to the fp32 bit pattern and clear the low 16
// bits. The value rounds up (away from zero) with probability low16/2^16, so E[SR(x)] = x
// exactly for every finite x with |x| <= bf16 max (negatives too: it acts on the magnitude;
// subnormals too: the carry walks into the exponent field correctly).
// Special values are handled before the addition:
//   NaN -> NaN (quiet bit set, sign kept), even a NaN whose payload is only in the low 16
//          bits (adding r could otherwise turn it into Inf or another value);
//   ±Inf -> ±Inf.
// Overflow: a finite value whose rounding up would give ±Inf (|x| > bf16 max = 0x7F7F,
//   about 3.39e38) is clamped to ±bf16 max. SR is then biased for those values (the only
//   ones it cannot represent); fp32 gradients that large are broken anyway, and Inf would
//   poison the reduction irrecoverably.
//
// Random bits. Philox-4x32-10 (philox.h) with key = seed (low, high 32 bits) and counter =
// (low32(e/8), high32(e/8), step, stream) for logical element index e: one 128-bit output
// serves eight consecutive elements, element e using 16-bit half (e%2) of word (e%8)/2
// (low half first). "Keyed by (seed, step)": the seed fills the 64-bit Philox key and the step
// a counter word (a 64-bit key cannot hold both without truncating the seed); for one key,
// distinct counters never share an output block, so steps and streams never reuse draws.
// Because the draw depends only on (seed, step, stream, e):
//   - any split of [0, n) into chunks, each called with its own first_element_index, gives
//     the same bits as one call (ranks can round their shards independently);
//   - a run reproduces bit for bit, and a resumed run draws the same bits: the only state a
//     checkpoint must save is the seed and the optimizer step (nothing else is consumed).
// Callers choose e as the LOGICAL position in the full (unsharded) buffer, so results do not
// depend on the sharding, and `stream` to separate independent uses within one step (e.g.
// the reduction of each gradient bucket). step must be < 2^32.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

struct SrKey {
  uint64_t seed = 0;
  uint64_t step = 0;  // < 2^32
  uint32_t stream = 0;
};

// One stochastic rounding with an explicit 16-bit draw r (the rule above).
inline bf16 StochasticRoundBf16(float x, uint16_t r) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  uint32_t v = (u + r) >> 16;  // for finite x the carry never reaches the sign bit
  v -= static_cast<uint32_t>((v & 0x7FFFu) == 0x7F80u);  // would be ±Inf: clamp to ±0x7F7F
  // NaN (quiet bit set) and ±Inf bypass the addition. Selects, not branches, so bulk loops
  // vectorize.
  const uint32_t special = (u >> 16) | (a > 0x7F800000u ? 0x0040u : 0u);
  return bf16{static_cast<uint16_t>(a >= 0x7F800000u ? special : v)};
}

// NumericsError unless key.step fits the 32-bit counter word and [first, first + n) fits in
// 64 bits: what every rounding call (on any backend, backend/backend.h) checks first.
void CheckSrRange(const SrKey& key, size_t n, uint64_t first);

// The 16-bit draw of logical element `index` under `key`.
uint16_t SrDraw(const SrKey& key, uint64_t index);

// dst[i] = SR(src[i]) with the draw of element first_element_index + i.
void StochasticRoundBf16(const float* src, bf16* dst, size_t n, const SrKey& key,
                         uint64_t first_element_index);

// dst[i] = SR(srcs[0][i] + srcs[1][i] + ... + srcs[num_srcs-1][i]), summed in fp32 in that
// order (fixed, so the result is reproducible). num_srcs >= 1. dst may alias no source.
void StochasticRoundSumBf16(const float* const* srcs, size_t num_srcs, bf16* dst, size_t n,
                            const SrKey& key, uint64_t first_element_index);
// Same with bf16 inputs (bf16 runtime gradients summed in fp32 by a node-local reducer).
void StochasticRoundSumBf16(const bf16* const* srcs, size_t num_srcs, bf16* dst, size_t n,
                            const SrKey& key, uint64_t first_element_index);

// acc[i] = SR(float(acc[i]) + src[i]): accumulate fp32 partials into a bf16 buffer.
void StochasticRoundAccumulateBf16(bf16* acc, const float* src, size_t n, const SrKey& key,
                                   uint64_t first_element_index);

}  // namespace sshsdp
