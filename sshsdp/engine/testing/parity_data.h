// Test data shared by the engine's parity tests (parity, baselines, Muon, MoE, direct path).
//
// The paper's correctness method compares a multi-rank run with a single-process run of the
// same logical update. Both must see the same global batch per step: sample
// ((step·M + mb)·W + rank)·B + b on W ranks with M microbatches is the same sample as
// microbatch mb·W + rank of a one-rank run with W·M microbatches. Tokens depend only on
// (sample, position), never on the layout.
//
//   int64_t step = 0;
//   BatchFn dist = testing::MakeBatch(&step, M, W, rank, B, T, V);
//   BatchFn ref = testing::MakeBatch(&step, M * W, 1, 0, B, T, V);
#pragma once

#include <cstdint>

#include "sshsdp/engine/engine.h"

namespace sshsdp::testing {

// Token of (sample, position): deterministic, independent of layout.
inline int32_t Tok(int64_t sample, int t, int vocab) {
  uint64_t x = static_cast<uint64_t>(sample) * 1000003u + static_cast<uint64_t>(t) * 7919u + 17;
  x ^= x >> 13;
  x *= 0x9E3779B97F4A7C15ull;
  return static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
}

// Microbatches of `rank` (of W) at optimizer step *step with M microbatches of B samples.
inline BatchFn MakeBatch(int64_t* step, int M, int W, int rank, int B, int T, int V) {
  return [=](int mb, int32_t* tok, int32_t* tgt) {
    for (int b = 0; b < B; ++b) {
      int64_t sample = ((*step * M + mb) * W + rank) * B + b;
      for (int t = 0; t < T; ++t) {
        tok[b * T + t] = Tok(sample, t, V);
        tgt[b * T + t] = Tok(sample, t + 1, V);
      }
    }
  };
}

}  // namespace sshsdp::testing
