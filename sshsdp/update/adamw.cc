// AdamW multi-tensor kernel (see adamw.h).
#include "sshsdp/update/adamw.h"

#include <cmath>

#include "sshsdp/base/error.h"

namespace sshsdp {

void AdamWStep(const std::vector<AdamWSpan>& spans, const AdamWConfig& cfg, int64_t step,
               float grad_scale) {
  SSHSDP_CHECK(step >= 1, PlanError, "AdamW step must be >= 1, got {}", step);
  const float b1 = cfg.beta1, b2 = cfg.beta2;
  const float bc1 = 1.0f - std::pow(b1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(b2, static_cast<float>(step));
  const float step_size = cfg.lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
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
      float denom = std::sqrt(vi) * inv_sqrt_bc2 + cfg.eps;
      w[i] = w[i] * decay - step_size * mi / denom;
    }
  }
}

}  // namespace sshsdp
