// BackendGpt (backend_gpt.h): the backend MoE model's dense trunk, gpt.cc's blocks op for op.
#include "sshsdp/models/backend_gpt.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "sshsdp/base/error.h"

namespace sshsdp {

BackendGpt::BackendGpt(Backend& b, const GptConfig& c, int B, int T, std::vector<bool> dense_mlp)
    : b_(b), c_(c), B_(B), T_(T) {
  c_.Validate();
  CheckAttentionFits(b_, c_, "BackendGpt");
  SSHSDP_CHECK(B >= 1 && T >= 1 && T <= c_.seq_len, ConfigError,
               "BackendGpt: need B >= 1 and 1 <= T <= seq_len {}, got B={} T={}", c_.seq_len, B, T);
  const int64_t d = c_.d_model, ff = c_.ff();
  // Activations: Gpt's table of sizes plus the gain-gradient scratch row, one allocation.
  float** slots[] = {&a_.residual, &a_.ln1,     &a_.ln1_rstd, &a_.qkv,  &a_.lse,      &a_.atty,
                     &a_.res_mid,  &a_.ln2,     &a_.ln2_rstd, &a_.fch,  &a_.fch_gelu, &a_.lnf,
                     &a_.lnf_rstd, &a_.probs,   &a_.losses,   &a_.dres, &a_.dtmp,     &a_.dqkv,
                     &a_.dfch,     &a_.dlogits, &a_.dgain};
  int64_t sizes[kGptActivationTensors + 1];
  const auto model_sizes = GptActivationFloats(c_, B, T);
  std::copy(model_sizes.begin(), model_sizes.end(), sizes);
  SSHSDP_CHECK(dense_mlp.empty() || static_cast<int>(dense_mlp.size()) == c_.n_layer, ConfigError,
               "BackendGpt: dense_mlp names {} blocks, the model has {}", dense_mlp.size(),
               c_.n_layer);
  int dense = 0;
  for (int l = 0; l < c_.n_layer; ++l)
    mlp_index_.push_back(dense_mlp.empty() || dense_mlp[static_cast<size_t>(l)] ? dense++ : -1);
  const int64_t mlp = int64_t{B} * T * ff;  // fch, fch_gelu per dense block; dfch once
  sizes[9] = sizes[10] = dense * mlp;
  sizes[18] = dense > 0 ? mlp : 0;
  sizes[kGptActivationTensors] = d;
  static_assert(std::size(slots) == std::size(sizes), "a slot per activation");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  activation_bytes_ = total * static_cast<int64_t>(sizeof(float));
  acts_ = static_cast<float*>(b_.Alloc(static_cast<size_t>(activation_bytes_)));
  int64_t at = 0;
  for (size_t i = 0; i < std::size(slots); ++i) {
    *slots[i] = acts_ + at;
    at += sizes[i];
  }
  tokens_ = static_cast<int32_t*>(b_.Alloc(static_cast<size_t>(2) * B * T * sizeof(int32_t)));
  loss_sums_ = static_cast<double*>(b_.Alloc((kLossSlots + 1) * sizeof(double)));
  const double zero = 0.0;  // loss() before any forward
  b_.CopyIn(loss_sums_, &zero, sizeof(double));
}

BackendGpt::~BackendGpt() {
  for (void* p : {static_cast<void*>(acts_), static_cast<void*>(tokens_),
                  static_cast<void*>(loss_sums_), bf16_scratch_})
    b_.Free(p);
}

void BackendGpt::RequireBf16Scratch() {
  if (bf16_scratch_) return;
  const int64_t BT = int64_t{B_} * T_, d = c_.d_model, ff = c_.ff(), Vp = c_.padded_vocab();
  const int64_t x16 = BT * std::max(d, ff), dy16 = BT * std::max({3 * d, ff, Vp});
  const int64_t wide = std::max((Vp + c_.seq_len) * d, 2 * d);
  // bf16 counts rounded up to 32 elements: every part stays 64-byte aligned.
  const int64_t x16r = (x16 + 31) / 32 * 32, dy16r = (dy16 + 31) / 32 * 32;
  const size_t bytes = static_cast<size_t>((x16r + dy16r) * 2 + wide * 4);
  bf16_scratch_ = b_.Alloc(bytes);
  activation_bytes_ += static_cast<int64_t>(bytes);  // the model's memory: reported with it
  x16_ = static_cast<bf16*>(bf16_scratch_);
  dy16_ = x16_ + x16r;
  wide_ = reinterpret_cast<float*>(dy16_ + dy16r);
}

const float* BackendGpt::Wide(const void* w, DType w_dtype, int64_t n, float* dst) {
  if (w_dtype == DType::kF32) return static_cast<const float*>(w);
  b_.CastBf16ToF32(static_cast<const bf16*>(w), dst, n);
  return dst;
}

void BackendGpt::Linear(const float* x, const void* w, DType w_dtype, float* y, int64_t m,
                        int64_t n, int64_t k) {
  if (w_dtype == DType::kF32) {
    b_.Gemm(false, true, m, n, k, x, static_cast<const float*>(w), y, false);
    return;
  }
  b_.CastF32ToBf16(x, x16_, m * k);
  b_.GemmBf16(false, true, m, n, k, x16_, static_cast<const bf16*>(w), y, false);
}

void BackendGpt::LinearBackward(const float* dy, const float* x, const void* w, DType w_dtype,
                                float* dx, float* dw, int64_t m, int64_t n, int64_t k, bool acc) {
  if (w_dtype == DType::kF32) {
    b_.Gemm(true, false, n, k, m, dy, x, dw, acc);
    b_.Gemm(false, false, m, k, n, dy, static_cast<const float*>(w), dx, false);
    return;
  }
  b_.CastF32ToBf16(dy, dy16_, m * n);
  b_.CastF32ToBf16(x, x16_, m * k);
  b_.GemmBf16(true, false, n, k, m, dy16_, x16_, dw, acc);
  b_.GemmBf16(false, false, m, k, n, dy16_, static_cast<const bf16*>(w), dx, false);
}

void BackendGpt::ForwardGroup(int g, const void* const* w, DType wdt) {
  SSHSDP_CHECK(wdt == DType::kF32 || wdt == DType::kBF16, ConfigError,
               "BackendGpt: weights must be fp32 or bf16, got {}", DTypeName(wdt));
  if (wdt == DType::kBF16) RequireBf16Scratch();
  const int64_t BT = int64_t{B_} * T_, d = c_.d_model, ff = c_.ff(), Vp = c_.padded_vocab();
  const int L = c_.n_layer;
  if (g == 0) {  // wte, wpe
    const float* wte = Wide(w[0], wdt, Vp * d, wide_);
    const float* wpe = Wide(w[1], wdt, c_.seq_len * d, wide_ ? wide_ + Vp * d : nullptr);
    b_.EmbeddingForward(wte, wpe, tokens_, B_, T_, static_cast<int>(d), a_.residual);
    return;
  }
  if (g == L + 1) {  // lnf.g, lm_head; then the loss
    const float* gain = Wide(w[0], wdt, d, wide_);
    b_.RmsNormForward(a_.residual + L * BT * d, gain, a_.lnf, a_.lnf_rstd, BT, static_cast<int>(d));
    Linear(a_.lnf, w[1], wdt, a_.probs, BT, Vp, d);
    b_.SoftmaxCrossEntropyForward(a_.probs, tokens_ + BT, a_.losses, BT, c_.vocab, Vp, loss_sums_);
    return;
  }
  // ln1.g, attn.qkv, attn.proj, ln2.g, mlp.fc1, mlp.fc2
  const int l = g - 1;
  const int m = MlpIndex(l);
  ForwardAttention(l, w, wdt);
  float* out = a_.residual + (l + 1) * BT * d;
  const float* res_mid = a_.res_mid + l * BT * d;
  float* fch = a_.fch + m * BT * ff;
  float* fch_gelu = a_.fch_gelu + m * BT * ff;
  Linear(a_.ln2 + l * BT * d, w[4], wdt, fch, BT, ff, d);
  b_.GeluForward(fch, fch_gelu, BT * ff);
  Linear(fch_gelu, w[5], wdt, out, BT, d, ff);
  b_.Add(res_mid, out, out, BT * d);
}

void BackendGpt::ForwardAttention(int l, const void* const* w, DType wdt) {
  if (wdt == DType::kBF16) RequireBf16Scratch();
  const int64_t BT = int64_t{B_} * T_, d = c_.d_model;
  const int H = c_.n_head, dh = c_.head_dim();
  const float* x = a_.residual + l * BT * d;
  float* ln1 = a_.ln1 + l * BT * d;
  float* qkv = a_.qkv + l * BT * 3 * d;
  float* atty = a_.atty + l * BT * d;
  float* res_mid = a_.res_mid + l * BT * d;
  float* ln2 = a_.ln2 + l * BT * d;
  const float* g1 = Wide(w[0], wdt, d, wide_);
  const float* g2 = Wide(w[3], wdt, d, wide_ ? wide_ + d : nullptr);
  b_.RmsNormForward(x, g1, ln1, a_.ln1_rstd + l * BT, BT, static_cast<int>(d));
  Linear(ln1, w[1], wdt, qkv, BT, 3 * d, d);
  b_.CausalAttentionForward(qkv, atty, a_.lse + l * int64_t{B_} * H * T_, B_, T_, H, dh);
  Linear(atty, w[2], wdt, res_mid, BT, d, d);
  b_.Add(x, res_mid, res_mid, BT * d);
  b_.RmsNormForward(res_mid, g2, ln2, a_.ln2_rstd + l * BT, BT, static_cast<int>(d));
}

int BackendGpt::MlpIndex(int l) const {
  const int m = mlp_index_[static_cast<size_t>(l)];
  SSHSDP_CHECK(m >= 0, PlanError,
               "BackendGpt: block {} has no dense MLP here (dense_mlp); run its attention half "
               "(ForwardAttention / BackwardAttention) and its own MLP",
               l);
  return m;
}

void BackendGpt::GainGrad(const float* dy, const float* x, const float* g, const float* rstd,
                          float* dx, float* dg, bool acc_dx, bool acc_dg) {
  const int64_t BT = int64_t{B_} * T_;
  const int d = c_.d_model;
  b_.RmsNormBackward(dy, x, g, rstd, dx, acc_dg ? a_.dgain : dg, BT, d, acc_dx);
  if (acc_dg) b_.Add(dg, a_.dgain, dg, d);
}

void BackendGpt::BackwardGroup(int g, const void* const* w, DType wdt, float* const* grad,
                               bool acc) {
  SSHSDP_CHECK(wdt == DType::kF32 || wdt == DType::kBF16, ConfigError,
               "BackendGpt: weights must be fp32 or bf16, got {}", DTypeName(wdt));
  if (wdt == DType::kBF16) RequireBf16Scratch();
  const int64_t BT = int64_t{B_} * T_, d = c_.d_model, ff = c_.ff(), Vp = c_.padded_vocab();
  const int L = c_.n_layer;
  if (g == L + 1) {
    b_.SoftmaxCrossEntropyBackward(a_.probs, tokens_ + BT, a_.dlogits, BT, Vp,
                                   static_cast<float>(1.0 / static_cast<double>(BT)));
    LinearBackward(a_.dlogits, a_.lnf, w[1], wdt, a_.dtmp, grad[1], BT, Vp, d, acc);
    const float* gain = Wide(w[0], wdt, d, wide_);
    GainGrad(a_.dtmp, a_.residual + L * BT * d, gain, a_.lnf_rstd, a_.dres, grad[0], false, acc);
    return;
  }
  if (g == 0) {
    b_.EmbeddingBackward(a_.dres, tokens_, B_, T_, static_cast<int>(d), grad[0], Vp, grad[1],
                         c_.seq_len, acc);
    return;
  }
  const int l = g - 1;
  const int m = MlpIndex(l);
  const float* ln2 = a_.ln2 + l * BT * d;
  const float* fch = a_.fch + m * BT * ff;
  const float* fch_gelu = a_.fch_gelu + m * BT * ff;
  // MLP.
  LinearBackward(a_.dres, fch_gelu, w[5], wdt, a_.dfch, grad[5], BT, d, ff, acc);
  b_.GeluBackwardInPlace(fch, a_.dfch, BT * ff);
  LinearBackward(a_.dfch, ln2, w[4], wdt, a_.dtmp, grad[4], BT, ff, d, acc);
  BackwardAttention(l, w, wdt, grad, acc, a_.dtmp);
}

void BackendGpt::BackwardAttention(int l, const void* const* w, DType wdt, float* const* grad,
                                   bool acc, const float* dln2) {
  if (wdt == DType::kBF16) RequireBf16Scratch();
  const int64_t BT = int64_t{B_} * T_, d = c_.d_model;
  const int H = c_.n_head, dh = c_.head_dim();
  const float* x = a_.residual + l * BT * d;
  const float* ln1 = a_.ln1 + l * BT * d;
  const float* qkv = a_.qkv + l * BT * 3 * d;
  const float* atty = a_.atty + l * BT * d;
  const float* res_mid = a_.res_mid + l * BT * d;
  const float* g1 = Wide(w[0], wdt, d, wide_);
  const float* g2 = Wide(w[3], wdt, d, wide_ ? wide_ + d : nullptr);
  GainGrad(dln2, res_mid, g2, a_.ln2_rstd + l * BT, a_.dres, grad[3], true, acc);
  // Attention.
  LinearBackward(a_.dres, atty, w[2], wdt, a_.dtmp, grad[2], BT, d, d, acc);
  b_.CausalAttentionBackward(a_.dtmp, qkv, atty, a_.lse + l * int64_t{B_} * H * T_, a_.dqkv, B_, T_,
                             H, dh);
  LinearBackward(a_.dqkv, ln1, w[1], wdt, a_.dtmp, grad[1], BT, 3 * d, d, acc);
  GainGrad(a_.dtmp, x, g1, a_.ln1_rstd + l * BT, a_.dres, grad[0], true, acc);
}

void BackendGpt::SetTokens(const int32_t* tokens, const int32_t* targets) {
  const int64_t BT = int64_t{B_} * T_;
  for (int64_t i = 0; i < BT; ++i)
    SSHSDP_CHECK(tokens[i] >= 0 && tokens[i] < c_.vocab && targets[i] >= 0 && targets[i] < c_.vocab,
                 ConfigError, "BackendGpt: token {} of the batch is outside the vocabulary of {}",
                 i, c_.vocab);
  // Queued behind the previous batch's backward, which still reads tokens_ (same stream).
  b_.Upload(tokens_, tokens, static_cast<size_t>(BT) * sizeof(int32_t));
  b_.Upload(tokens_ + BT, targets, static_cast<size_t>(BT) * sizeof(int32_t));
}

double BackendGpt::loss() const {
  double sum = 0.0;
  b_.CopyOut(&sum, loss_sums_, sizeof(double));
  return sum / static_cast<double>(int64_t{B_} * T_);
}

// The reads land in a local buffer first: a read that throws leaves what is kept as it was.
void BackendGpt::KeepLoss() {
  if (kept_ == kLossSlots) {  // the ring is full: read it back
    double ring[kLossSlots];
    b_.CopyOut(ring, loss_sums_ + 1, sizeof(ring));
    read_back_.insert(read_back_.end(), std::begin(ring), std::end(ring));
    kept_ = 0;
  }
  b_.Copy(loss_sums_ + 1 + kept_, loss_sums_, sizeof(double));
  ++kept_;
}

std::vector<double> BackendGpt::TakeLosses() {
  std::vector<double> fresh(static_cast<size_t>(kept_));
  if (kept_ > 0)  // nothing kept: no wait
    b_.CopyOut(fresh.data(), loss_sums_ + 1, fresh.size() * sizeof(double));
  std::vector<double> out = std::exchange(read_back_, {});
  kept_ = 0;
  out.insert(out.end(), fresh.begin(), fresh.end());
  for (double& l : out) l /= static_cast<double>(int64_t{B_} * T_);  // as loss() divides
  return out;
}

}  // namespace sshsdp
