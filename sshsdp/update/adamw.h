// AdamW as a batched multi-tensor update over ZeRO-1 fragments (DESIGN §6 step 6).
//
// PyTorch semantics with decoupled weight decay applied first:
//   w *= 1 − lr·wd;   m = β1·m + (1−β1)·g;   v = β2·v + (1−β2)·g²;
//   w −= lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε)
// where g = grad_scale · grad (grad_scale folds the explicit SUM normalization — loss,
// microbatches, replicas — and the clipping coefficient into the one pass that reads g).
// All spans of one call are updated by one loop nest: one "kernel launch" per update group.
//
//   std::vector<AdamWSpan> spans = {{w, g, m, v, n, /*wd=*/0.1f}, ...};
//   AdamWStep(spans, cfg, /*step=*/1, /*grad_scale=*/1.0f / (microbatches * world));
//
// As an update program (update_stage.h) AdamW is one elementwise stage over every local
// fragment: UpdatePlan(AdamWProgram(cfg), units, chains, replica) never communicates.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "sshsdp/update/update_stage.h"

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
// (device/backend.h) applies the same fp32 values: w = w·decay − step_size·m / (√v·inv_sqrt_bc2
// + eps), decay = 1 − lr·wd per span. PlanError unless step >= 1.
struct AdamWScalars {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2;
};
AdamWScalars AdamWStepScalars(const AdamWConfig& cfg, int64_t step);

// `step` is the 1-based optimizer step t used for bias correction.
void AdamWStep(const std::vector<AdamWSpan>& spans, const AdamWConfig& cfg, int64_t step,
               float grad_scale);

// Who applies AdamW to a batch of spans: AdamWStep on host memory (null), or a device
// backend's AdamW on its memory (the engine on a backend sets it).
using AdamWKernel = std::function<void(const std::vector<AdamWSpan>& spans, const AdamWConfig& cfg,
                                       int64_t step, float grad_scale)>;

// One elementwise stage "adamw" over fields main, grad, m, v (fp32 ZeRO-1 state), reading
// scalars "adamw.lr", "step" and "grad_scale"; cfg.lr is replaced by "adamw.lr". Weight decay
// applies to every unit except norm gains (UpdateKind::kVector). `kernel` runs the batch
// (null: AdamWStep).
UpdateProgram AdamWProgram(const AdamWConfig& cfg, AdamWKernel kernel = nullptr);

}  // namespace sshsdp
