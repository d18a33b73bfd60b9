// MoE GPT Forward/Backward per runtime group (see moe.h): dispatch by the group's role and the
// trunk shared with the dense GPT — embeddings, pre-norm causal attention, dense GELU MLP
// blocks, final RMSNorm and LM head — on the dense GPT's layer kernels (layers.h). An MoE
// block's MLP is the router (moe_router.cc) and the experts (moe_experts.cc).
#include "sshsdp/models/moe.h"

#include <string>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/models/layers.h"

namespace sshsdp {
namespace {

using kernels::LinearBackwardData;
using kernels::LinearBackwardWeight;
using kernels::LinearForward;
using layers::RmsNormBackward;
using layers::RmsNormForward;

}  // namespace

const float* MoeGpt::Gain(const TensorRef& t) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  Bf16ToFloat(static_cast<const bf16*>(t.data), gain_scratch_.data(), gain_scratch_.size());
  return gain_scratch_.data();
}

void MoeGpt::Forward(int g, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(B_ > 0, PlanError, "MoE GPT Forward({}) before SetBatch", g);
  SSHSDP_CHECK(g == 0 || g == fwd_next_, PlanError,
               "MoE GPT Forward({}) out of order: expected group {} (forward runs 0..{})", g,
               fwd_next_, num_groups() - 1);
  CheckViews(g, w, "weight");
  const GroupRole r = roles_[g];
  switch (r.role) {
    case Role::kEmbed:
      fwd_done_ = false;
      bwd_next_ = -1;
      Op(OpCategory::kEmbedding, [&] {
        layers::EmbeddingForward(w[0], w[1], tokens_.data(), B_, T_, c_.trunk.d_model, res_[0]);
      });
      break;
    case Role::kHead:
      ForwardHead(w);
      break;
    case Role::kDense:
    case Role::kMoe:
      ForwardBlock(r.layer, w);
      break;
    case Role::kAttnRouter:
      ForwardAttention(r.layer, w);
      ForwardRouter(r.layer, w[slots_.router]);
      break;
    case Role::kExperts:
      ForwardExperts(r.layer, w.data());
      break;
  }
  fwd_next_ = g + 1;
  if (fwd_next_ == num_groups()) {
    fwd_done_ = true;
    bwd_next_ = num_groups() - 1;
  }
}

void MoeGpt::Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                      GradWrite mode) {
  SSHSDP_CHECK(fwd_done_ && g == bwd_next_, PlanError,
               "MoE GPT Backward({}) out of order: {} (backward runs {}..0 after a full forward)",
               g,
               fwd_done_ ? fmt::format("expected group {}", bwd_next_)
                         : std::string("forward pass incomplete"),
               num_groups() - 1);
  CheckViews(g, w, "weight");
  CheckViews(g, grad, "gradient");
  const bool acc = mode == GradWrite::kAccumulate;
  const GroupRole r = roles_[g];
  switch (r.role) {
    case Role::kHead:
      BackwardHead(w, grad, acc);
      break;
    case Role::kEmbed:
      Op(OpCategory::kEmbedding, [&] {
        layers::EmbeddingBackward(dres_, tokens_.data(), B_, T_, c_.trunk.d_model, grad[0],
                                  c_.trunk.padded_vocab(), grad[1], c_.trunk.seq_len, acc,
                                  table_scratch_);
      });
      break;
    case Role::kDense:
    case Role::kMoe:
      BackwardBlock(r.layer, w, grad, acc);
      break;
    case Role::kExperts:  // dln_ = ∂/∂ln2 from the experts; dres_ (∂/∂out) is left as is
      BackwardRouted(r.layer, w.data(), grad.data(), acc, dres_, dln_);
      BackwardShared(r.layer, w.data(), grad.data(), acc, dres_, dln_);
      break;
    case Role::kAttnRouter:
      BackwardRouter(r.layer, w[slots_.router], grad[slots_.router], acc, dln_);
      BackwardAttention(r.layer, w, grad, acc);
      break;
  }
  // After group 0 the pass may be repeated (activations are untouched by backward).
  bwd_next_ = g == 0 ? num_groups() - 1 : g - 1;
}

// Attention on bf16 operands when the QKV weight is bf16 and the trunk config allows it
// (GptConfig::bf16_attention), fp32 otherwise — as the dense GPT. Forward records the choice
// per block; Backward refuses views that would make the other one (its lse would not match).
void MoeGpt::AttentionForward(int l, const TensorRef& qkv_weight, BlockActs& A) {
  const int H = c_.trunk.n_head, dh = c_.trunk.head_dim();
  const bool bf16 = qkv_weight.dtype == DType::kBF16 && c_.trunk.bf16_attention;
  bf16_attention_.resize(static_cast<size_t>(c_.trunk.n_layer));
  bf16_attention_[static_cast<size_t>(l)] = bf16;
  if (!bf16) {
    kernels::CausalAttentionForward(A.qkv, A.atty, A.lse, att_scratch_, B_, T_, H, dh);
    return;
  }
  const int64_t n = kernels::AttentionBf16ScratchFloats(B_, T_, H, dh);
  if (static_cast<int64_t>(att_bf16_scratch_.size()) < n) att_bf16_scratch_.resize(n);
  kernels::CausalAttentionForwardBf16(A.qkv, A.atty, A.lse, att_bf16_scratch_.data(),
                                      static_cast<int64_t>(att_bf16_scratch_.size()), B_, T_, H,
                                      dh);
}

void MoeGpt::AttentionBackward(int l, const TensorRef& qkv_weight, const BlockActs& A) {
  const int H = c_.trunk.n_head, dh = c_.trunk.head_dim();
  const bool bf16 = qkv_weight.dtype == DType::kBF16 && c_.trunk.bf16_attention;
  SSHSDP_CHECK(static_cast<size_t>(l) < bf16_attention_.size() &&
                   bf16_attention_[static_cast<size_t>(l)] == bf16,
               PlanError,
               "MoE GPT Backward (block {}): its QKV weight view's dtype would run {} attention "
               "where Forward ran the other; run Backward with the views of the Forward",
               l, bf16 ? "bf16" : "fp32");
  if (!bf16) {
    kernels::CausalAttentionBackward(dtmp_, A.qkv, A.atty, A.lse, dqkv_, att_scratch_, B_, T_, H,
                                     dh);
    return;
  }
  // Nothing in the scratch carries over from Forward: sized again in case the path or the
  // thread count changed since.
  const int64_t n = kernels::AttentionBf16ScratchFloats(B_, T_, H, dh);
  if (static_cast<int64_t>(att_bf16_scratch_.size()) < n) att_bf16_scratch_.resize(n);
  kernels::CausalAttentionBackwardBf16(dtmp_, A.qkv, A.atty, A.lse, dqkv_, att_bf16_scratch_.data(),
                                       static_cast<int64_t>(att_bf16_scratch_.size()), B_, T_, H,
                                       dh);
}

void MoeGpt::ForwardAttention(int l, const std::vector<TensorRef>& w) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  BlockActs& A = blocks_[l];
  const float* x = res_[l];
  Op(OpCategory::kNorm, [&] { RmsNormForward(x, Gain(w[0]), A.ln1, A.ln1_rstd, N, d); });
  Op(OpCategory::kGemm, [&] { LinearForward(A.ln1, w[1].data, w[1].dtype, A.qkv, N, 3 * d, d); });
  Op(OpCategory::kAttention, [&] { AttentionForward(l, w[1], A); });
  Op(OpCategory::kGemm, [&] { LinearForward(A.atty, w[2].data, w[2].dtype, A.res_mid, N, d, d); });
  Op(OpCategory::kElementwise, [&] { kernels::AddThreaded(x, A.res_mid, A.res_mid, N * d); });
  Op(OpCategory::kNorm, [&] { RmsNormForward(A.res_mid, Gain(w[3]), A.ln2, A.ln2_rstd, N, d); });
}

void MoeGpt::ForwardBlock(int l, const std::vector<TensorRef>& w) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model, ff = c_.trunk.ff();
  BlockActs& A = blocks_[l];
  float* out = res_[l + 1];
  ForwardAttention(l, w);
  if (c_.IsMoeLayer(l)) {
    ForwardRouter(l, w[slots_.router]);
    ForwardExperts(l, w.data() + slots_.w1);
    return;
  }
  Op(OpCategory::kGemm, [&] { LinearForward(A.ln2, w[4].data, w[4].dtype, A.fch, N, ff, d); });
  Op(OpCategory::kActivation, [&] { layers::GeluForward(A.fch, A.fcg, N * ff); });
  Op(OpCategory::kGemm, [&] { LinearForward(A.fcg, w[5].data, w[5].dtype, out, N, d, ff); });
  Op(OpCategory::kElementwise, [&] { kernels::AddThreaded(A.res_mid, out, out, N * d); });
}

void MoeGpt::ForwardHead(const std::vector<TensorRef>& w) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model,
                V = c_.trunk.padded_vocab();
  Op(OpCategory::kNorm,
     [&] { RmsNormForward(res_[c_.trunk.n_layer], Gain(w[0]), lnf_, lnf_rstd_, N, d); });
  Op(OpCategory::kGemm, [&] { LinearForward(lnf_, w[1].data, w[1].dtype, probs_, N, V, d); });
  Op(OpCategory::kLoss, [&] {
    ce_ =
        layers::SoftmaxCrossEntropyForward(probs_, targets_.data(), losses_, N, c_.trunk.vocab, V) /
        static_cast<double>(N);
  });
}

void MoeGpt::BackwardHead(const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                          bool acc) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model,
                V = c_.trunk.padded_vocab();
  Op(OpCategory::kLoss, [&] {
    layers::SoftmaxCrossEntropyBackward(probs_, targets_.data(), dlogits_, N, V,
                                        static_cast<float>(1.0 / static_cast<double>(N)));
  });
  Op(OpCategory::kGemm, [&] {
    LinearBackwardWeight(dlogits_, lnf_, w[1].dtype, grad[1].data, grad[1].dtype, N, V, d, acc);
    LinearBackwardData(dlogits_, w[1].data, w[1].dtype, dtmp_, N, V, d, false);
  });
  Op(OpCategory::kNorm, [&] {
    RmsNormBackward(dtmp_, res_[c_.trunk.n_layer], Gain(w[0]), lnf_rstd_, dres_,
                    dgain_scratch_.data(), N, d, /*accumulate_dx=*/false);
    kernels::WriteOrAccumulate(dgain_scratch_.data(), grad[0].data, grad[0].dtype, d, acc);
  });
}

void MoeGpt::BackwardBlock(int l, const std::vector<TensorRef>& w,
                           const std::vector<TensorRef>& grad, bool acc) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model, ff = c_.trunk.ff();
  const BlockActs& A = blocks_[l];
  float* dres = dres_;  // in: ∂/∂out

  // MLP: out = res_mid + mlp(ln2(res_mid)); dln_ = ∂/∂ln2.
  if (c_.IsMoeLayer(l)) {
    const TensorRef *wx = w.data() + slots_.w1, *gx = grad.data() + slots_.w1;
    BackwardRouted(l, wx, gx, acc, dres, dln_);
    BackwardRouter(l, w[slots_.router], grad[slots_.router], acc, dln_);
    BackwardShared(l, wx, gx, acc, dres, dln_);
  } else {
    Op(OpCategory::kGemm, [&] {
      LinearBackwardWeight(dres, A.fcg, w[5].dtype, grad[5].data, grad[5].dtype, N, d, ff, acc);
      LinearBackwardData(dres, w[5].data, w[5].dtype, dfch_, N, d, ff, false);
    });
    Op(OpCategory::kActivation, [&] { layers::GeluBackwardInPlace(A.fch, dfch_, N * ff); });
    Op(OpCategory::kGemm, [&] {
      LinearBackwardWeight(dfch_, A.ln2, w[4].dtype, grad[4].data, grad[4].dtype, N, ff, d, acc);
      LinearBackwardData(dfch_, w[4].data, w[4].dtype, dln_, N, ff, d, false);
    });
  }
  BackwardAttention(l, w, grad, acc);
}

void MoeGpt::BackwardAttention(int l, const std::vector<TensorRef>& w,
                               const std::vector<TensorRef>& grad, bool acc) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const BlockActs& A = blocks_[l];
  const float* x = res_[l];
  float* dres = dres_;  // in: ∂/∂out; after ln2: ∂/∂res_mid; out: ∂/∂x
  Op(OpCategory::kNorm, [&] {
    RmsNormBackward(dln_, A.res_mid, Gain(w[3]), A.ln2_rstd, dres, dgain_scratch_.data(), N, d,
                    /*accumulate_dx=*/true);
    kernels::WriteOrAccumulate(dgain_scratch_.data(), grad[3].data, grad[3].dtype, d, acc);
  });

  // Attention: res_mid = x + proj(attention(qkv(ln1(x)))).
  Op(OpCategory::kGemm, [&] {
    LinearBackwardWeight(dres, A.atty, w[2].dtype, grad[2].data, grad[2].dtype, N, d, d, acc);
    LinearBackwardData(dres, w[2].data, w[2].dtype, dtmp_, N, d, d, false);
  });
  Op(OpCategory::kAttention, [&] { AttentionBackward(l, w[1], A); });
  Op(OpCategory::kGemm, [&] {
    LinearBackwardWeight(dqkv_, A.ln1, w[1].dtype, grad[1].data, grad[1].dtype, N, 3 * d, d, acc);
    LinearBackwardData(dqkv_, w[1].data, w[1].dtype, dtmp_, N, 3 * d, d, false);
  });
  Op(OpCategory::kNorm, [&] {
    RmsNormBackward(dtmp_, x, Gain(w[0]), A.ln1_rstd, dres, dgain_scratch_.data(), N, d,
                    /*accumulate_dx=*/true);
    kernels::WriteOrAccumulate(dgain_scratch_.data(), grad[0].data, grad[0].dtype, d, acc);
  });
}

}  // namespace sshsdp
