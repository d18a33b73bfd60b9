// Reference GPT forward/backward (see gpt.h), llm.c style: every layer is a pair of backend
// ops over activations stored in one arena of the backend's memory; bf16 runtime weights run
// bf16 GEMMs; weight gradients are written straight into the views the engine passes, in
// overwrite or accumulate mode.
#include "sshsdp/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string_view>
#include <utility>

#include "sshsdp/base/error.h"
#include "sshsdp/base/op_profile.h"
#include "sshsdp/kernels/mx_linear.h"
#include "sshsdp/models/layers.h"
#include "sshsdp/models/size_limits.h"

namespace sshsdp {
namespace {

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
// the same bytes of a slot both as fp32 and as bf16 (the products hand them to the GEMMs).
bool Bf16Weight(const TensorRef& t) { return t.dtype == DType::kBF16; }
bf16* Narrow(float* slot) { return reinterpret_cast<bf16*>(slot); }
const bf16* Narrow(const float* slot) { return reinterpret_cast<const bf16*>(slot); }
kernels::LinearInput Input(const float* slot, bool narrow) {
  return narrow ? kernels::LinearInput(Narrow(slot)) : kernels::LinearInput(slot);
}
// RMSNorm into `y`'s slot, in bf16 when `narrow`.
void RmsNormInto(Backend& b, const float* x, const float* g, float* y, float* rstd, int64_t rows,
                 int d, bool narrow) {
  if (narrow) {
    b.RmsNormForwardBf16(x, g, Narrow(y), rstd, rows, d, kernels::kRmsEps);
  } else {
    b.RmsNormForward(x, g, y, rstd, rows, d, kernels::kRmsEps);
  }
}

using layers::IsFloatType;
using layers::kOnes;
using layers::Normal;
using layers::Single;
using layers::View;

}  // namespace

void CheckAttentionFits(const Backend& b, const GptConfig& c, const char* model) {
  SSHSDP_CHECK(c.head_dim() <= b.max_attention_head_dim(), ConfigError,
               "{}: {}'s attention takes head widths up to {}, this model's is {} (d_model {} / "
               "n_head {}); use more heads or --backend cpu",
               model, b.name(), b.max_attention_head_dim(), c.head_dim(), c.d_model, c.n_head);
}

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
  CheckDimensions("GPT config", {{"n_layer", n_layer, kMaxLayers},
                                 {"d_model", d_model, kMaxWidth},
                                 {"d_ff", d_ff, kMaxFfnWidth},
                                 {"n_head", n_head, kMaxHeadsOrExperts},
                                 {"seq_len", seq_len, kMaxSeqLen}});
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

Gpt::Gpt(const GptConfig& config) : Gpt(config, MakeCpuBackend()) {}

// The buffers bind to *own, which keeps its address when own_ takes it over.
Gpt::Gpt(const GptConfig& config, std::unique_ptr<Backend> own) : Gpt(config, *own) {
  own_ = std::move(own);
}

Gpt::Gpt(const GptConfig& config, Backend& backend) : Gpt(config, backend, {}) {}

Gpt::Gpt(const GptConfig& config, Backend& backend, std::vector<bool> mlp)
    : b_(backend),
      c_(config),
      tokens_(b_),
      losses_(b_),
      arena_(b_),
      gain_scratch_(b_),
      dgain_scratch_(b_),
      table_scratch_(b_),
      x_bf16_(b_),
      dy_bf16_(b_),
      att_bf16_scratch_(b_),
      mx16_(b_) {
  Init(std::move(mlp));
}

void Gpt::Init(std::vector<bool> mlp) {
  c_.Validate();
  if (c_.d_ff <= 0) c_.d_ff = 4 * c_.d_model;
  SSHSDP_CHECK(mlp.empty() || static_cast<int>(mlp.size()) == c_.n_layer, ConfigError,
               "GPT trunk: {} MLP flags for {} blocks", mlp.size(), c_.n_layer);
  for (int l = 0; l < c_.n_layer; ++l) {
    const bool has = mlp.empty() || mlp[static_cast<size_t>(l)];
    mlp_slot_.push_back(has ? mlp_blocks_++ : -1);
  }
  CheckAttentionFits(b_, c_, "GPT");
  SSHSDP_CHECK(c_.packed_qkv || b_.Has(BackendFeature::kStridedGemm), ConfigError,
               "GPT with per-part QKV runtime parameters (packed_qkv = false, veScale's model) "
               "on backend {}: it has no {}; use packed QKV or --backend cpu",
               b_.name(), BackendFeatureName(BackendFeature::kStridedGemm));
  bf16_attention_ = c_.bf16_attention && b_.Has(BackendFeature::kBf16Attention);
  SSHSDP_CHECK(c_.mx_gemm == DType::kF32 || c_.mx_gemm == DType::kBF16, ConfigError,
               "GPT: MXFP8 weights are dequantized to fp32 or bf16 for their GEMMs (--mx-gemm), "
               "got {}",
               DTypeName(c_.mx_gemm));
  gain_scratch_.Reserve<float>(c_.d_model);
  dgain_scratch_.Reserve<float>(c_.d_model);
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
  // Queued behind the last batch's backward, which still reads the tokens (same stream).
  int32_t* tok = tokens_.Reserve<int32_t>(2 * BT);
  b_.Upload(tok, tokens, static_cast<size_t>(BT) * sizeof(int32_t));
  b_.Upload(tok + BT, targets, static_cast<size_t>(BT) * sizeof(int32_t));
  B_ = B, T_ = T;

  // Arena: one allocation, each tensor 64-byte aligned.
  float** slots[] = {&acts_.residual, &acts_.ln1,   &acts_.ln1_rstd, &acts_.qkv,
                     &acts_.lse,      &acts_.atty,  &acts_.res_mid,  &acts_.ln2,
                     &acts_.ln2_rstd, &acts_.fch,   &acts_.fch_gelu, &acts_.lnf,
                     &acts_.lnf_rstd, &acts_.probs, &acts_.losses,   &acts_.dres,
                     &acts_.dtmp,     &acts_.dqkv,  &acts_.dfch,     &acts_.dlogits};
  const int64_t L = c_.n_layer, d = c_.d_model, ff = c_.ff(), V = c_.padded_vocab(), H = c_.n_head,
                M = mlp_blocks_;
  const int64_t sizes[] = {(L + 1) * BT * d,
                           L * BT * d,
                           L * BT,
                           L * BT * 3 * d,
                           L * B * H * T,
                           L * BT * d,
                           L * BT * d,
                           L * BT * d,
                           L * BT,
                           M * BT * ff,
                           M * BT * ff,
                           BT * d,
                           BT,
                           BT * V,
                           BT,
                           BT * d,
                           BT * d,
                           BT * 3 * d,
                           M > 0 ? BT * ff : 0,
                           BT * V};
  static_assert(std::size(slots) == std::size(sizes));
  int64_t offsets[std::size(slots)];
  int64_t total = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    offsets[i] = total;
    total += (sizes[i] + 15) / 16 * 16;
  }
  float* arena = arena_.Reserve<float>(total);
  for (size_t i = 0; i < std::size(sizes); ++i) *slots[i] = arena + offsets[i];

  order_.Reset(num_groups());
  loss_ready_ = false;
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

const std::vector<TensorRef>& Gpt::GemmViews(int g, const std::vector<TensorRef>& w) {
  const bool any_mx = std::any_of(w.begin(), w.end(),
                                  [](const TensorRef& t) { return kernels::IsMxElement(t.dtype); });
  if (c_.mx_gemm != DType::kBF16 || !any_mx) return w;
  const std::vector<RuntimeParamSpec> specs = GroupParams(g);
  int64_t total = 0;
  for (const RuntimeParamSpec& s : specs) total += (s.numel() + 31) / 32 * 32;
  bf16* at = mx16_.Reserve<bf16>(total);
  mx16_views_ = w;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!kernels::IsMxElement(w[i].dtype)) continue;
    SSHSDP_CHECK(w[i].scale_layout == ScaleLayout::kRowMajor, ConfigError,
                 "GPT group {}: --mx-gemm bf16 dequantizes MXFP8 weights from row_major scales, "
                 "got {} (--scale-layout row_major)",
                 g, ScaleLayoutName(w[i].scale_layout));
    int64_t rows = 0, cols = 0;
    MatrixView(specs[i].shape, &rows, &cols);
    MxOptions opt;
    opt.elem = w[i].dtype;
    b_.MxDequantizeRowsBf16(static_cast<const uint8_t*>(w[i].data), w[i].scales, rows, cols, at,
                            opt);
    mx16_views_[i] = TensorRef{at, DType::kBF16};
    at += (rows * cols + 31) / 32 * 32;
  }
  return mx16_views_;
}

const float* Gpt::Gain(const TensorRef& t) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  float* out = gain_scratch_.data<float>();
  if (kernels::IsMxElement(t.dtype)) {  // an MX vector: [1, d] with its own scales
    b_.MxDequantizeOperand(static_cast<const uint8_t*>(t.data), t.dtype, t.scales, t.scale_layout,
                           1, c_.d_model, out);
    return out;
  }
  b_.CastBf16ToF32(static_cast<const bf16*>(t.data), out, c_.d_model);
  return out;
}

void Gpt::Forward(int g, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(B_ > 0, PlanError, "GPT Forward({}) before SetBatch", g);
  order_.StartForward(g);
  CheckViews(g, w, "weight");
  if (g == 0) {
    ForwardEmbedding(w);
  } else if (g == num_groups() - 1) {
    ForwardHead(w);
  } else {
    ForwardBlock(g - 1, GemmViews(g, w));
  }
  order_.EndForward(g);
}

double Gpt::Loss() const {
  SSHSDP_CHECK(loss_ready_, PlanError, "GPT Loss() before the last group's Forward");
  return losses_.Mean(static_cast<int64_t>(B_) * T_);
}

void Gpt::KeepLoss() {
  SSHSDP_CHECK(loss_ready_, PlanError, "GPT KeepLoss() before the last group's Forward");
  losses_.Keep(static_cast<int64_t>(B_) * T_);
}

std::vector<double> Gpt::TakeLosses() { return losses_.Take(); }

void Gpt::Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                   GradWrite mode) {
  order_.StartBackward(g);
  CheckViews(g, w, "weight");
  CheckViews(g, grad, "gradient");
  const bool acc = mode == GradWrite::kAccumulate;
  if (g == num_groups() - 1) {
    BackwardHead(w, grad, acc);
  } else if (g == 0) {
    BackwardEmbedding(grad, acc);
  } else {
    BackwardBlock(g - 1, GemmViews(g, w), grad, acc);
  }
  order_.EndBackward(g);
}

void Gpt::ForwardEmbedding(const std::vector<TensorRef>& w) {
  OpScope s(profile_, OpCategory::kEmbedding);
  loss_ready_ = false;
  SSHSDP_CHECK(w[0].dtype == w[1].dtype, PlanError,
               "GPT embeddings: wte and wpe in one dtype (one group buffer), got {} and {}",
               DTypeName(w[0].dtype), DTypeName(w[1].dtype));
  b_.EmbeddingForwardTyped(w[0].data, w[1].data, w[0].dtype, tokens_.data<int32_t>(), B_, T_,
                           c_.d_model, c_.padded_vocab(), c_.seq_len, acts_.residual);
}

float* Gpt::Ln2(int l) const { return acts_.ln2 + l * int64_t{B_} * T_ * c_.d_model; }
float* Gpt::ResMid(int l) const { return acts_.res_mid + l * int64_t{B_} * T_ * c_.d_model; }
float* Gpt::BlockOut(int l) const {
  return acts_.residual + (l + 1) * int64_t{B_} * T_ * c_.d_model;
}

void Gpt::ForwardBlock(int l, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(mlp_slot_[static_cast<size_t>(l)] >= 0, PlanError,
               "GPT block {} has no dense MLP (a trunk's block): the model built on the trunk "
               "runs it",
               l);
  const Bf16Inputs in = RecordBf16Inputs(l + 1, w, /*mlp=*/true);
  AttentionForward(l, w, in);
  MlpForward(l, w, in);
}

void Gpt::ForwardAttention(int l, const std::vector<TensorRef>& w) {
  AttentionForward(l, w, RecordBf16Inputs(l + 1, w, /*mlp=*/false));
}

void Gpt::AttentionForward(int l, const std::vector<TensorRef>& w, const Bf16Inputs& in) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, ff = c_.ff();
  const float* x = acts_.residual + l * BT * d;
  float* ln1 = acts_.ln1 + l * BT * d;
  float* qkv = acts_.qkv + l * BT * 3 * d;
  float* lse = acts_.lse + l * B_ * c_.n_head * static_cast<int64_t>(T_);
  float* atty = acts_.atty + l * BT * d;
  float* res_mid = ResMid(l);

  const int q = NumQkv();  // w[1 .. q]: the QKV runtime weights; then proj, ln2
  if (in.any) DyBf16(nullptr, BT * std::max<int64_t>(ff, 3 * d));  // sized before backward
  {
    OpScope s(profile_, OpCategory::kNorm);
    RmsNormInto(b_, x, Gain(w[0]), ln1, acts_.ln1_rstd + l * BT, BT, d, in.ln1);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    QkvForward(Input(ln1, in.ln1), in.some_qkv, w, qkv);
  }
  {
    OpScope s(profile_, OpCategory::kAttention);
    if (in.attention) {
      const int64_t n = b_.AttentionBf16ScratchFloats(B_, T_, c_.n_head, c_.head_dim());
      float* scratch = att_bf16_scratch_.Reserve<float>(n);
      b_.CausalAttentionForwardBf16(qkv, atty, lse, scratch, att_bf16_scratch_.bytes() / 4, B_, T_,
                                    c_.n_head, c_.head_dim());
    } else {
      b_.CausalAttentionForward(qkv, atty, lse, B_, T_, c_.n_head, c_.head_dim());
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearForward(atty, View(w[q + 1]), res_mid, BT, d, d);
  }
  {
    OpScope s(profile_, OpCategory::kElementwise);
    b_.Add(x, res_mid, res_mid, BT * d);
  }
  OpScope s(profile_, OpCategory::kNorm);
  RmsNormInto(b_, res_mid, Gain(w[q + 2]), Ln2(l), acts_.ln2_rstd + l * BT, BT, d, in.ln2);
}

void Gpt::MlpForward(int l, const std::vector<TensorRef>& w, const Bf16Inputs& in) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, ff = c_.ff();
  const float* res_mid = ResMid(l);
  const float* ln2 = Ln2(l);
  float* out = BlockOut(l);
  const int64_t at = mlp_slot_[static_cast<size_t>(l)] * BT * ff;  // block l's MLP slot
  float* fch = acts_.fch + at;
  float* fch_gelu = acts_.fch_gelu + at;
  const int q = NumQkv();  // w[q + 3], w[q + 4]: fc1, fc2
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearForward(Input(ln2, in.ln2), View(w[q + 3]), fch, BT, ff, d);
  }
  {
    OpScope s(profile_, OpCategory::kActivation);
    if (in.fch_gelu) {
      b_.GeluForwardBf16(fch, Narrow(fch_gelu), BT * ff);
    } else {
      b_.GeluForward(fch, fch_gelu, BT * ff);
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearForward(Input(fch_gelu, in.fch_gelu), View(w[q + 4]), out, BT, d, ff);
  }
  OpScope s(profile_, OpCategory::kElementwise);
  b_.Add(res_mid, out, out, BT * d);
}

void Gpt::ForwardHead(const std::vector<TensorRef>& w) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, V = c_.padded_vocab();
  const float* x = acts_.residual + c_.n_layer * BT * d;
  const bool lnf16 = RecordBf16Inputs(num_groups() - 1, w, false).lnf;
  {
    OpScope s(profile_, OpCategory::kNorm);
    RmsNormInto(b_, x, Gain(w[0]), acts_.lnf, acts_.lnf_rstd, BT, d, lnf16);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearForward(Input(acts_.lnf, lnf16), View(w[1]), acts_.probs, BT, V, d);
  }
  OpScope s(profile_, OpCategory::kLoss);
  b_.SoftmaxCrossEntropyForward(acts_.probs, tokens_.data<int32_t>() + BT, acts_.losses, BT,
                                c_.vocab, V, losses_.Sum());
  loss_ready_ = true;
}

void Gpt::BackwardHead(const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                       bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, V = c_.padded_vocab();
  const float* x = acts_.residual + c_.n_layer * BT * d;
  const bool lnf16 = CheckBf16Inputs(num_groups() - 1, w, false).lnf;
  kernels::LinearInput dlogits = acts_.dlogits;
  {
    OpScope s(profile_, OpCategory::kLoss);
    const float scale = static_cast<float>(1.0 / static_cast<double>(BT));
    const int32_t* targets = tokens_.data<int32_t>() + BT;
    if (lnf16) {  // the bf16 gradient in the first half of its own fp32 slot
      b_.SoftmaxCrossEntropyBackwardBf16(acts_.probs, targets, Narrow(acts_.dlogits), BT, V, scale);
      dlogits = Narrow(acts_.dlogits);
    } else {
      b_.SoftmaxCrossEntropyBackward(acts_.probs, targets, acts_.dlogits, BT, V, scale);
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearBackwardWeight(dlogits, Input(acts_.lnf, lnf16),
                            kernels::LinearComputeDType(w[1].dtype), grad[1].data, grad[1].dtype,
                            BT, V, d, acc);
    b_.LinearBackwardData(dlogits, View(w[1]), acts_.dtmp, BT, V, d, false);
  }
  OpScope s(profile_, OpCategory::kNorm);
  float* dgain = dgain_scratch_.data<float>();
  b_.RmsNormBackward(acts_.dtmp, x, Gain(w[0]), acts_.lnf_rstd, acts_.dres, dgain, BT,
                     static_cast<int>(d), /*accumulate_dx=*/false);
  b_.WriteOrAccumulate(dgain, grad[0].data, grad[0].dtype, d, acc);
}

void Gpt::BackwardBlock(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                        bool acc) {
  const Bf16Inputs in = CheckBf16Inputs(l + 1, w, /*mlp=*/true);
  MlpBackward(l, w, grad, in, acc);
  AttentionBackward(l, w, grad, in, acc);
}

void Gpt::BackwardAttention(int l, const std::vector<TensorRef>& w,
                            const std::vector<TensorRef>& grad, bool acc) {
  AttentionBackward(l, w, grad, CheckBf16Inputs(l + 1, w, /*mlp=*/false), acc);
}

// MLP: out = res_mid + fc2(gelu(fc1(ln2(res_mid)))); from dres = ∂/∂out, ∂/∂ln2 into dtmp.
void Gpt::MlpBackward(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                      const Bf16Inputs& in, bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, ff = c_.ff();
  const float* ln2 = Ln2(l);
  const int64_t at = mlp_slot_[static_cast<size_t>(l)] * BT * ff;  // block l's MLP slot
  const float* fch = acts_.fch + at;
  const float* fch_gelu = acts_.fch_gelu + at;
  const float* dres = acts_.dres;
  const int q = NumQkv();
  const int fc1 = q + 3, fc2 = q + 4;
  {
    OpScope s(profile_, OpCategory::kGemm);
    const kernels::LinearInput dy = in.fch_gelu ? DyBf16(dres, BT * d) : kernels::LinearInput(dres);
    b_.LinearBackwardWeight(dy, Input(fch_gelu, in.fch_gelu),
                            kernels::LinearComputeDType(w[fc2].dtype), grad[fc2].data,
                            grad[fc2].dtype, BT, d, ff, acc);
    b_.LinearBackwardData(dy, View(w[fc2]), acts_.dfch, BT, d, ff, false);
  }
  kernels::LinearInput dfch = acts_.dfch;
  {
    OpScope s(profile_, OpCategory::kActivation);
    if (in.ln2) {
      bf16* d16 = DyBf16(nullptr, BT * ff);
      b_.GeluBackwardBf16(fch, acts_.dfch, d16, BT * ff);
      dfch = d16;
    } else {
      b_.GeluBackwardInPlace(fch, acts_.dfch, BT * ff);
    }
  }
  OpScope s(profile_, OpCategory::kGemm);
  b_.LinearBackwardWeight(dfch, Input(ln2, in.ln2), kernels::LinearComputeDType(w[fc1].dtype),
                          grad[fc1].data, grad[fc1].dtype, BT, ff, d, acc);
  b_.LinearBackwardData(dfch, View(w[fc1]), acts_.dtmp, BT, ff, d, false);
}

// From dtmp = ∂/∂ln2 and dres = ∂/∂out: dres = ∂/∂x. res_mid = x + proj(attention(qkv(ln1(x)))).
void Gpt::AttentionBackward(int l, const std::vector<TensorRef>& w,
                            const std::vector<TensorRef>& grad, const Bf16Inputs& in, bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model;
  const float* x = acts_.residual + l * BT * d;
  const float* ln1 = acts_.ln1 + l * BT * d;
  const float* qkv = acts_.qkv + l * BT * 3 * d;
  const float* lse = acts_.lse + l * B_ * c_.n_head * static_cast<int64_t>(T_);
  const float* atty = acts_.atty + l * BT * d;
  float* dres = acts_.dres;  // in: ∂/∂out; after ln2: ∂/∂res_mid; out: ∂/∂x
  const int q = NumQkv();
  const int proj = q + 1, g2 = q + 2;
  {
    OpScope s(profile_, OpCategory::kNorm);
    b_.RmsNormBackward(acts_.dtmp, ResMid(l), Gain(w[g2]), acts_.ln2_rstd + l * BT, dres,
                       dgain_scratch_.data<float>(), BT, static_cast<int>(d),
                       /*accumulate_dx=*/true);
    b_.WriteOrAccumulate(dgain_scratch_.data<float>(), grad[g2].data, grad[g2].dtype, d, acc);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    const kernels::LinearInput dy =
        Bf16Weight(w[proj]) ? DyBf16(dres, BT * d) : kernels::LinearInput(dres);
    b_.LinearBackwardWeight(dy, atty, kernels::LinearComputeDType(w[proj].dtype), grad[proj].data,
                            grad[proj].dtype, BT, d, d, acc);
    b_.LinearBackwardData(dy, View(w[proj]), acts_.dtmp, BT, d, d, false);
  }
  {
    OpScope s(profile_, OpCategory::kAttention);
    if (in.attention) {
      // Nothing carries over from Forward in the scratch: sized again in case the path or
      // the thread count changed since.
      const int64_t n = b_.AttentionBf16ScratchFloats(B_, T_, c_.n_head, c_.head_dim());
      float* scratch = att_bf16_scratch_.Reserve<float>(n);
      b_.CausalAttentionBackwardBf16(acts_.dtmp, qkv, atty, lse, acts_.dqkv, scratch,
                                     att_bf16_scratch_.bytes() / 4, B_, T_, c_.n_head,
                                     c_.head_dim());
    } else {
      b_.CausalAttentionBackward(acts_.dtmp, qkv, atty, lse, acts_.dqkv, B_, T_, c_.n_head,
                                 c_.head_dim());
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    QkvBackward(Input(ln1, in.ln1), in.some_qkv, w, grad, acts_.dtmp, acc);
  }
  OpScope s(profile_, OpCategory::kNorm);
  b_.RmsNormBackward(acts_.dtmp, x, Gain(w[0]), acts_.ln1_rstd + l * BT, dres,
                     dgain_scratch_.data<float>(), BT, d, /*accumulate_dx=*/true);
  b_.WriteOrAccumulate(dgain_scratch_.data<float>(), grad[0].data, grad[0].dtype, d, acc);
}

Gpt::Bf16Inputs Gpt::InputsOf(int g, const std::vector<TensorRef>& w, bool mlp) const {
  Bf16Inputs in;
  if (g == num_groups() - 1) {
    in.lnf = Bf16Weight(w[1]);
    in.any = in.lnf;
  } else if (g > 0) {
    const int q = NumQkv();
    in.ln1 = std::all_of(w.begin() + 1, w.begin() + 1 + q, Bf16Weight);
    in.attention = in.ln1 && bf16_attention_;
    in.some_qkv = std::any_of(w.begin() + 1, w.begin() + 1 + q, Bf16Weight);
    in.ln2 = mlp && Bf16Weight(w[q + 3]);
    in.fch_gelu = mlp && Bf16Weight(w[q + 4]);
    in.any = in.some_qkv || in.ln2 || in.fch_gelu || Bf16Weight(w[q + 1]);
  }
  return in;
}

Gpt::Bf16Inputs Gpt::RecordBf16Inputs(int g, const std::vector<TensorRef>& w, bool mlp) {
  const Bf16Inputs in = InputsOf(g, w, mlp);
  bf16_inputs_.resize(static_cast<size_t>(num_groups()));
  bf16_inputs_[static_cast<size_t>(g)] = in.Bits();
  return in;
}

Gpt::Bf16Inputs Gpt::CheckBf16Inputs(int g, const std::vector<TensorRef>& w, bool mlp) const {
  const Bf16Inputs in = InputsOf(g, w, mlp);
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
  bf16* out = dy_bf16_.Reserve<bf16>(n);
  if (src != nullptr) b_.CastF32ToBf16(src, out, n);
  return out;
}

void Gpt::QkvForward(kernels::LinearInput ln1, bool some_bf16, const std::vector<TensorRef>& w,
                     float* qkv) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, dh = c_.head_dim();
  if (c_.packed_qkv) {
    b_.LinearForward(ln1, View(w[1]), qkv, BT, 3 * d, d);
    return;
  }
  // One GEMM per part j: qkv[:, j·dh .. (j+1)·dh) = ln1 · W_jᵀ (row stride 3d). bf16 parts
  // multiply the bf16 rounding of ln1 (stored so when every part is bf16), as LinearForward
  // does for a bf16 packed weight.
  const void* ln1_16 = QkvInputBf16(ln1, some_bf16);
  for (int j = 0; j < NumQkv(); ++j) {
    const TensorRef& wj = w[1 + j];
    const void* a = wj.dtype == DType::kBF16 ? ln1_16 : ln1.data;
    b_.GemmStrided(false, true, BT, dh, d, a, d, wj.data, d, wj.dtype, qkv + j * dh, 3 * d,
                   DType::kF32, false);
  }
}

const void* Gpt::QkvInputBf16(kernels::LinearInput ln1, bool some_bf16) {
  if (ln1.dtype == DType::kBF16 || !some_bf16) return ln1.data;  // rounded, or nobody reads it
  const int64_t n = static_cast<int64_t>(B_) * T_ * c_.d_model;
  bf16* out = x_bf16_.Reserve<bf16>(n);
  b_.CastF32ToBf16(static_cast<const float*>(ln1.data), out, n);
  return out;
}

void Gpt::QkvBackward(kernels::LinearInput ln1, bool some_bf16, const std::vector<TensorRef>& w,
                      const std::vector<TensorRef>& grad, float* dx, bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, dh = c_.head_dim();
  const float* dqkv = acts_.dqkv;
  const bf16* dqkv16 = some_bf16 ? DyBf16(dqkv, BT * 3 * d) : nullptr;
  if (c_.packed_qkv) {
    const kernels::LinearInput dy = some_bf16 ? kernels::LinearInput(dqkv16) : dqkv;
    b_.LinearBackwardWeight(dy, ln1, kernels::LinearComputeDType(w[1].dtype), grad[1].data,
                            grad[1].dtype, BT, 3 * d, d, acc);
    b_.LinearBackwardData(dy, View(w[1]), dx, BT, 3 * d, d, false);
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
    b_.GemmStrided(true, false, dh, d, BT, dy, 3 * d, x, d, wj.dtype, grad[1 + j].data, d,
                   grad[1 + j].dtype, acc);
    // dx[BT, d] (=, then +=) dqkv[:, j] · W_j.
    b_.GemmStrided(false, false, BT, d, dh, dy, 3 * d, wj.data, d, wj.dtype, dx, d, DType::kF32,
                   j > 0);
  }
}

void Gpt::BackwardEmbedding(const std::vector<TensorRef>& grad, bool acc) {
  OpScope s(profile_, OpCategory::kEmbedding);
  // The bf16 tables are summed in fp32 scratch (the wte part first) and rounded once.
  const int64_t n_te = int64_t{c_.padded_vocab()} * c_.d_model,
                n_pe = int64_t{c_.seq_len} * c_.d_model;
  const int64_t need =
      (grad[0].dtype == DType::kF32 ? 0 : n_te) + (grad[1].dtype == DType::kF32 ? 0 : n_pe);
  float* scratch = table_scratch_.Reserve<float>(need);
  b_.EmbeddingBackwardTyped(acts_.dres, tokens_.data<int32_t>(), B_, T_, c_.d_model, grad[0].data,
                            grad[0].dtype, c_.padded_vocab(), grad[1].data, grad[1].dtype,
                            c_.seq_len, acc, scratch);
}

double Gpt::FlopsPerToken() const {
  // The LM-head GEMM runs over the padded vocabulary (llm.c counts it the same way).
  const double d = c_.d_model, ff = c_.ff(), L = c_.n_layer, V = c_.padded_vocab();
  const double n_gemm = L * (3 * d * d + d * d + 2 * d * ff) + V * d;
  const double T = T_ > 0 ? T_ : c_.seq_len;
  return 6.0 * n_gemm + 12.0 * L * d * T;
}

int64_t Gpt::ActivationBytes() const {
  return arena_.bytes() + table_scratch_.bytes() + gain_scratch_.bytes() + dgain_scratch_.bytes() +
         att_bf16_scratch_.bytes() + x_bf16_.bytes() + dy_bf16_.bytes() + mx16_.bytes();
}

}  // namespace sshsdp
