// The optimizers' elementwise kernels on one process's memory: AdamW over a batch of spans and
// Muon's momentum (f0) and weight update (f2), the arithmetic every backend's AdamW,
// MuonMomentum and MuonWeightUpdate must equal bit for bit (backend/backend.h). The update
// programs that schedule them over ZeRO-1 fragments are update/adamw.h and update/muon.h.
//
// AdamW, PyTorch semantics with decoupled weight decay applied first:
//   w *= 1 − lr·wd;   m = β1·m + (1−β1)·g;   v = β2·v + (1−β2)·g²;
//   w −= lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε)
// where g = grad_scale · grad (grad_scale folds the explicit SUM normalization — loss,
// microbatches, replicas — and the clipping coefficient into the one pass that reads g).
//
//   std::vector<AdamWSpan> spans = {{w, g, m, v, n, /*wd=*/0.1f}, ...};
//   AdamWStep(spans, cfg, /*step=*/1, /*grad_scale=*/1.0f / (microbatches * world));
#pragma once

#include <cstdint>
#include <vector>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to matrices and embeddings, not to norm gains
};

// Throws ConfigError naming the field (and its `sshsdp train` flag) unless lr and
// weight_decay are finite and >= 0, beta1 and beta2 lie in [0, 1) and eps is finite and > 0.
void ValidateAdamW(const AdamWConfig& c);

struct AdamWSpan {
  float* w = nullptr;        // fp32 main weight fragment
  const float* g = nullptr;  // fp32 main gradient fragment (unscaled SUM)
  float* m = nullptr;        // first moment
  float* v = nullptr;        // second moment
  int64_t n = 0;
  float weight_decay = 0.0f;
};

// The per-step scalars of the update above, computed once on the host so every backend
// (backend/backend.h) applies the same fp32 values: w = w·decay − step_size·m / (√v·inv_sqrt_bc2
// + eps), decay = 1 − lr·wd per span. PlanError unless step >= 1.
struct AdamWScalars {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2;
};
AdamWScalars AdamWStepScalars(const AdamWConfig& cfg, int64_t step);

// `step` is the 1-based optimizer step t used for bias correction; `count` spans.
void AdamWStep(const AdamWSpan* spans, int count, const AdamWConfig& cfg, int64_t step,
               float grad_scale);
inline void AdamWStep(const std::vector<AdamWSpan>& spans, const AdamWConfig& cfg, int64_t step,
                      float grad_scale) {
  AdamWStep(spans.data(), static_cast<int>(spans.size()), cfg, step, grad_scale);
}

// f0 on one piece of host memory: g = grad_scale·grad; m = momentum·m + g; u = g + momentum·m
// (nesterov) or m, stored as u_dtype (bf16: round to nearest even). A device backend's
// MuonMomentum equals it bit for bit (the same fp32 operations in the same order, no FMA).
void MuonMomentum(const float* grad, float* m, void* u, DType u_dtype, int64_t n, float momentum,
                  bool nesterov, float grad_scale);
// f2 on one piece: w = w·(1 − lr·weight_decay) − lr·v (likewise bit for bit on a backend).
void MuonWeightUpdate(float* w, const float* v, int64_t n, float lr, float weight_decay);

}  // namespace sshsdp
