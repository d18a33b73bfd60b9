// BackendGptModel (backend_gpt_model.h): Model's contract (views, group order, overwrite or
// accumulate) around BackendGpt's per-group functions.
#include "sshsdp/models/backend_gpt_model.h"

#include <string>
#include <utility>

#include "sshsdp/base/error.h"

namespace sshsdp {

BackendGptModel::BackendGptModel(Backend& b, const GptConfig& c, DType mx_gemm)
    : b_(b), spec_(c), mx_(b), mx_gemm_(mx_gemm) {
  SSHSDP_CHECK(c.packed_qkv, ConfigError,
               "BackendGptModel runs the packed QKV layout only (GptConfig::packed_qkv = true)");
  CheckAttentionFits(b, spec_.config(), "BackendGptModel");
  SSHSDP_CHECK(mx_gemm == DType::kF32 || mx_gemm == DType::kBF16, ConfigError,
               "the GEMMs of MXFP8 weights run in fp32 or bf16 (--mx-gemm), got {}",
               DTypeName(mx_gemm));
}

BackendGptModel::~BackendGptModel() = default;

void BackendGptModel::SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (!gpt_ || gpt_->batch() != B || gpt_->seq_len() != T) {
    if (gpt_)
      for (double l : gpt_->TakeLosses()) taken_.push_back(l);
    gpt_.reset();  // free the old activations first
    gpt_ = std::make_unique<BackendGpt>(b_, spec_.config(), B, T, /*own_params=*/false);
  }
  gpt_->SetTokens(tokens, targets);
  fwd_next_ = 0;
  bwd_next_ = -1;
  loss_valid_ = false;
}

void BackendGptModel::Forward(int g, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(gpt_ != nullptr, PlanError, "BackendGptModel Forward({}) before SetBatch", g);
  SSHSDP_CHECK(g == fwd_next_, PlanError,
               "BackendGptModel Forward({}) out of order: expected group {} (forward runs 0..{})",
               g, fwd_next_, num_groups() - 1);
  DType wdt = DType::kF32;
  const std::vector<const void*> p = BackendWeights(b_, "BackendGptModel", g, w, GroupParams(g),
                                                    GroupConsumesMx(g), mx_gemm_, &mx_, &wdt);
  gpt_->ForwardGroup(g, p.data(), wdt);
  fwd_next_ = g + 1;
  if (g == num_groups() - 1) {
    loss_valid_ = true;
    bwd_next_ = g;
  }
}

double BackendGptModel::Loss() const {
  SSHSDP_CHECK(loss_valid_, PlanError, "BackendGptModel: Loss() before the last group's Forward");
  return gpt_->loss();
}

void BackendGptModel::KeepLoss() {
  SSHSDP_CHECK(loss_valid_, PlanError,
               "BackendGptModel: KeepLoss() before the last group's Forward");
  gpt_->KeepLoss();
}

std::vector<double> BackendGptModel::TakeLosses() {
  std::vector<double> out = std::exchange(taken_, {});
  if (gpt_)
    for (double l : gpt_->TakeLosses()) out.push_back(l);
  return out;
}

void BackendGptModel::Backward(int g, const std::vector<TensorRef>& w,
                               const std::vector<TensorRef>& grad, GradWrite mode) {
  SSHSDP_CHECK(gpt_ != nullptr && g == bwd_next_, PlanError,
               "BackendGptModel Backward({}) out of order: expected group {} (backward runs "
               "{}..0 after the whole forward)",
               g, bwd_next_, num_groups() - 1);
  DType wdt = DType::kF32;
  const std::vector<const void*> p = BackendWeights(b_, "BackendGptModel", g, w, GroupParams(g),
                                                    GroupConsumesMx(g), mx_gemm_, &mx_, &wdt);
  const std::vector<float*> d = BackendGrads("BackendGptModel", g, grad, p.size());
  gpt_->BackwardGroup(g, p.data(), wdt, d.data(), mode == GradWrite::kAccumulate);
  bwd_next_ = g - 1;
}

}  // namespace sshsdp
