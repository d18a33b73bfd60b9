// Muon's three stages (see muon.h).
#include "sshsdp/update/muon.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp {

void ValidateMuon(const MuonConfig& c) {
  SSHSDP_CHECK(std::isfinite(c.lr) && c.lr >= 0, ConfigError,
               "Muon lr (--muon-lr) must be a finite number >= 0, got {}", c.lr);
  SSHSDP_CHECK(c.momentum >= 0 && c.momentum < 1, ConfigError,
               "Muon momentum (--muon-momentum) must lie in [0, 1), got {}", c.momentum);
  SSHSDP_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0, ConfigError,
               "Muon weight decay (--muon-weight-decay) must be a finite number >= 0, got {}",
               c.weight_decay);
  SSHSDP_CHECK(c.ns_steps >= 1, ConfigError,
               "Muon Newton-Schulz steps (--muon-ns-steps) must be >= 1, got {}", c.ns_steps);
}

MuonScale ParseMuonScale(const std::string& s) {
  if (s == "reference") return MuonScale::kReference;
  if (s == "rms") return MuonScale::kRms;
  throw ConfigError(fmt::format("unknown Muon update scale '{}': use reference or rms", s));
}

float MuonUpdateScale(MuonScale s, int64_t rows, int64_t cols) {
  if (s == MuonScale::kReference)
    return std::sqrt(std::max(1.0f, static_cast<float>(rows) / static_cast<float>(cols)));
  return 0.2f * std::sqrt(static_cast<float>(std::max(rows, cols)));
}

UpdateProgram MuonProgram(const MuonConfig& cfg, Backend& backend) {
  SSHSDP_CHECK(cfg.ns_steps >= 1, ConfigError, "Muon needs at least one Newton–Schulz step, got {}",
               cfg.ns_steps);
  SSHSDP_CHECK(cfg.u_dtype == DType::kBF16 || cfg.u_dtype == DType::kF32, ConfigError,
               "Muon's Newton–Schulz input u must be bf16 or fp32, got {}", DTypeName(cfg.u_dtype));
  UpdateProgram p;
  p.name = "muon";
  p.fields = {{"main", DType::kF32, FieldRole::kState},
              {"grad", DType::kF32, FieldRole::kState},
              {"m", DType::kF32, FieldRole::kState},
              {"u", cfg.u_dtype, FieldRole::kTemporary},
              {"v", DType::kF32, FieldRole::kTemporary}};
  const Extent one = Extent::Elements(1);

  // f0: momentum and the Newton–Schulz input. data = {grad, m, m, u}.
  UpdateStage f0{
      "momentum", {{"grad", one}, {"m", one}}, {{"m", one}, {"u", one}}, {"grad_scale"}, nullptr,
      nullptr};
  Backend* dev = &backend;
  f0.kernel = [cfg, dev](const StageBatch& b) {
    const float gs = static_cast<float>(b.scalars->Get("grad_scale"));
    for (const StageItem& it : b.items) {
      const float* g = static_cast<const float*>(it.data[0]);
      float* m = static_cast<float*>(it.data[2]);
      dev->MuonMomentum(g, m, it.data[3], cfg.u_dtype, it.numel, cfg.momentum, cfg.nesterov, gs);
    }
  };

  // f1: whole-unit Newton–Schulz, batched over equal shapes. data = {u, v}.
  UpdateStage f1{"newton_schulz", {{"u", Extent::Unit()}}, {{"v", Extent::Unit()}}, {}, nullptr,
                 nullptr};
  f1.cost = [steps = cfg.ns_steps](const UpdateUnit& u) {
    return NewtonSchulzFlops(u.rows, u.cols, steps);
  };
  f1.kernel = [cfg, dev](const StageBatch& b) {
    std::vector<const void*> in;
    std::vector<float*> out;
    for (const StageItem& it : b.items) {
      in.push_back(it.data[0]);
      out.push_back(static_cast<float*>(it.data[1]));
    }
    const int64_t batch = static_cast<int64_t>(in.size());
    const float scale = MuonUpdateScale(cfg.scale, b.rows, b.cols);
    dev->NewtonSchulz(in.data(), cfg.u_dtype, out.data(), batch, b.rows, b.cols, cfg.ns_steps,
                      cfg.ns, scale);
  };

  // f2: decoupled weight decay and the step. data = {main, v, main}.
  UpdateStage f2{
      "weight_update", {{"main", one}, {"v", one}}, {{"main", one}}, {"muon.lr"}, nullptr, nullptr};
  f2.kernel = [wd = cfg.weight_decay, dev](const StageBatch& b) {
    const float lr = static_cast<float>(b.scalars->Get("muon.lr"));
    for (const StageItem& it : b.items) {
      float* w = static_cast<float*>(it.data[2]);
      const float* v = static_cast<const float*>(it.data[1]);
      dev->MuonWeightUpdate(w, v, it.numel, lr, wd);
    }
  };
  p.stages = {std::move(f0), std::move(f1), std::move(f2)};
  return p;
}

}  // namespace sshsdp
