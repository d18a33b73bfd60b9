// Muon as three unit-declared stages, exactly the paper's EG1 (§3.1) with the conventions of
// docs/design.md, Optimizers:
//   f0 "momentum"      (1 element per unit)  g ← grad_scale·grad;  m ← μ·m + g;
//                      u ← bf16(g + μ·m) (Nesterov) or bf16(m) (plain)
//   f1 "newton_schulz" (whole unit)          v ← NS(u)·scale, 5 quintic steps in fp32
//   f2 "weight_update" (1 element per unit)  main ← main·(1 − lr·wd) − lr·v
// Momentum is the accumulating form (Moonlight / dion). grad_scale is the engine's explicit
// SUM normalization times the clipping coefficient, applied once in f0 (scalar "grad_scale");
// the learning rate is scalar "muon.lr" so schedules can change it per step. The update scale
// is selectable: kReference `sqrt(max(1, rows/cols))` or kRms `0.2·sqrt(max(rows, cols))`
// (RMS-matched to AdamW, so AdamW's learning rate and weight decay carry over).
//
// State: "m" (fp32 ZeRO-1, same element layout as AdamW's first moment — checkpoints see one
// "m" field per group whatever the optimizer); temporaries "u" (bf16) and "v" (fp32) live only
// during the update. Only u (bf16, 2 bytes/element) travels to an execution rank and only v
// (fp32, 4 bytes/element) travels back.
//
// Numerics: Newton–Schulz amplifies small singular directions (slope a ≈ 3.4 per step, ~480×
// over five), so a bf16 rounding of u that differs between two runs whose gradients differ only
// by fp32 summation order moves v visibly (~1e-3 relative on weak directions). u_dtype = fp32
// removes that amplifier when comparing against a reference.
//
//   MuonConfig mc;  mc.scale = MuonScale::kRms;
//   std::unique_ptr<Backend> cpu = MakeCpuBackend();
//   UpdatePlan plan(MuonProgram(mc, *cpu), units, chains, replica);
#pragma once

#include <cstdint>
#include <string>

#include "sshsdp/backend/backend.h"
#include "sshsdp/kernels/newton_schulz.h"
#include "sshsdp/kernels/optimizer.h"
#include "sshsdp/update/update_stage.h"

namespace sshsdp {

enum class MuonScale { kReference, kRms };
// Parses "reference" | "rms"; ConfigError otherwise.
MuonScale ParseMuonScale(const std::string& s);

struct MuonConfig {
  float lr = 0.02f;
  float momentum = 0.95f;
  bool nesterov = true;
  MuonScale scale = MuonScale::kReference;
  float weight_decay = 0.0f;  // decoupled: main ← main·(1 − lr·wd) − lr·v
  int ns_steps = 5;
  NsCoefficients ns;
  // Storage of u, the Newton–Schulz input (and what travels to an execution rank): bf16 as in
  // the paper's EG1, or fp32 (twice the bytes; numerically closest to an fp32 reference).
  DType u_dtype = DType::kBF16;
};

// Throws ConfigError naming the field (and its `sshsdp train` flag) unless lr and
// weight_decay are finite and >= 0, momentum lies in [0, 1) and ns_steps >= 1.
void ValidateMuon(const MuonConfig& c);

// The update scale of a [rows, cols] unit.
float MuonUpdateScale(MuonScale s, int64_t rows, int64_t cols);

// Fields: main, grad, m (state, fp32); u (cfg.u_dtype), v (fp32) (temporaries). Scalars read:
// "grad_scale" (f0), "muon.lr" (f2). Unit cost: NewtonSchulzFlops(rows, cols, ns_steps). The
// stages run as `backend`'s MuonMomentum, NewtonSchulz and MuonWeightUpdate (kernels/
// optimizer.h and kernels/newton_schulz.h on the CPU) on fields in its memory (not owned;
// outlives the program).
UpdateProgram MuonProgram(const MuonConfig& cfg, Backend& backend);

}  // namespace sshsdp
