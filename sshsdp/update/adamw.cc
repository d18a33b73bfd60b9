// AdamW multi-tensor kernel (see adamw.h).
#include "sshsdp/update/adamw.h"

#include <cmath>

#include "sshsdp/base/error.h"

namespace sshsdp {

void ValidateAdamW(const AdamWConfig& c) {
  SSHSDP_CHECK(std::isfinite(c.lr) && c.lr >= 0, ConfigError,
               "AdamW lr (--lr) must be a finite number >= 0, got {}", c.lr);
  SSHSDP_CHECK(c.beta1 >= 0 && c.beta1 < 1, ConfigError,
               "AdamW beta1 (--beta1) must lie in [0, 1), got {}", c.beta1);
  SSHSDP_CHECK(c.beta2 >= 0 && c.beta2 < 1, ConfigError,
               "AdamW beta2 (--beta2) must lie in [0, 1), got {}", c.beta2);
  SSHSDP_CHECK(std::isfinite(c.eps) && c.eps > 0, ConfigError,
               "AdamW eps (--eps) must be a finite number > 0, got {}", c.eps);
  SSHSDP_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0, ConfigError,
               "AdamW weight decay (--weight-decay) must be a finite number >= 0, got {}",
               c.weight_decay);
}

AdamWScalars AdamWStepScalars(const AdamWConfig& cfg, int64_t step) {
  SSHSDP_CHECK(step >= 1, PlanError, "AdamW step must be >= 1, got {}", step);
  const float bc1 = 1.0f - std::pow(cfg.beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(cfg.beta2, static_cast<float>(step));
  return {cfg.beta1, cfg.beta2, cfg.eps, cfg.lr / bc1, 1.0f / std::sqrt(bc2)};
}

void AdamWStep(const std::vector<AdamWSpan>& spans, const AdamWConfig& cfg, int64_t step,
               float grad_scale) {
  const AdamWScalars k = AdamWStepScalars(cfg, step);
  const float b1 = k.beta1, b2 = k.beta2;
  for (const AdamWSpan& s : spans) {
    const float decay = 1.0f - cfg.lr * s.weight_decay;
    float* __restrict w = s.w;
    const float* __restrict g = s.g;
    float* __restrict m = s.m;
    float* __restrict v = s.v;
    for (int64_t i = 0; i < s.n; ++i) {
      float gi = g[i] * grad_scale;
      float mi = b1 * m[i] + (1.0f - b1) * gi;
      float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      float denom = std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps;
      w[i] = w[i] * decay - k.step_size * mi / denom;
    }
  }
}

UpdateProgram AdamWProgram(const AdamWConfig& cfg, AdamWKernel kernel) {
  UpdateProgram p;
  p.name = "adamw";
  p.fields = {{"main", DType::kF32, FieldRole::kState},
              {"grad", DType::kF32, FieldRole::kState},
              {"m", DType::kF32, FieldRole::kState},
              {"v", DType::kF32, FieldRole::kState}};
  const Extent one = Extent::Elements(1);
  // data = {grad, main, m, v, main, m, v}.
  UpdateStage s{"adamw",
                {{"grad", one}, {"main", one}, {"m", one}, {"v", one}},
                {{"main", one}, {"m", one}, {"v", one}},
                {"adamw.lr", "step", "grad_scale"},
                nullptr,
                nullptr};
  s.kernel = [cfg, kernel](const StageBatch& b) {
    AdamWConfig c = cfg;
    c.lr = static_cast<float>(b.scalars->Get("adamw.lr"));
    std::vector<AdamWSpan> spans;
    spans.reserve(b.items.size());
    for (const StageItem& it : b.items) {
      const float wd = it.unit->kind == UpdateKind::kVector ? 0.0f : cfg.weight_decay;
      spans.push_back({static_cast<float*>(it.data[1]), static_cast<const float*>(it.data[0]),
                       static_cast<float*>(it.data[2]), static_cast<float*>(it.data[3]), it.numel,
                       wd});
    }
    const auto step = static_cast<int64_t>(b.scalars->Get("step"));
    const auto grad_scale = static_cast<float>(b.scalars->Get("grad_scale"));
    if (kernel) {
      kernel(spans, c, step, grad_scale);
    } else {
      AdamWStep(spans, c, step, grad_scale);
    }
  };
  p.stages.push_back(std::move(s));
  return p;
}

}  // namespace sshsdp
