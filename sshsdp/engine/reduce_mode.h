// ReduceMode: precision of the per-microbatch gradient reduction (paper §4.3, §6.1 "Precision
// ablation"; EngineConfig::reduce, `sshsdp train --reduce`).
//
//   kFp32      fp32 runtime gradients G′, fp32 partial sums, fp32 accumulation into G′ᶻ².
//   kBf16Fp32  bf16 G′ (backward writes bf16), fp32 partials, final fp32 accumulation into the
//              persistent fp32 G′ᶻ² ("bf16+fp32").
//   kBf16Sr    bf16 G′ and bf16 partials stored with stochastic rounding, final fp32
//              accumulation into G′ᶻ². SR draws are keyed by (EngineConfig::sr_seed, optimizer
//              step, stream = microbatch·groups + group) and the logical element index, so a
//              run reproduces bit for bit and a resumed run draws the same bits: the state a
//              checkpoint must save is the seed and the step (Engine::SrState).
//
//   ReduceMode m = ParseReduceMode("bf16sr");   // ConfigError naming the accepted values
//   std::string_view s = ReduceModeName(m);     // "bf16sr"
#pragma once

#include <string_view>

#include "sshsdp/base/error.h"
#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

enum class ReduceMode { kFp32 = 0, kBf16Fp32 = 1, kBf16Sr = 2 };

inline std::string_view ReduceModeName(ReduceMode m) {
  return m == ReduceMode::kFp32 ? "fp32" : m == ReduceMode::kBf16Fp32 ? "bf16+fp32" : "bf16sr";
}

inline ReduceMode ParseReduceMode(std::string_view s) {
  if (s == "fp32") return ReduceMode::kFp32;
  if (s == "bf16+fp32" || s == "bf16") return ReduceMode::kBf16Fp32;
  if (s == "bf16sr") return ReduceMode::kBf16Sr;
  throw ConfigError(fmt::format("unknown reduce mode '{}': use fp32, bf16+fp32 or bf16sr", s));
}

// dtype of the runtime gradient buffer G′ in a mode.
inline DType GradDType(ReduceMode m) { return m == ReduceMode::kFp32 ? DType::kF32 : DType::kBF16; }

}  // namespace sshsdp
