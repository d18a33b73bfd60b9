// BackendGptModel (backend_gpt_model.h): Model's contract (views, group order, overwrite or
// accumulate) around BackendGpt's per-group functions.
#include "sshsdp/models/backend_gpt_model.h"

#include <string>

#include "sshsdp/base/error.h"
#include "sshsdp/update/update_unit.h"

namespace sshsdp {

BackendGptModel::BackendGptModel(Backend& b, const GptConfig& c, DType mx_gemm)
    : b_(b), spec_(c), mx_gemm_(mx_gemm) {
  SSHSDP_CHECK(c.packed_qkv, ConfigError,
               "BackendGptModel runs the packed QKV layout only (GptConfig::packed_qkv = true)");
  SSHSDP_CHECK(mx_gemm == DType::kF32 || mx_gemm == DType::kBF16, ConfigError,
               "the GEMMs of MXFP8 weights run in fp32 or bf16 (--mx-gemm), got {}",
               DTypeName(mx_gemm));
}

BackendGptModel::~BackendGptModel() {
  b_.Free(mx_scratch_);
  b_.Free(mx_scratch_bf16_);
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

std::vector<const void*> BackendGptModel::Weights(int g, const std::vector<TensorRef>& v,
                                                  DType* dtype) {
  const size_t want = static_cast<size_t>(gpt_->GroupTensors(g));
  SSHSDP_CHECK(v.size() == want, PlanError,
               "BackendGptModel group {}: got {} weight views, expected {}", g, v.size(), want);
  const bool mx = !v.empty() && v[0].dtype == DType::kE4M3;
  std::vector<const void*> p;
  for (size_t i = 0; i < v.size(); ++i) {
    SSHSDP_CHECK(
        v[i].dtype == v[0].dtype && (v[i].dtype == DType::kF32 || v[i].dtype == DType::kBF16 || mx),
        ConfigError,
        "BackendGptModel group {}: weight view {} is {} (view 0: {}); the backend GPT "
        "runs fp32, bf16 or MXFP8 (e4m3) runtime weights, one dtype per group "
        "(--weight-dtype fp32, bf16 or mxfp8)",
        g, i, DTypeName(v[i].dtype), DTypeName(v[0].dtype));
    SSHSDP_CHECK(v[i].data != nullptr, PlanError,
                 "BackendGptModel group {}: weight view {} is null", g, i);
    SSHSDP_CHECK(!mx || (v[i].scales != nullptr && v[i].scale_layout == ScaleLayout::kRowMajor),
                 ConfigError,
                 "BackendGptModel group {}: MXFP8 weight view {} needs its scales relaid out "
                 "row-major (--scale-layout row_major), got {}",
                 g, i, v[i].scales ? ScaleLayoutName(v[i].scale_layout) : "no scales");
    p.push_back(v[i].data);
  }
  *dtype = v.empty() ? DType::kF32 : v[0].dtype;
  if (!mx) return p;
  // Dequantize every view of the group (codes [rows, cols], per-row scales) into the scratch.
  const std::vector<RuntimeParamSpec> specs = spec_.GroupParams(g);
  int64_t need = 0;
  for (const RuntimeParamSpec& s : specs) need += (s.numel() + 15) / 16 * 16;
  const bool b16 = mx_gemm_ == DType::kBF16;
  if (need > mx_scratch_floats_) {
    b_.Free(mx_scratch_);
    b_.Free(mx_scratch_bf16_);
    mx_scratch_ = nullptr;
    mx_scratch_bf16_ = nullptr;
    mx_scratch_floats_ = 0;
    if (b16) {  // bf16 GEMMs: the dequantized weights in bf16 only
      mx_scratch_bf16_ = static_cast<bf16*>(b_.Alloc(static_cast<size_t>(need) * 2));
    } else {
      mx_scratch_ = static_cast<float*>(b_.Alloc(static_cast<size_t>(need) * 4));
    }
    mx_scratch_floats_ = need;
  }
  int64_t at = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t rows = 0, cols = 0;
    MatrixView(specs[i].shape, &rows, &cols);
    const auto* q = static_cast<const uint8_t*>(v[i].data);
    if (b16) {  // one pass: dequantized and rounded to bf16 (exact for E4M3 in bf16's range)
      b_.MxDequantizeRowsBf16(q, v[i].scales, rows, cols, mx_scratch_bf16_ + at,
                              MxOptions{DType::kE4M3});
      p[i] = mx_scratch_bf16_ + at;
    } else {
      b_.MxDequantizeRows(q, v[i].scales, rows, cols, mx_scratch_ + at, MxOptions{DType::kE4M3});
      p[i] = mx_scratch_ + at;
    }
    at += (specs[i].numel() + 15) / 16 * 16;
  }
  *dtype = mx_gemm_;
  return p;
}

std::vector<float*> BackendGptModel::Grads(int g, const std::vector<TensorRef>& v) const {
  const size_t want = static_cast<size_t>(gpt_->GroupTensors(g));
  SSHSDP_CHECK(v.size() == want, PlanError,
               "BackendGptModel group {}: got {} gradient views, expected {}", g, v.size(), want);
  std::vector<float*> p;
  for (size_t i = 0; i < v.size(); ++i) {
    SSHSDP_CHECK(v[i].dtype == DType::kF32, ConfigError,
                 "BackendGptModel group {}: gradient view {} is {}; the backend GPT writes fp32 "
                 "gradients (--reduce fp32)",
                 g, i, DTypeName(v[i].dtype));
    SSHSDP_CHECK(v[i].data != nullptr, PlanError,
                 "BackendGptModel group {}: gradient view {} is null", g, i);
    p.push_back(static_cast<float*>(v[i].data));
  }
  return p;
}

void BackendGptModel::Forward(int g, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(gpt_ != nullptr, PlanError, "BackendGptModel Forward({}) before SetBatch", g);
  SSHSDP_CHECK(g == fwd_next_, PlanError,
               "BackendGptModel Forward({}) out of order: expected group {} (forward runs 0..{})",
               g, fwd_next_, num_groups() - 1);
  DType wdt = DType::kF32;
  const std::vector<const void*> p = Weights(g, w, &wdt);
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

void BackendGptModel::Backward(int g, const std::vector<TensorRef>& w,
                               const std::vector<TensorRef>& grad, GradWrite mode) {
  SSHSDP_CHECK(gpt_ != nullptr && g == bwd_next_, PlanError,
               "BackendGptModel Backward({}) out of order: expected group {} (backward runs "
               "{}..0 after the whole forward)",
               g, bwd_next_, num_groups() - 1);
  DType wdt = DType::kF32;
  const std::vector<const void*> p = Weights(g, w, &wdt);
  const std::vector<float*> d = Grads(g, grad);
  gpt_->BackwardGroup(g, p.data(), wdt, d.data(), mode == GradWrite::kAccumulate);
  bwd_next_ = g - 1;
}

}  // namespace sshsdp
