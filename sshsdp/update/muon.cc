// Muon's three stages (see muon.h).
#include "sshsdp/update/muon.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/elementwise.h"

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

void MuonMomentum(const float* grad, float* m, void* u, DType u_dtype, int64_t n, float momentum,
                  bool nesterov, float grad_scale) {
  SSHSDP_CHECK(n >= 0 && (u_dtype == DType::kF32 || u_dtype == DType::kBF16), NumericsError,
               "MuonMomentum: need n >= 0 and a bf16 or fp32 u, got n={} u={}", n,
               DTypeName(u_dtype));
  const bool u32 = u_dtype == DType::kF32;
  const float mu = momentum, gs = grad_scale;
  constexpr int64_t kTile = 256;
  float tmp[kTile];
  for (int64_t i0 = 0; i0 < n; i0 += kTile) {
    const int64_t k = std::min(kTile, n - i0);
    const float* __restrict g = grad + i0;
    float* __restrict mt = m + i0;
    float* __restrict out = u32 ? static_cast<float*>(u) + i0 : tmp;
    for (int64_t i = 0; i < k; ++i) {
      const float gi = gs * g[i];
      const float mi = mu * mt[i] + gi;
      mt[i] = mi;
      out[i] = nesterov ? gi + mu * mi : mi;
    }
    if (!u32) kernels::CastToBf16(tmp, static_cast<bf16*>(u) + i0, k);
  }
}

void MuonWeightUpdate(float* w, const float* v, int64_t n, float lr, float weight_decay) {
  SSHSDP_CHECK(n >= 0, NumericsError, "MuonWeightUpdate: n must be >= 0, got {}", n);
  const float decay = 1.0f - lr * weight_decay;
  float* __restrict wr = w;
  const float* __restrict vr = v;
  for (int64_t i = 0; i < n; ++i) wr[i] = wr[i] * decay - lr * vr[i];
}

UpdateProgram MuonProgram(const MuonConfig& cfg, const MuonKernels& kernels) {
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
  f0.kernel = [cfg, k = kernels.momentum](const StageBatch& b) {
    const float gs = static_cast<float>(b.scalars->Get("grad_scale"));
    for (const StageItem& it : b.items) {
      const float* g = static_cast<const float*>(it.data[0]);
      float* m = static_cast<float*>(it.data[2]);
      if (k)
        k(g, m, it.data[3], cfg.u_dtype, it.numel, cfg.momentum, cfg.nesterov, gs);
      else
        MuonMomentum(g, m, it.data[3], cfg.u_dtype, it.numel, cfg.momentum, cfg.nesterov, gs);
    }
  };

  // f1: whole-unit Newton–Schulz, batched over equal shapes. data = {u, v}.
  UpdateStage f1{"newton_schulz", {{"u", Extent::Unit()}}, {{"v", Extent::Unit()}}, {}, nullptr,
                 nullptr};
  f1.cost = [steps = cfg.ns_steps](const UpdateUnit& u) {
    return NewtonSchulzFlops(u.rows, u.cols, steps);
  };
  auto ns = std::make_shared<NewtonSchulz>();
  f1.kernel = [ns, cfg, k = kernels.newton_schulz](const StageBatch& b) {
    std::vector<const void*> in;
    std::vector<float*> out;
    for (const StageItem& it : b.items) {
      in.push_back(it.data[0]);
      out.push_back(static_cast<float*>(it.data[1]));
    }
    const int64_t batch = static_cast<int64_t>(in.size());
    const float scale = MuonUpdateScale(cfg.scale, b.rows, b.cols);
    if (k)
      k(in.data(), cfg.u_dtype, out.data(), batch, b.rows, b.cols, cfg.ns_steps, cfg.ns, scale);
    else
      ns->Run(in.data(), cfg.u_dtype, out.data(), batch, b.rows, b.cols, cfg.ns_steps, cfg.ns,
              scale);
  };

  // f2: decoupled weight decay and the step. data = {main, v, main}.
  UpdateStage f2{
      "weight_update", {{"main", one}, {"v", one}}, {{"main", one}}, {"muon.lr"}, nullptr, nullptr};
  f2.kernel = [wd = cfg.weight_decay, k = kernels.weight_update](const StageBatch& b) {
    const float lr = static_cast<float>(b.scalars->Get("muon.lr"));
    for (const StageItem& it : b.items) {
      float* w = static_cast<float*>(it.data[2]);
      const float* v = static_cast<const float*>(it.data[1]);
      if (k)
        k(w, v, it.numel, lr, wd);
      else
        MuonWeightUpdate(w, v, it.numel, lr, wd);
    }
  };
  p.stages = {std::move(f0), std::move(f1), std::move(f2)};
  return p;
}

}  // namespace sshsdp
