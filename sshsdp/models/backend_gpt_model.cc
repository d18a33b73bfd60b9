// BackendGptModel (backend_gpt_model.h): Model's contract (views, group order, overwrite or
// accumulate) around BackendGpt's per-group functions.
#include "sshsdp/models/backend_gpt_model.h"

#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {

BackendGptModel::BackendGptModel(Backend& b, const GptConfig& c) : b_(b), spec_(c) {
  SSHSDP_CHECK(c.packed_qkv, ConfigError,
               "BackendGptModel runs the packed QKV layout only (GptConfig::packed_qkv = true)");
}

void BackendGptModel::SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (!gpt_ || gpt_->batch() != B || gpt_->seq_len() != T) {
    gpt_.reset();  // free the old activations first
    gpt_ = std::make_unique<BackendGpt>(b_, spec_.config(), B, T, /*own_params=*/false);
  }
  gpt_->SetTokens(tokens, targets);
  fwd_next_ = 0;
  bwd_next_ = -1;
  loss_valid_ = false;
}

std::vector<float*> BackendGptModel::Pointers(int g, const std::vector<TensorRef>& v,
                                              const char* what) const {
  const size_t want = static_cast<size_t>(gpt_->GroupTensors(g));
  SSHSDP_CHECK(v.size() == want, PlanError,
               "BackendGptModel group {}: got {} {} views, expected {}", g, v.size(), what, want);
  std::vector<float*> p;
  for (size_t i = 0; i < v.size(); ++i) {
    SSHSDP_CHECK(v[i].dtype == DType::kF32, ConfigError,
                 "BackendGptModel group {}: {} view {} is {}; the backend GPT computes in fp32 "
                 "(run the engine with fp32 runtime weights, --weight-dtype fp32)",
                 g, what, i, DTypeName(v[i].dtype));
    SSHSDP_CHECK(v[i].data != nullptr, PlanError, "BackendGptModel group {}: {} view {} is null", g,
                 what, i);
    p.push_back(static_cast<float*>(v[i].data));
  }
  return p;
}

void BackendGptModel::Forward(int g, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(gpt_ != nullptr, PlanError, "BackendGptModel Forward({}) before SetBatch", g);
  SSHSDP_CHECK(g == fwd_next_, PlanError,
               "BackendGptModel Forward({}) out of order: expected group {} (forward runs 0..{})",
               g, fwd_next_, num_groups() - 1);
  const std::vector<float*> p = Pointers(g, w, "weight");
  gpt_->ForwardGroup(g, p.data());
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

void BackendGptModel::Backward(int g, const std::vector<TensorRef>& w,
                               const std::vector<TensorRef>& grad, GradWrite mode) {
  SSHSDP_CHECK(gpt_ != nullptr && g == bwd_next_, PlanError,
               "BackendGptModel Backward({}) out of order: expected group {} (backward runs "
               "{}..0 after the whole forward)",
               g, bwd_next_, num_groups() - 1);
  const std::vector<float*> p = Pointers(g, w, "weight");
  const std::vector<float*> d = Pointers(g, grad, "gradient");
  gpt_->BackwardGroup(g, p.data(), d.data(), mode == GradWrite::kAccumulate);
  bwd_next_ = g - 1;
}

}  // namespace sshsdp
