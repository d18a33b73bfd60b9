// Reference GPT forward/backward (see gpt.h), llm.c style: every layer is a plain pair of
// loops or GEMM calls over activations stored in one arena; GEMMs go through
// kernels/matmul so bf16 runtime weights run bf16 GEMMs; weight gradients are written
// straight into the views the engine passes, in overwrite or accumulate mode. The layer
// kernels (RMSNorm, GELU, attention) live in layers.{h,cc}, shared with the MoE model.
#include "sshsdp/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string_view>

#include "sshsdp/base/error.h"
#include "sshsdp/base/op_profile.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/mx_linear.h"
#include "sshsdp/models/layers.h"

namespace sshsdp {
namespace {

using kernels::LinearBackwardData;
using kernels::LinearBackwardWeight;
using kernels::LinearForward;

namespace {
// The kernel operand of a weight view (MX views carry their relaid-out scales).
kernels::WeightView View(const TensorRef& t) { return {t.data, t.dtype, t.scales, t.scale_layout}; }

// bf16 linear inputs. With a bf16 weight, a linear layer's input that nothing else reads —
// ln1, ln2, lnf (RMSNorm) and fch_gelu (GELU) — is stored in bf16 in the first half of its
// fp32 arena slot by the kernel that produces it, so neither the forward product nor the
// weight gradient rounds it again; a gradient that feeds both backward products is rounded
// once (Gpt::DyBf16), or produced in bf16 (GELU's and the loss's backward). The products
// see the same bf16 values as when each rounds its fp32 operand (matmul.h's LinearInput),
// so results are bit-identical.
// bf16 attention: a block whose QKV weights are all bf16 runs attention on bf16 operands
// (GptConfig::bf16_attention, kernels::CausalAttentionForwardBf16) with its own scratch
// (att_bf16_scratch_, sized by Forward).
// Forward records which inputs it stored in bf16 (Gpt::bf16_inputs_) and Backward refuses
// views of other dtypes, which would read those slots as the wrong type. No function reads
// the same bytes of a slot both as fp32 and as bf16 (the products hand them to oneDNN).
bool Bf16Weight(const TensorRef& t) { return t.dtype == DType::kBF16; }
bf16* Narrow(float* slot) { return reinterpret_cast<bf16*>(slot); }
const bf16* Narrow(const float* slot) { return reinterpret_cast<const bf16*>(slot); }
kernels::LinearInput Input(const float* slot, bool narrow) {
  return narrow ? kernels::LinearInput(Narrow(slot)) : kernels::LinearInput(slot);
}
// RMSNorm into `y`'s slot, in bf16 when `narrow`.
void RmsNormInto(const float* x, const float* g, float* y, float* rstd, int64_t rows, int d,
                 bool narrow) {
  if (narrow) {
    kernels::RmsNormForwardBf16(x, g, Narrow(y), rstd, rows, d);
  } else {
    kernels::RmsNormForward(x, g, y, rstd, rows, d);
  }
}
}  // namespace

using layers::EmbeddingBackward;
using layers::EmbeddingForward;
using layers::GeluBackwardInPlace;
using layers::GeluForward;
using layers::IsFloatType;
using layers::kOnes;
using layers::Normal;
using layers::RmsNormBackward;
using layers::RmsNormForward;
using layers::Single;
using layers::SoftmaxCrossEntropyBackward;
using layers::SoftmaxCrossEntropyForward;

}  // namespace

GptConfig GptConfig::Preset(std::string_view name) {
  GptConfig c;
  if (name == "tiny") {
    c.d_model = 64, c.n_layer = 2, c.n_head = 4, c.seq_len = 64;
  } else if (name == "small") {
    c.d_model = 128, c.n_layer = 4, c.n_head = 4, c.seq_len = 128;
  } else if (name == "base") {
    c.d_model = 256, c.n_layer = 6, c.n_head = 8, c.seq_len = 256;
  } else {
    throw ConfigError(fmt::format(
        "unknown GPT preset '{}': use tiny, small or base (or an MoE preset: moe-tiny, moe-small)",
        name));
  }
  return c;
}

void GptConfig::Validate() const {
  SSHSDP_CHECK(vocab > 0 && seq_len > 0 && d_model > 0 && n_head > 0 && n_layer > 0 && ff() > 0 &&
                   vocab_multiple > 0,
               ConfigError,
               "GPT config sizes must be positive: vocab={} seq_len={} d_model={} n_head={} "
               "n_layer={} d_ff={} vocab_multiple={}",
               vocab, seq_len, d_model, n_head, n_layer, ff(), vocab_multiple);
  SSHSDP_CHECK(vocab <= (1 << 24), ConfigError,
               "GPT config: vocab {} is larger than 16,777,216 tokens", vocab);
  SSHSDP_CHECK(d_model % n_head == 0, ConfigError,
               "GPT config: d_model {} is not divisible by n_head {}", d_model, n_head);
  SSHSDP_CHECK(packed_qkv || !fused_qkv, ConfigError,
               "GPT config: fused_qkv (one [3d, d] QKV parameter) needs packed_qkv");
}

Gpt::Gpt(const GptConfig& config) : c_(config) {
  c_.Validate();
  if (c_.d_ff <= 0) c_.d_ff = 4 * c_.d_model;
  gain_scratch_.resize(c_.d_model);
  dgain_scratch_.resize(c_.d_model);
}

std::vector<RuntimeParamSpec> Gpt::GroupParams(int g) const {
  SSHSDP_CHECK(g >= 0 && g < num_groups(), PlanError, "GPT has groups 0..{}, asked for {}",
               num_groups() - 1, g);
  const int64_t V = c_.vocab, Vp = c_.padded_vocab(), d = c_.d_model, ff = c_.ff();
  const float std = 0.02f;
  const float proj_std = std / std::sqrt(2.0f * c_.n_layer);  // GPT-2 residual scaling
  InitSpec table = Normal(std);
  if (Vp > V) table.zero_from = V * d;  // padded vocabulary rows start (and stay) zero
  if (g == 0) {
    return {Single("wte", {Vp, d}, UpdateKind::kEmbedding, table),
            Single("wpe", {c_.seq_len, d}, UpdateKind::kEmbedding, Normal(std))};
  }
  if (g == num_groups() - 1) {
    return {Single("lnf.g", {d}, UpdateKind::kVector, kOnes),
            Single("lm_head", {Vp, d}, UpdateKind::kEmbedding, table)};
  }
  const std::string p = fmt::format("blocks.{}.", g - 1);
  const int64_t dh = c_.head_dim();
  std::vector<RuntimeParamSpec> out;
  out.push_back(Single(p + "ln1.g", {d}, UpdateKind::kVector, kOnes));
  if (c_.fused_qkv) {
    out.push_back(Single(p + "attn.qkv", {3 * d, d}, UpdateKind::kMatrix, Normal(std)));
  } else if (c_.packed_qkv) {
    out.push_back(RuntimeParamSpec{p + "attn.qkv", {3 * d, d}, {}});
  }
  int64_t offset = 0;
  for (const char* which : {"q", "k", "v"}) {
    if (c_.fused_qkv) break;
    for (int h = 0; h < c_.n_head; ++h) {
      std::string name = fmt::format("{}attn.{}.h{}", p, which, h);
      if (c_.packed_qkv) {
        out.back().parts.push_back(
            UpdatePart{std::move(name), {dh, d}, offset, UpdateKind::kMatrix, Normal(std)});
        offset += dh * d;
      } else {
        out.push_back(Single(std::move(name), {dh, d}, UpdateKind::kMatrix, Normal(std)));
      }
    }
  }
  out.push_back(Single(p + "attn.proj", {d, d}, UpdateKind::kMatrix, Normal(proj_std)));
  out.push_back(Single(p + "ln2.g", {d}, UpdateKind::kVector, kOnes));
  out.push_back(Single(p + "mlp.fc1", {ff, d}, UpdateKind::kMatrix, Normal(std)));
  out.push_back(Single(p + "mlp.fc2", {d, ff}, UpdateKind::kMatrix, Normal(proj_std)));
  return out;
}

std::array<int64_t, kGptActivationTensors> GptActivationFloats(const GptConfig& c, int B, int T) {
  const int64_t BT = static_cast<int64_t>(B) * T, L = c.n_layer, d = c.d_model, ff = c.ff(),
                V = c.padded_vocab(), H = c.n_head;
  return {(L + 1) * BT * d, L * BT * d, L * BT,     L * BT * 3 * d, L * B * H * T,
          L * BT * d,       L * BT * d, L * BT * d, L * BT,         L * BT * ff,
          L * BT * ff,      BT * d,     BT,         BT * V,         BT,
          BT * d,           BT * d,     BT * 3 * d, BT * ff,        BT * V};
}

void Gpt::SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) {
  SSHSDP_CHECK(B > 0 && T > 0 && T <= c_.seq_len, ConfigError,
               "GPT batch B={} T={} invalid (need B > 0 and 0 < T <= seq_len {})", B, T,
               c_.seq_len);
  const int64_t BT = static_cast<int64_t>(B) * T;
  for (int64_t i = 0; i < BT; ++i) {
    SSHSDP_CHECK(tokens[i] >= 0 && tokens[i] < c_.vocab && targets[i] >= 0 && targets[i] < c_.vocab,
                 ConfigError, "GPT batch position {}: token {} / target {} outside vocab {}", i,
                 tokens[i], targets[i], c_.vocab);
  }
  tokens_.assign(tokens, tokens + BT);
  targets_.assign(targets, targets + BT);
  B_ = B, T_ = T;

  // Arena: one allocation, each tensor 64-byte aligned.
  float** slots[] = {
      &acts_.residual, &acts_.ln1,     &acts_.ln1_rstd,   &acts_.qkv,  &acts_.lse,      &acts_.atty,
      &acts_.res_mid,  &acts_.ln2,     &acts_.ln2_rstd,   &acts_.fch,  &acts_.fch_gelu, &acts_.lnf,
      &acts_.lnf_rstd, &acts_.probs,   &acts_.losses,     &acts_.dres, &acts_.dtmp,     &acts_.dqkv,
      &acts_.dfch,     &acts_.dlogits, &acts_.att_scratch};
  int64_t sizes[kGptActivationTensors + 1];
  const auto model_sizes = GptActivationFloats(c_, B, T);
  std::copy(model_sizes.begin(), model_sizes.end(), sizes);
  sizes[kGptActivationTensors] = kernels::AttentionScratchFloats(B, T, c_.n_head);
  static_assert(sizeof(slots) / sizeof(slots[0]) == sizeof(sizes) / sizeof(sizes[0]));
  int64_t offsets[sizeof(sizes) / sizeof(sizes[0])];
  int64_t total = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    offsets[i] = total;
    total += (sizes[i] + 15) / 16 * 16;
  }
  if (static_cast<int64_t>(arena_.size()) < total) {
    arena_.clear();
    arena_.shrink_to_fit();
    arena_.resize(total);
  }
  for (size_t i = 0; i < std::size(sizes); ++i) *slots[i] = arena_.data() + offsets[i];

  fwd_next_ = 0;
  fwd_done_ = false;
  bwd_next_ = -1;
}

void Gpt::CheckViews(int g, const std::vector<TensorRef>& v, const char* what) const {
  const size_t want = g == 0 || g == num_groups() - 1 ? 2 : 5 + NumQkv();
  SSHSDP_CHECK(v.size() == want, PlanError, "GPT group {}: got {} {} views, expected {}", g,
               v.size(), what, want);
  for (size_t i = 0; i < v.size(); ++i) {
    const bool mx = kernels::IsMxElement(v[i].dtype) && v[i].scales != nullptr &&
                    std::string_view(what) == "weight" && g > 0 && g + 1 < num_groups();
    SSHSDP_CHECK(!mx || c_.packed_qkv, ConfigError,
                 "GPT group {}: MXFP8 weights need packed_qkv (per-part QKV runtime weights "
                 "take fp32 or bf16)",
                 g);
    SSHSDP_CHECK(v[i].data != nullptr && (IsFloatType(v[i].dtype) || mx), PlanError,
                 "GPT group {}: {} view {} must be non-null fp32 or bf16 (MXFP8 with scales for "
                 "block weights) (got {})",
                 g, what, i, DTypeName(v[i].dtype));
  }
}

const float* Gpt::Gain(const TensorRef& t) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  if (kernels::IsMxElement(t.dtype)) {  // an MX vector: [1, d] with its own scales
    kernels::MxDequantizeOperand(static_cast<const uint8_t*>(t.data), t.dtype, t.scales,
                                 t.scale_layout, 1, static_cast<int64_t>(gain_scratch_.size()),
                                 gain_scratch_.data());
    return gain_scratch_.data();
  }
  Bf16ToFloat(static_cast<const bf16*>(t.data), gain_scratch_.data(), gain_scratch_.size());
  return gain_scratch_.data();
}

void Gpt::Forward(int g, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(B_ > 0, PlanError, "GPT Forward({}) before SetBatch", g);
  SSHSDP_CHECK(g == 0 || g == fwd_next_, PlanError,
               "GPT Forward({}) out of order: expected group {} (forward runs 0..{})", g, fwd_next_,
               num_groups() - 1);
  CheckViews(g, w, "weight");
  if (g == 0) {
    fwd_done_ = false;
    bwd_next_ = -1;
    ForwardEmbedding(w);
  } else if (g == num_groups() - 1) {
    ForwardHead(w);
  } else {
    ForwardBlock(g - 1, w);
  }
  fwd_next_ = g + 1;
  if (fwd_next_ == num_groups()) {
    fwd_done_ = true;
    bwd_next_ = num_groups() - 1;
  }
}

double Gpt::Loss() const {
  SSHSDP_CHECK(fwd_done_, PlanError, "GPT Loss() before the last group's Forward");
  return loss_;
}

void Gpt::Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                   GradWrite mode) {
  SSHSDP_CHECK(fwd_done_ && g == bwd_next_, PlanError,
               "GPT Backward({}) out of order: {} (backward runs {}..0 after a full forward)", g,
               fwd_done_ ? fmt::format("expected group {}", bwd_next_)
                         : std::string("forward pass incomplete"),
               num_groups() - 1);
  CheckViews(g, w, "weight");
  CheckViews(g, grad, "gradient");
  const bool acc = mode == GradWrite::kAccumulate;
  if (g == num_groups() - 1) {
    BackwardHead(w, grad, acc);
  } else if (g == 0) {
    BackwardEmbedding(grad, acc);
  } else {
    BackwardBlock(g - 1, w, grad, acc);
  }
  // After group 0 the pass may be repeated (activations are untouched by backward).
  bwd_next_ = g == 0 ? num_groups() - 1 : g - 1;
}

void Gpt::ForwardEmbedding(const std::vector<TensorRef>& w) {
  OpScope s(profile_, OpCategory::kEmbedding);
  EmbeddingForward(w[0], w[1], tokens_.data(), B_, T_, c_.d_model, acts_.residual);
}

void Gpt::ForwardBlock(int l, const std::vector<TensorRef>& w) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, ff = c_.ff();
  const float* x = acts_.residual + l * BT * d;
  float* out = acts_.residual + (l + 1) * BT * d;
  float* ln1 = acts_.ln1 + l * BT * d;
  float* qkv = acts_.qkv + l * BT * 3 * d;
  float* lse = acts_.lse + l * B_ * c_.n_head * static_cast<int64_t>(T_);
  float* atty = acts_.atty + l * BT * d;
  float* res_mid = acts_.res_mid + l * BT * d;
  float* ln2 = acts_.ln2 + l * BT * d;
  float* fch = acts_.fch + l * BT * ff;
  float* fch_gelu = acts_.fch_gelu + l * BT * ff;

  const int q = NumQkv();  // w[1 .. q]: the QKV runtime weights; then proj, ln2, fc1, fc2
  const Bf16Inputs in = RecordBf16Inputs(l + 1, w);
  if (in.any) DyBf16(nullptr, BT * std::max<int64_t>(ff, 3 * d));  // sized before backward
  {
    OpScope s(profile_, OpCategory::kNorm);
    RmsNormInto(x, Gain(w[0]), ln1, acts_.ln1_rstd + l * BT, BT, d, in.ln1);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    QkvForward(Input(ln1, in.ln1), in.some_qkv, w, qkv);
  }
  {
    OpScope s(profile_, OpCategory::kAttention);
    if (in.attention) {
      const int64_t n = kernels::AttentionBf16ScratchFloats(B_, T_, c_.n_head, c_.head_dim());
      if (static_cast<int64_t>(att_bf16_scratch_.size()) < n) att_bf16_scratch_.resize(n);
      kernels::CausalAttentionForwardBf16(qkv, atty, lse, att_bf16_scratch_.data(),
                                          static_cast<int64_t>(att_bf16_scratch_.size()), B_, T_,
                                          c_.n_head, c_.head_dim());
    } else {
      kernels::CausalAttentionForward(qkv, atty, lse, acts_.att_scratch, B_, T_, c_.n_head,
                                      c_.head_dim());
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    LinearForward(atty, View(w[q + 1]), res_mid, BT, d, d);
  }
  {
    OpScope s(profile_, OpCategory::kElementwise);
    kernels::AddThreaded(x, res_mid, res_mid, BT * d);
  }
  {
    OpScope s(profile_, OpCategory::kNorm);
    RmsNormInto(res_mid, Gain(w[q + 2]), ln2, acts_.ln2_rstd + l * BT, BT, d, in.ln2);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    LinearForward(Input(ln2, in.ln2), View(w[q + 3]), fch, BT, ff, d);
  }
  {
    OpScope s(profile_, OpCategory::kActivation);
    if (in.fch_gelu) {
      kernels::GeluForwardBf16(fch, Narrow(fch_gelu), BT * ff);
    } else {
      GeluForward(fch, fch_gelu, BT * ff);
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    LinearForward(Input(fch_gelu, in.fch_gelu), View(w[q + 4]), out, BT, d, ff);
  }
  OpScope s(profile_, OpCategory::kElementwise);
  kernels::AddThreaded(res_mid, out, out, BT * d);
}

void Gpt::ForwardHead(const std::vector<TensorRef>& w) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, V = c_.padded_vocab();
  const float* x = acts_.residual + c_.n_layer * BT * d;
  const bool lnf16 = RecordBf16Inputs(num_groups() - 1, w).lnf;
  {
    OpScope s(profile_, OpCategory::kNorm);
    RmsNormInto(x, Gain(w[0]), acts_.lnf, acts_.lnf_rstd, BT, d, lnf16);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    LinearForward(Input(acts_.lnf, lnf16), View(w[1]), acts_.probs, BT, V, d);
  }
  OpScope s(profile_, OpCategory::kLoss);
  loss_ = SoftmaxCrossEntropyForward(acts_.probs, targets_.data(), acts_.losses, BT, c_.vocab, V) /
          static_cast<double>(BT);
}

void Gpt::BackwardHead(const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                       bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, V = c_.padded_vocab();
  const float* x = acts_.residual + c_.n_layer * BT * d;
  const bool lnf16 = CheckBf16Inputs(num_groups() - 1, w).lnf;
  kernels::LinearInput dlogits = acts_.dlogits;
  {
    OpScope s(profile_, OpCategory::kLoss);
    const float scale = static_cast<float>(1.0 / static_cast<double>(BT));
    if (lnf16) {  // the bf16 gradient in the first half of its own fp32 slot
      kernels::SoftmaxCrossEntropyBackwardBf16(acts_.probs, targets_.data(), Narrow(acts_.dlogits),
                                               BT, V, scale);
      dlogits = Narrow(acts_.dlogits);
    } else {
      SoftmaxCrossEntropyBackward(acts_.probs, targets_.data(), acts_.dlogits, BT, V, scale);
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    LinearBackwardWeight(dlogits, Input(acts_.lnf, lnf16), kernels::LinearComputeDType(w[1].dtype),
                         grad[1].data, grad[1].dtype, BT, V, d, acc);
    LinearBackwardData(dlogits, View(w[1]), acts_.dtmp, BT, V, d, false);
  }
  OpScope s(profile_, OpCategory::kNorm);
  RmsNormBackward(acts_.dtmp, x, Gain(w[0]), acts_.lnf_rstd, acts_.dres, dgain_scratch_.data(), BT,
                  d, /*accumulate_dx=*/false);
  kernels::WriteOrAccumulate(dgain_scratch_.data(), grad[0].data, grad[0].dtype, d, acc);
}

void Gpt::BackwardBlock(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                        bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, ff = c_.ff();
  const float* x = acts_.residual + l * BT * d;
  const float* ln1 = acts_.ln1 + l * BT * d;
  const float* qkv = acts_.qkv + l * BT * 3 * d;
  const float* lse = acts_.lse + l * B_ * c_.n_head * static_cast<int64_t>(T_);
  const float* atty = acts_.atty + l * BT * d;
  const float* res_mid = acts_.res_mid + l * BT * d;
  const float* ln2 = acts_.ln2 + l * BT * d;
  const float* fch = acts_.fch + l * BT * ff;
  const float* fch_gelu = acts_.fch_gelu + l * BT * ff;
  float* dres = acts_.dres;  // in: d out; after MLP: d res_mid; out: d x

  const int q = NumQkv();  // w[1 .. q]: the QKV runtime weights; then proj, ln2, fc1, fc2
  const int proj = q + 1, g2 = q + 2, fc1 = q + 3, fc2 = q + 4;
  const Bf16Inputs in = CheckBf16Inputs(l + 1, w);

  // MLP: out = res_mid + fc2(gelu(fc1(ln2(res_mid)))).
  {
    OpScope s(profile_, OpCategory::kGemm);
    const kernels::LinearInput dy = in.fch_gelu ? DyBf16(dres, BT * d) : kernels::LinearInput(dres);
    LinearBackwardWeight(dy, Input(fch_gelu, in.fch_gelu),
                         kernels::LinearComputeDType(w[fc2].dtype), grad[fc2].data, grad[fc2].dtype,
                         BT, d, ff, acc);
    LinearBackwardData(dy, View(w[fc2]), acts_.dfch, BT, d, ff, false);
  }
  kernels::LinearInput dfch = acts_.dfch;
  {
    OpScope s(profile_, OpCategory::kActivation);
    if (in.ln2) {
      bf16* d16 = DyBf16(nullptr, BT * ff);
      kernels::GeluBackwardBf16(fch, acts_.dfch, d16, BT * ff);
      dfch = d16;
    } else {
      GeluBackwardInPlace(fch, acts_.dfch, BT * ff);
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    LinearBackwardWeight(dfch, Input(ln2, in.ln2), kernels::LinearComputeDType(w[fc1].dtype),
                         grad[fc1].data, grad[fc1].dtype, BT, ff, d, acc);
    LinearBackwardData(dfch, View(w[fc1]), acts_.dtmp, BT, ff, d, false);
  }
  {
    OpScope s(profile_, OpCategory::kNorm);
    RmsNormBackward(acts_.dtmp, res_mid, Gain(w[g2]), acts_.ln2_rstd + l * BT, dres,
                    dgain_scratch_.data(), BT, d, /*accumulate_dx=*/true);
    kernels::WriteOrAccumulate(dgain_scratch_.data(), grad[g2].data, grad[g2].dtype, d, acc);
  }

  // Attention: res_mid = x + proj(attention(qkv(ln1(x)))).
  {
    OpScope s(profile_, OpCategory::kGemm);
    const kernels::LinearInput dy =
        Bf16Weight(w[proj]) ? DyBf16(dres, BT * d) : kernels::LinearInput(dres);
    LinearBackwardWeight(dy, atty, kernels::LinearComputeDType(w[proj].dtype), grad[proj].data,
                         grad[proj].dtype, BT, d, d, acc);
    LinearBackwardData(dy, View(w[proj]), acts_.dtmp, BT, d, d, false);
  }
  {
    OpScope s(profile_, OpCategory::kAttention);
    if (in.attention) {
      // Nothing carries over from Forward in the scratch: sized again in case the path or
      // the thread count changed since.
      const int64_t n = kernels::AttentionBf16ScratchFloats(B_, T_, c_.n_head, c_.head_dim());
      if (static_cast<int64_t>(att_bf16_scratch_.size()) < n) att_bf16_scratch_.resize(n);
      kernels::CausalAttentionBackwardBf16(
          acts_.dtmp, qkv, atty, lse, acts_.dqkv, att_bf16_scratch_.data(),
          static_cast<int64_t>(att_bf16_scratch_.size()), B_, T_, c_.n_head, c_.head_dim());
    } else {
      kernels::CausalAttentionBackward(acts_.dtmp, qkv, atty, lse, acts_.dqkv, acts_.att_scratch,
                                       B_, T_, c_.n_head, c_.head_dim());
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    QkvBackward(Input(ln1, in.ln1), in.some_qkv, w, grad, acts_.dtmp, acc);
  }
  OpScope s(profile_, OpCategory::kNorm);
  RmsNormBackward(acts_.dtmp, x, Gain(w[0]), acts_.ln1_rstd + l * BT, dres, dgain_scratch_.data(),
                  BT, d, /*accumulate_dx=*/true);
  kernels::WriteOrAccumulate(dgain_scratch_.data(), grad[0].data, grad[0].dtype, d, acc);
}

Gpt::Bf16Inputs Gpt::InputsOf(int g, const std::vector<TensorRef>& w) const {
  Bf16Inputs in;
  if (g == num_groups() - 1) {
    in.lnf = Bf16Weight(w[1]);
    in.any = in.lnf;
  } else if (g > 0) {
    const int q = NumQkv();
    in.ln1 = std::all_of(w.begin() + 1, w.begin() + 1 + q, Bf16Weight);
    in.attention = in.ln1 && c_.bf16_attention;
    in.some_qkv = std::any_of(w.begin() + 1, w.begin() + 1 + q, Bf16Weight);
    in.ln2 = Bf16Weight(w[q + 3]);
    in.fch_gelu = Bf16Weight(w[q + 4]);
    in.any = in.some_qkv || in.ln2 || in.fch_gelu || Bf16Weight(w[q + 1]);
  }
  return in;
}

Gpt::Bf16Inputs Gpt::RecordBf16Inputs(int g, const std::vector<TensorRef>& w) {
  const Bf16Inputs in = InputsOf(g, w);
  bf16_inputs_.resize(static_cast<size_t>(num_groups()));
  bf16_inputs_[static_cast<size_t>(g)] = in.Bits();
  return in;
}

Gpt::Bf16Inputs Gpt::CheckBf16Inputs(int g, const std::vector<TensorRef>& w) const {
  const Bf16Inputs in = InputsOf(g, w);
  SSHSDP_CHECK(static_cast<size_t>(g) < bf16_inputs_.size() &&
                   in.Bits() == bf16_inputs_[static_cast<size_t>(g)],
               PlanError,
               "GPT Backward({}): the weight views' dtypes differ from those its Forward ran with "
               "(it stored the linear layers' inputs in bf16 for bf16 weights, fp32 otherwise); "
               "run Backward with the views of the Forward",
               g);
  return in;
}

bf16* Gpt::DyBf16(const float* src, int64_t n) {
  if (dy_bf16_.size() < static_cast<size_t>(n)) dy_bf16_.resize(static_cast<size_t>(n));
  if (src != nullptr) kernels::CastToBf16(src, dy_bf16_.data(), n);
  return dy_bf16_.data();
}

void Gpt::QkvForward(kernels::LinearInput ln1, bool some_bf16, const std::vector<TensorRef>& w,
                     float* qkv) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, dh = c_.head_dim();
  if (c_.packed_qkv) {
    LinearForward(ln1, View(w[1]), qkv, BT, 3 * d, d);
    return;
  }
  // One GEMM per part j: qkv[:, j·dh .. (j+1)·dh) = ln1 · W_jᵀ (row stride 3d). bf16 parts
  // multiply the bf16 rounding of ln1 (stored so when every part is bf16), as LinearForward
  // does for a bf16 packed weight.
  const void* ln1_16 = QkvInputBf16(ln1, some_bf16);
  for (int j = 0; j < NumQkv(); ++j) {
    const TensorRef& wj = w[1 + j];
    const void* a = wj.dtype == DType::kBF16 ? ln1_16 : ln1.data;
    kernels::GemmStrided(false, true, BT, dh, d, a, d, wj.data, d, wj.dtype, qkv + j * dh, 3 * d,
                         DType::kF32, false);
  }
}

const void* Gpt::QkvInputBf16(kernels::LinearInput ln1, bool some_bf16) {
  if (ln1.dtype == DType::kBF16 || !some_bf16) return ln1.data;  // rounded, or nobody reads it
  const int64_t n = static_cast<int64_t>(B_) * T_ * c_.d_model;
  x_bf16_.resize(static_cast<size_t>(n));
  kernels::CastToBf16(static_cast<const float*>(ln1.data), x_bf16_.data(), n);
  return x_bf16_.data();
}

void Gpt::QkvBackward(kernels::LinearInput ln1, bool some_bf16, const std::vector<TensorRef>& w,
                      const std::vector<TensorRef>& grad, float* dx, bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, dh = c_.head_dim();
  const float* dqkv = acts_.dqkv;
  const bf16* dqkv16 = some_bf16 ? DyBf16(dqkv, BT * 3 * d) : nullptr;
  if (c_.packed_qkv) {
    const kernels::LinearInput dy = some_bf16 ? kernels::LinearInput(dqkv16) : dqkv;
    LinearBackwardWeight(dy, ln1, kernels::LinearComputeDType(w[1].dtype), grad[1].data,
                         grad[1].dtype, BT, 3 * d, d, acc);
    LinearBackwardData(dy, View(w[1]), dx, BT, 3 * d, d, false);
    return;
  }
  const void* ln1_16 = QkvInputBf16(ln1, some_bf16);
  for (int j = 0; j < NumQkv(); ++j) {
    const TensorRef& wj = w[1 + j];
    const bool b16 = wj.dtype == DType::kBF16;
    const void* dy =
        b16 ? static_cast<const void*>(dqkv16 + j * dh) : static_cast<const void*>(dqkv + j * dh);
    const void* x = b16 ? ln1_16 : ln1.data;
    // dW_j[dh, d] (=|+=) dqkv[:, j]ᵀ · ln1, straight into part j's gradient view.
    kernels::GemmStrided(true, false, dh, d, BT, dy, 3 * d, x, d, wj.dtype, grad[1 + j].data, d,
                         grad[1 + j].dtype, acc);
    // dx[BT, d] (=, then +=) dqkv[:, j] · W_j.
    kernels::GemmStrided(false, false, BT, d, dh, dy, 3 * d, wj.data, d, wj.dtype, dx, d,
                         DType::kF32, j > 0);
  }
}

void Gpt::BackwardEmbedding(const std::vector<TensorRef>& grad, bool acc) {
  OpScope s(profile_, OpCategory::kEmbedding);
  EmbeddingBackward(acts_.dres, tokens_.data(), B_, T_, c_.d_model, grad[0], c_.padded_vocab(),
                    grad[1], c_.seq_len, acc, table_scratch_);
}

double Gpt::FlopsPerToken() const {
  // The LM-head GEMM runs over the padded vocabulary (llm.c counts it the same way).
  const double d = c_.d_model, ff = c_.ff(), L = c_.n_layer, V = c_.padded_vocab();
  const double n_gemm = L * (3 * d * d + d * d + 2 * d * ff) + V * d;
  const double T = T_ > 0 ? T_ : c_.seq_len;
  return 6.0 * n_gemm + 12.0 * L * d * T;
}

int64_t Gpt::ActivationBytes() const {
  return static_cast<int64_t>((arena_.size() + table_scratch_.size() + gain_scratch_.size() +
                               dgain_scratch_.size() + att_bf16_scratch_.size()) *
                                  sizeof(float) +
                              (x_bf16_.size() + dy_bf16_.size()) * sizeof(bf16));
}

}  // namespace sshsdp
