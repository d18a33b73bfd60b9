// Framework presets of the one engine (docs/design.md, Baselines): which Figure-2 redundancies
// (redundancy.h) and which shard layout reproduce each framework's dataflow, and the
// ablation ladder that turns sshsdp's optimizations on one at a time starting from FSDP2.
//
//   sshsdp          all redundancies off, flat buffers (the reference dataflow)
//   fsdp2           ①–⑦ on, per-parameter dim-0 shards padded like torch.chunk; Muon by
//                   full_tensor (⑥: every rank gathers every whole matrix and runs
//                   Newton–Schulz on all of them, full_tensor_update.h)
//   megatron-fsdp   flat buffers, persistent low-precision weights (② off), packed runtime
//                   layout (① off), zero-copy weights (③ off), direct gradient writes (④ off),
//                   outer ZeRO-1 (⑦ off); a separate post-reduce-scatter add (⑤ on) and no
//                   structured updates (⑥: Muon per head is refused)
//   vescale-fsdp    shards aligned to update units (no unit straddles a shard where it fits),
//                   zero-copy buffers (③④ off), no packed runtime layout: under per-head Muon
//                   the model declares each head's Q/K/V as its own runtime parameter and runs
//                   per-part GEMMs (GptConfig::packed_qkv = false; PresetQkvModel), under
//                   AdamW one fused QKV parameter, so there is nothing to pack (① off); cast on
//                   demand (② on), separate add (⑤ on), optimizer state replicated (⑦ on),
//                   structured updates by point-to-point units. Given a packed model anyway (MoE's
//                   QKV, tests), the engine still packs per use any multi-part runtime parameter
//                   the aligned layout splits and scatters its gradient back (counted as
//                   weight_pack / grad_unpack).
//
//   EngineConfig cfg;  cfg.sw = cfg.sg = cfg.so = 2;  ...
//   ApplyPreset("fsdp2", &cfg);                       // ConfigError naming the presets
//   for (auto& [label, c] : AblationLadder(cfg)) ...  // "fsdp2", "+flat shards", ...
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sshsdp/engine/engine.h"

namespace sshsdp {

// The presets, in the order benchmarks print them ("sshsdp" first: ratios are against it).
const std::vector<std::string>& PresetNames();

// Sets cfg->redundancies and cfg->shard_layout (every other field is kept). ConfigError
// naming the presets for an unknown name.
void ApplyPreset(std::string_view name, EngineConfig* cfg);

// How a framework's users write the attention projection for a run (the bench builds each
// preset's model with it):
//   kFused         one [3d, d] QKV parameter (nn.Linear(d, 3d)): every framework under AdamW
//                  and per-matrix Muon — the model as written (GptConfig::fused_qkv)
//   kPackedPerHead per-head Q/K/V update parts of one packed runtime tensor: sshsdp's
//                  decoupling, and FSDP2 / Megatron-FSDP users who need per-head units declare
//                  per-head parameters and torch.cat them on every use (① for FSDP2)
//   kPerPart       per-head runtime parameters and per-part GEMMs (GptConfig::packed_qkv =
//                  false): veScale-FSDP's model for per-head Muon
enum class QkvModel { kFused, kPackedPerHead, kPerPart };
const char* QkvModelName(QkvModel m);
// Per-head parts only where the optimizer needs per-head units (Muon per head).
QkvModel PresetQkvModel(std::string_view preset, OptimizerKind optimizer, UnitRule muon_unit);
// (The GPT of each: GptConfig::packed_qkv = m != kPerPart, fused_qkv = m == kFused.)

// fsdp2, then cumulatively: flat shards, ③ off, ④ off, ① off, ② off, ⑤ off, ⑦ off (= sshsdp),
// ⑥ last (it only matters for structured optimizers: with Muon every step before it runs
// full_tensor, on dim-0 then flat shards). Labels name the step.
std::vector<std::pair<std::string, EngineConfig>> AblationLadder(const EngineConfig& base);

}  // namespace sshsdp
