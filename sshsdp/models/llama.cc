// The Llama family's forward / backward (llama.h), llama.c style: each layer a pair of backend
// ops over activations in one arena; weight gradients written straight into the views the
// engine passes, in overwrite or accumulate mode.
#include "sshsdp/models/llama.h"

#include <algorithm>
#include <cmath>

#include "sshsdp/base/error.h"
#include "sshsdp/base/op_profile.h"
#include "sshsdp/models/layers.h"
#include "sshsdp/models/size_limits.h"

namespace sshsdp {
namespace {

using layers::kOnes;
using layers::Normal;
using layers::Single;
using layers::View;

}  // namespace

LlamaConfig LlamaConfig::Preset(std::string_view name) {
  LlamaConfig c;
  if (name == "qwen3-tiny") return c;
  if (name == "qwen3-small") {
    c.d_model = 128, c.n_layer = 4, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 32, c.d_ff = 384;
    return c;
  }
  if (name == "qwen3-moe-tiny") {
    c.model_type = "qwen3_moe", c.tied = false;
    c.n_expert = 8, c.top_k = 2, c.d_expert = 64;
    return c;
  }
  if (name == "llama-tiny") {
    c.model_type = "llama", c.n_kv_head = 1, c.d_ff = 176, c.qk_norm = false, c.tied = false;
    c.rope_theta = 500000.0, c.norm_eps = 1e-5f;
    return c;
  }
  throw ConfigError(
      fmt::format("unknown Llama-family preset '{}': use qwen3-tiny, qwen3-small, "
                  "qwen3-moe-tiny or llama-tiny, or --model-config / --init-from-hf for a "
                  "Hugging Face config.json",
                  name));
}

bool LlamaConfig::IsPreset(std::string_view name) {
  return name == "qwen3-tiny" || name == "qwen3-small" || name == "qwen3-moe-tiny" ||
         name == "llama-tiny";
}

bool LlamaConfig::IsMoeLayer(int l) const {
  return IsMoe() &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), l) == mlp_only_layers.end() &&
         (l + 1) % sparse_step == 0;
}

void LlamaConfig::Validate() const {
  CheckDimensions("Llama config", {{"num_hidden_layers", n_layer, kMaxLayers},
                                   {"hidden_size", d_model, kMaxWidth},
                                   {"intermediate_size", d_ff, kMaxFfnWidth},
                                   {"moe_intermediate_size", d_expert, kMaxFfnWidth},
                                   {"num_attention_heads", n_head, kMaxHeadsOrExperts},
                                   {"num_key_value_heads", n_kv_head, kMaxHeadsOrExperts},
                                   {"num_experts", n_expert, kMaxHeadsOrExperts},
                                   {"seq_len", seq_len, kMaxSeqLen}});
  SSHSDP_CHECK(model_type == "llama" || model_type == "qwen3" || model_type == "qwen3_moe",
               ConfigError, "Llama config: model_type '{}' is not llama, qwen3 or qwen3_moe",
               model_type);
  SSHSDP_CHECK((model_type == "qwen3_moe") == IsMoe(), ConfigError,
               "Llama config: model_type {} with {} experts (qwen3_moe has experts, the others "
               "none)",
               model_type, n_expert);
  if (IsMoe()) {
    SSHSDP_CHECK(top_k >= 1 && top_k <= n_expert && d_expert > 0 && sparse_step >= 1, ConfigError,
                 "Llama config: need 1 <= num_experts_per_tok ({}) <= num_experts ({}), "
                 "moe_intermediate_size {} > 0 and decoder_sparse_step {} >= 1",
                 top_k, n_expert, d_expert, sparse_step);
    bool any = false;
    for (int l = 0; l < n_layer; ++l) any = any || IsMoeLayer(l);
    SSHSDP_CHECK(any, ConfigError,
                 "Llama config: no block is a mixture of experts (mlp_only_layers and "
                 "decoder_sparse_step {} leave none)",
                 sparse_step);
  }
  SSHSDP_CHECK(vocab > 0 && vocab_multiple > 0 && seq_len > 0 && d_model > 0 && n_layer > 0 &&
                   n_head > 0 && n_kv_head > 0 && head_dim > 0 && d_ff > 0,
               ConfigError,
               "Llama config sizes must be positive: vocab={} seq_len={} hidden_size={} "
               "num_hidden_layers={} num_attention_heads={} num_key_value_heads={} head_dim={} "
               "intermediate_size={}",
               vocab, seq_len, d_model, n_layer, n_head, n_kv_head, head_dim, d_ff);
  SSHSDP_CHECK(n_head % n_kv_head == 0, ConfigError,
               "Llama config: num_key_value_heads {} does not divide num_attention_heads {}",
               n_kv_head, n_head);
  SSHSDP_CHECK(head_dim % 2 == 0 && head_dim <= 1024, ConfigError,
               "Llama config: head_dim {} is odd or above 1,024 (RoPE rotates pairs of "
               "dimensions; sshsdp's RoPE kernel takes heads up to 1,024 wide)",
               head_dim);
  SSHSDP_CHECK(vocab <= (1 << 24), ConfigError,
               "Llama config: vocab {} is larger than 16,777,216 tokens", vocab);
  SSHSDP_CHECK(rope_theta > 0 && norm_eps > 0, ConfigError,
               "Llama config: rope_theta {} and rms_norm_eps {} must be positive", rope_theta,
               norm_eps);
}

Llama::Llama(const LlamaConfig& config) : Llama(config, MakeCpuBackend()) {}

Llama::Llama(const LlamaConfig& config, std::unique_ptr<Backend> own) : Llama(config, *own) {
  own_ = std::move(own);
}

Llama::Llama(const LlamaConfig& config, Backend& backend) : Llama(config, backend, {}) {}

Llama::Llama(const LlamaConfig& config, Backend& backend, std::vector<bool> mlp)
    : b_(backend),
      c_(config),
      tokens_(b_),
      rope_(b_),
      gains_(b_),
      dgains_(b_),
      scratch_(b_),
      round16_{BackendBuffer(b_), BackendBuffer(b_)},
      arena_(b_),
      losses_(b_) {
  Init(std::move(mlp));
}

void Llama::Init(std::vector<bool> mlp) {
  c_.Validate();
  SSHSDP_CHECK(mlp.empty() || static_cast<int>(mlp.size()) == c_.n_layer, ConfigError,
               "Llama trunk: {} MLP flags for {} blocks", mlp.size(), c_.n_layer);
  SSHSDP_CHECK(!mlp.empty() || !c_.IsMoe(), ConfigError,
               "a qwen3_moe config is a mixture of experts: build MoeGpt(MoeConfigOf(config)) "
               "(moe.h), not the dense Llama");
  for (int l = 0; l < c_.n_layer; ++l)
    mlp_slot_.push_back(mlp.empty() || mlp[static_cast<size_t>(l)] ? mlp_blocks_++ : -1);
  SSHSDP_CHECK(b_.Has(BackendFeature::kRope), ConfigError,
               "Llama-family model on backend {}: it has no {}; use --backend cpu", b_.name(),
               BackendFeatureName(BackendFeature::kRope));
  SSHSDP_CHECK(c_.head_dim <= b_.max_attention_head_dim(), ConfigError,
               "Llama-family model: {}'s attention takes head widths up to {}, head_dim is {}; "
               "use --backend cpu",
               b_.name(), b_.max_attention_head_dim(), c_.head_dim);
  if (c_.qk_norm) {
    bv_ = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  }
  bf16_attention_ = c_.bf16_attention && b_.Has(BackendFeature::kBf16Attention);
  const kernels::RopeTables t = kernels::MakeRopeTables(c_.seq_len, c_.head_dim, c_.rope_theta);
  float* tab = rope_.Reserve<float>(static_cast<int64_t>(2 * t.cos.size()));
  b_.CopyIn(tab, t.cos.data(), t.cos.size() * sizeof(float));
  b_.CopyIn(tab + t.cos.size(), t.sin.data(), t.sin.size() * sizeof(float));
  const int64_t wide = std::max<int64_t>(c_.d_model, c_.head_dim);
  gains_.Reserve<float>(3 * wide);
  dgains_.Reserve<float>(c_.d_model + 2 * c_.head_dim);
}

std::vector<RuntimeParamSpec> Llama::GroupParams(int g) const {
  SSHSDP_CHECK(g >= 0 && g < num_groups(), PlanError, "Llama has groups 0..{}, asked for {}",
               num_groups() - 1, g);
  const int64_t V = c_.vocab, Vp = c_.padded_vocab(), d = c_.d_model, ff = c_.d_ff,
                dh = c_.head_dim;
  const InitSpec w = Normal(0.02f);  // transformers' initializer_range
  InitSpec table = w;
  if (Vp > V) table.zero_from = V * d;  // padded rows start (and stay) zero
  if (g == 0) return {Single("embed_tokens", {Vp, d}, UpdateKind::kEmbedding, table)};
  if (g == num_groups() - 1 && c_.tied) return {Single("norm", {d}, UpdateKind::kVector, kOnes)};
  if (g == num_groups() - 1)
    return {Single("norm", {d}, UpdateKind::kVector, kOnes),
            Single("lm_head", {Vp, d}, UpdateKind::kEmbedding, table)};
  const std::string p = fmt::format("layers.{}.", g - 1);
  std::vector<RuntimeParamSpec> out;
  out.push_back(Single(p + "input_layernorm", {d}, UpdateKind::kVector, kOnes));
  RuntimeParamSpec qkv{p + "self_attn.qkv", {c_.qkv_rows(), d}, {}};
  if (c_.fused_qkv) qkv.parts.push_back({qkv.name, qkv.shape, 0, UpdateKind::kMatrix, w});
  int64_t offset = 0;
  for (const char* which : {"q", "k", "v"}) {
    if (c_.fused_qkv) break;
    const int heads = which[0] == 'q' ? c_.n_head : c_.n_kv_head;
    for (int h = 0; h < heads; ++h) {
      qkv.parts.push_back(UpdatePart{fmt::format("{}self_attn.{}_proj.h{}", p, which, h),
                                     {dh, d},
                                     offset,
                                     UpdateKind::kMatrix,
                                     w});
      offset += dh * d;
    }
  }
  out.push_back(std::move(qkv));
  if (c_.qk_norm) {
    out.push_back(Single(p + "self_attn.q_norm", {dh}, UpdateKind::kVector, kOnes));
    out.push_back(Single(p + "self_attn.k_norm", {dh}, UpdateKind::kVector, kOnes));
  }
  out.push_back(Single(p + "self_attn.o_proj", {d, c_.q_dim()}, UpdateKind::kMatrix, w));
  out.push_back(Single(p + "post_attention_layernorm", {d}, UpdateKind::kVector, kOnes));
  out.push_back(Single(p + "mlp.gate_proj", {ff, d}, UpdateKind::kMatrix, w));
  out.push_back(Single(p + "mlp.up_proj", {ff, d}, UpdateKind::kMatrix, w));
  out.push_back(Single(p + "mlp.down_proj", {d, ff}, UpdateKind::kMatrix, w));
  return out;
}

void Llama::SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) {
  SSHSDP_CHECK(B > 0 && T > 0 && T <= c_.seq_len, ConfigError,
               "Llama batch B={} T={} invalid (need B > 0 and 0 < T <= seq_len {})", B, T,
               c_.seq_len);
  const int64_t BT = static_cast<int64_t>(B) * T;
  for (int64_t i = 0; i < BT; ++i) {
    SSHSDP_CHECK(tokens[i] >= 0 && tokens[i] < c_.vocab && targets[i] >= 0 && targets[i] < c_.vocab,
                 ConfigError, "Llama batch position {}: token {} / target {} outside vocab {}", i,
                 tokens[i], targets[i], c_.vocab);
  }
  int32_t* tok = tokens_.Reserve<int32_t>(2 * BT);
  b_.Upload(tok, tokens, static_cast<size_t>(BT) * sizeof(int32_t));
  b_.Upload(tok + BT, targets, static_cast<size_t>(BT) * sizeof(int32_t));
  B_ = B, T_ = T;
  SizeArena();
  order_.Reset(num_groups());
  loss_ready_ = false;
}

// One allocation, each tensor 64-byte aligned.
void Llama::SizeArena() {
  const int64_t BT = static_cast<int64_t>(B_) * T_, L = c_.n_layer, d = c_.d_model, ff = c_.d_ff,
                V = c_.padded_vocab(), qd = c_.q_dim(), rw = c_.qkv_rows(), aw = 3 * qd,
                nh = c_.qk_norm ? c_.n_head + c_.n_kv_head : 0, M = mlp_blocks_;
  float** slots[] = {
      &acts_.residual, &acts_.ln1,   &acts_.ln1_rstd, &acts_.raw,     &acts_.qk_rstd,
      &acts_.att,      &acts_.lse,   &acts_.atty,     &acts_.res_mid, &acts_.ln2,
      &acts_.ln2_rstd, &acts_.h1,    &acts_.h3,       &acts_.act,     &acts_.lnf,
      &acts_.lnf_rstd, &acts_.probs, &acts_.losses,   &acts_.dres,    &acts_.dtmp,
      &acts_.datt,     &acts_.draw,  &acts_.dh1,      &acts_.dh3,     &acts_.dlogits};
  const int64_t sizes[] = {(L + 1) * BT * d,
                           L * BT * d,
                           L * BT,
                           L * BT * rw,
                           L * BT * nh,
                           L * BT * aw,
                           L * B_ * c_.n_head * int64_t{T_},
                           L * BT * qd,
                           L * BT * d,
                           L * BT * d,
                           L * BT,
                           M * BT * ff,
                           M * BT * ff,
                           M * BT * ff,
                           BT * d,
                           BT,
                           BT * V,
                           BT,
                           BT * d,
                           BT * std::max(d, qd),
                           BT * aw,
                           BT * rw,
                           M > 0 ? BT * ff : 0,
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
}

void Llama::CheckViews(int g, const std::vector<TensorRef>& v, const char* what) const {
  const size_t want = g == 0 ? 1 : g == num_groups() - 1 ? 2 : static_cast<size_t>(bv_.count);
  SSHSDP_CHECK(v.size() == want, PlanError, "Llama group {}: got {} {} views, expected {}", g,
               v.size(), what, want);
  const bool block = g > 0 && g + 1 < num_groups();
  for (size_t i = 0; i < v.size(); ++i) {
    const bool mx = block && kernels::IsMxElement(v[i].dtype) && v[i].scales != nullptr &&
                    std::string_view(what) == "weight";
    SSHSDP_CHECK(v[i].data != nullptr && (layers::IsFloatType(v[i].dtype) || mx), PlanError,
                 "Llama group {}: {} view {} must be non-null fp32 or bf16 (MXFP8 with scales for "
                 "block weights) (got {})",
                 g, what, i, DTypeName(v[i].dtype));
  }
}

const float* Llama::Gain(const TensorRef& t, int n, int slot) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  float* out = gains_.data<float>() + slot * std::max(c_.d_model, c_.head_dim);
  if (kernels::IsMxElement(t.dtype)) {  // an MX vector: [1, n] with its own scales
    b_.MxDequantizeOperand(static_cast<const uint8_t*>(t.data), t.dtype, t.scales, t.scale_layout,
                           1, n, out);
  } else {
    b_.CastBf16ToF32(static_cast<const bf16*>(t.data), out, n);
  }
  return out;
}

bool Llama::Bf16Attention(const std::vector<TensorRef>& w) const {
  return bf16_attention_ && w[static_cast<size_t>(bv_.qkv)].dtype == DType::kBF16;
}

kernels::LinearInput Llama::Shared(const float* x, int64_t n, const TensorRef& w, int slot) {
  if (w.dtype != DType::kBF16) return x;
  bf16* y = round16_[slot].Reserve<bf16>(n);
  b_.CastF32ToBf16(x, y, n);
  return kernels::LinearInput(static_cast<const bf16*>(y));
}

kernels::RopeShape Llama::Shape() const { return {B_, T_, c_.n_head, c_.n_kv_head, c_.head_dim}; }

void Llama::Forward(int g, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(B_ > 0, PlanError, "Llama Forward({}) before SetBatch", g);
  order_.StartForward(g);
  CheckViews(g, w, "weight");
  if (g == 0) {
    ForwardEmbedding(w);
  } else if (g == num_groups() - 1) {
    ForwardHead(w);
  } else {
    ForwardBlock(g - 1, w);
  }
  order_.EndForward(g);
}

double Llama::Loss() const {
  SSHSDP_CHECK(loss_ready_, PlanError, "Llama Loss() before the last group's Forward");
  return losses_.Mean(static_cast<int64_t>(B_) * T_);
}

void Llama::KeepLoss() {
  SSHSDP_CHECK(loss_ready_, PlanError, "Llama KeepLoss() before the last group's Forward");
  losses_.Keep(static_cast<int64_t>(B_) * T_);
}

std::vector<double> Llama::TakeLosses() { return losses_.Take(); }

void Llama::Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                     GradWrite mode) {
  order_.StartBackward(g);
  CheckViews(g, w, "weight");
  CheckViews(g, grad, "gradient");
  const bool acc = mode == GradWrite::kAccumulate;
  if (g == num_groups() - 1) {
    BackwardHead(w, grad, acc);
  } else if (g == 0) {
    SSHSDP_CHECK(acc || !c_.tied, PlanError,
                 "Llama Backward(0) with tied embeddings: the table's gradient holds the LM "
                 "head's; pass GradWrite::kAccumulate (Model::TiesFirstGroup)");
    BackwardEmbedding(grad, acc);
  } else {
    BackwardBlock(g - 1, w, grad, acc);
  }
  order_.EndBackward(g);
}

void Llama::ForwardEmbedding(const std::vector<TensorRef>& w) {
  OpScope s(profile_, OpCategory::kEmbedding);
  loss_ready_ = false;
  b_.EmbeddingForwardTyped(w[0].data, nullptr, w[0].dtype, tokens_.data<int32_t>(), B_, T_,
                           c_.d_model, c_.padded_vocab(), 0, acts_.residual);
}

float* Llama::Ln2(int l) const { return acts_.ln2 + l * int64_t{B_} * T_ * c_.d_model; }
float* Llama::ResMid(int l) const { return acts_.res_mid + l * int64_t{B_} * T_ * c_.d_model; }
float* Llama::BlockOut(int l) const {
  return acts_.residual + (l + 1) * int64_t{B_} * T_ * c_.d_model;
}

double Llama::AttentionWeights() const {
  return static_cast<double>(c_.qkv_rows() + c_.q_dim()) * c_.d_model;
}

void Llama::ForwardBlock(int l, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(mlp_slot_[static_cast<size_t>(l)] >= 0, PlanError,
               "Llama block {} has no dense MLP (a trunk's block): the model built on the trunk "
               "runs it",
               l);
  ForwardAttention(l, w);
  ForwardMlp(l, w);
}

void Llama::BackwardBlock(int l, const std::vector<TensorRef>& w,
                          const std::vector<TensorRef>& grad, bool acc) {
  SSHSDP_CHECK(mlp_slot_[static_cast<size_t>(l)] >= 0, PlanError,
               "Llama block {} has no dense MLP (a trunk's block): the model built on the trunk "
               "runs it",
               l);
  BackwardMlp(l, w, grad, acc);
  BackwardAttention(l, w, grad, acc);
}

void Llama::ForwardAttention(int l, const std::vector<TensorRef>& w) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, qd = c_.q_dim();
  const float* x = acts_.residual + l * BT * d;
  float* ln1 = acts_.ln1 + l * BT * d;
  float* raw = acts_.raw + l * BT * c_.qkv_rows();
  float* att = acts_.att + l * BT * 3 * qd;
  float* lse = acts_.lse + l * B_ * c_.n_head * int64_t{T_};
  float* atty = acts_.atty + l * BT * qd;
  float* res_mid = acts_.res_mid + l * BT * d;
  const BlockViews& v = bv_;
  if (w[v.qkv].dtype == DType::kBF16 || w[v.o].dtype == DType::kBF16) {  // Shared, before backward
    round16_[0].Reserve<bf16>(BT * std::max({int64_t{c_.d_ff}, c_.qkv_rows(), d}));
    round16_[1].Reserve<bf16>(BT * d);
  }
  {
    OpScope s(profile_, OpCategory::kNorm);
    b_.RmsNormForward(x, Gain(w[v.ln1], c_.d_model, 0), ln1, acts_.ln1_rstd + l * BT, BT,
                      c_.d_model, c_.norm_eps);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearForward(ln1, View(w[v.qkv]), raw, BT, c_.qkv_rows(), d);
  }
  {
    OpScope s(profile_, OpCategory::kAttention);
    const float* qg = c_.qk_norm ? Gain(w[v.q_norm], c_.head_dim, 1) : nullptr;
    const float* kg = c_.qk_norm ? Gain(w[v.k_norm], c_.head_dim, 2) : nullptr;
    const float* cos = rope_.data<float>();
    const float* sin = cos + int64_t{c_.seq_len} * c_.head_dim / 2;
    float* rstd = c_.qk_norm ? acts_.qk_rstd + l * BT * (c_.n_head + c_.n_kv_head) : nullptr;
    b_.RopeQkvForward(raw, cos, sin, qg, kg, c_.norm_eps, att, rstd, Shape());
    if (Bf16Attention(w)) {
      const int64_t n = b_.AttentionBf16ScratchFloats(B_, T_, c_.n_head, c_.head_dim);
      float* scratch = scratch_.Reserve<float>(n);
      b_.CausalAttentionForwardBf16(att, atty, lse, scratch, scratch_.bytes() / 4, B_, T_,
                                    c_.n_head, c_.head_dim);
    } else {
      b_.CausalAttentionForward(att, atty, lse, B_, T_, c_.n_head, c_.head_dim);
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearForward(atty, View(w[v.o]), res_mid, BT, d, qd);
  }
  {
    OpScope s(profile_, OpCategory::kElementwise);
    b_.Add(x, res_mid, res_mid, BT * d);
  }
  {
    OpScope s(profile_, OpCategory::kNorm);
    b_.RmsNormForward(res_mid, Gain(w[v.ln2], c_.d_model, 0), acts_.ln2 + l * BT * d,
                      acts_.ln2_rstd + l * BT, BT, c_.d_model, c_.norm_eps);
  }
}

void Llama::ForwardMlp(int l, const std::vector<TensorRef>& w) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, ff = c_.d_ff;
  const float* ln2 = acts_.ln2 + l * BT * d;
  const int64_t at = mlp_slot_[static_cast<size_t>(l)] * BT * ff;  // block l's MLP slot
  float* h1 = acts_.h1 + at;
  float* h3 = acts_.h3 + at;
  float* act = acts_.act + at;
  float* out = acts_.residual + (l + 1) * BT * d;
  {
    OpScope s(profile_, OpCategory::kGemm);
    const kernels::LinearInput x = w[bv_.gate].dtype == w[bv_.up].dtype
                                       ? Shared(ln2, BT * d, w[bv_.gate], 1)
                                       : kernels::LinearInput(ln2);
    b_.LinearForward(x, View(w[bv_.gate]), h1, BT, ff, d);
    b_.LinearForward(x, View(w[bv_.up]), h3, BT, ff, d);
  }
  {
    OpScope s(profile_, OpCategory::kActivation);
    b_.SwigluForward(h1, h3, act, BT * ff);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearForward(act, View(w[bv_.down]), out, BT, d, ff);
  }
  OpScope s(profile_, OpCategory::kElementwise);
  b_.Add(acts_.res_mid + l * BT * d, out, out, BT * d);
}

void Llama::ForwardHead(const std::vector<TensorRef>& w) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, V = c_.padded_vocab();
  const float* x = acts_.residual + c_.n_layer * BT * d;
  {
    OpScope s(profile_, OpCategory::kNorm);
    b_.RmsNormForward(x, Gain(w[0], c_.d_model, 0), acts_.lnf, acts_.lnf_rstd, BT, c_.d_model,
                      c_.norm_eps);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearForward(acts_.lnf, View(w[1]), acts_.probs, BT, V, d);
  }
  OpScope s(profile_, OpCategory::kLoss);
  b_.SoftmaxCrossEntropyForward(acts_.probs, tokens_.data<int32_t>() + BT, acts_.losses, BT,
                                c_.vocab, V, losses_.Sum());
  loss_ready_ = true;
}

void Llama::NormBackward(const float* x, const TensorRef& gain, const float* rstd,
                         const TensorRef& grad, bool acc, bool accumulate_dx) {
  OpScope s(profile_, OpCategory::kNorm);
  const int64_t BT = static_cast<int64_t>(B_) * T_;
  float* dg = dgains_.data<float>();
  b_.RmsNormBackward(acts_.dtmp, x, Gain(gain, c_.d_model, 0), rstd, acts_.dres, dg, BT, c_.d_model,
                     accumulate_dx);
  b_.WriteOrAccumulate(dg, grad.data, grad.dtype, c_.d_model, acc);
}

void Llama::BackwardHead(const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                         bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, V = c_.padded_vocab();
  kernels::LinearInput dlogits = acts_.dlogits;
  {
    OpScope s(profile_, OpCategory::kLoss);
    const float scale = static_cast<float>(1.0 / static_cast<double>(BT));
    const int32_t* targets = tokens_.data<int32_t>() + BT;
    if (w[1].dtype == DType::kBF16) {  // rounded once for both products, into its own slot
      bf16* d16 = reinterpret_cast<bf16*>(acts_.dlogits);
      b_.SoftmaxCrossEntropyBackwardBf16(acts_.probs, targets, d16, BT, V, scale);
      dlogits = kernels::LinearInput(static_cast<const bf16*>(d16));
    } else {
      b_.SoftmaxCrossEntropyBackward(acts_.probs, targets, acts_.dlogits, BT, V, scale);
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    b_.LinearBackwardWeight(dlogits, acts_.lnf, kernels::LinearComputeDType(w[1].dtype),
                            grad[1].data, grad[1].dtype, BT, V, d, acc);
    b_.LinearBackwardData(dlogits, View(w[1]), acts_.dtmp, BT, V, d, false);
  }
  NormBackward(acts_.residual + c_.n_layer * BT * d, w[0], acts_.lnf_rstd, grad[0], acc,
               /*accumulate_dx=*/false);
}

// out = res_mid + down(silu(gate(ln2)) · up(ln2)); from dres = ∂/∂out, dtmp = ∂/∂ln2.
void Llama::BackwardMlp(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                        bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, ff = c_.d_ff;
  const float* ln2 = acts_.ln2 + l * BT * d;
  const int64_t at = mlp_slot_[static_cast<size_t>(l)] * BT * ff;
  const float* h1 = acts_.h1 + at;
  const float* h3 = acts_.h3 + at;
  const float* act = acts_.act + at;
  const BlockViews& v = bv_;
  auto dw = [&](kernels::LinearInput dy, kernels::LinearInput x, int i, int64_t n, int64_t k) {
    b_.LinearBackwardWeight(dy, x, kernels::LinearComputeDType(w[static_cast<size_t>(i)].dtype),
                            grad[static_cast<size_t>(i)].data, grad[static_cast<size_t>(i)].dtype,
                            BT, n, k, acc);
  };
  // Each gradient rounded once for its two products (Shared), ln2 once for gate's and up's.
  {
    OpScope s(profile_, OpCategory::kGemm);
    const kernels::LinearInput dy = Shared(acts_.dres, BT * d, w[v.down], 0);
    dw(dy, act, v.down, d, ff);
    b_.LinearBackwardData(dy, View(w[v.down]), acts_.dh1, BT, d, ff, false);
  }
  {
    OpScope s(profile_, OpCategory::kActivation);
    b_.SwigluBackward(h1, h3, acts_.dh1, acts_.dh1, acts_.dh3, BT * ff);
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    const kernels::LinearInput x = w[v.gate].dtype == w[v.up].dtype
                                       ? Shared(ln2, BT * d, w[v.gate], 1)
                                       : kernels::LinearInput(ln2);
    kernels::LinearInput dy = Shared(acts_.dh1, BT * ff, w[v.gate], 0);
    dw(dy, x, v.gate, ff, d);
    b_.LinearBackwardData(dy, View(w[v.gate]), acts_.dtmp, BT, ff, d, false);
    dy = Shared(acts_.dh3, BT * ff, w[v.up], 0);
    dw(dy, x, v.up, ff, d);
    b_.LinearBackwardData(dy, View(w[v.up]), acts_.dtmp, BT, ff, d, true);
  }
}

// From dtmp = ∂/∂ln2 and dres = ∂/∂out: dres = ∂/∂x. out = res_mid + MLP(ln2(res_mid)),
// res_mid = x + o(attention(rope(qkv(ln1(x))))).
void Llama::BackwardAttention(int l, const std::vector<TensorRef>& w,
                              const std::vector<TensorRef>& grad, bool acc) {
  const int64_t BT = static_cast<int64_t>(B_) * T_, d = c_.d_model, qd = c_.q_dim(),
                rw = c_.qkv_rows();
  const float* ln1 = acts_.ln1 + l * BT * d;
  const float* raw = acts_.raw + l * BT * rw;
  const float* att = acts_.att + l * BT * 3 * qd;
  const float* lse = acts_.lse + l * B_ * c_.n_head * int64_t{T_};
  const float* atty = acts_.atty + l * BT * qd;
  const BlockViews& v = bv_;
  NormBackward(acts_.res_mid + l * BT * d, w[v.ln2], acts_.ln2_rstd + l * BT, grad[v.ln2], acc,
               true);
  {
    OpScope s(profile_, OpCategory::kGemm);
    const kernels::LinearInput dy = Shared(acts_.dres, BT * d, w[v.o], 0);
    b_.LinearBackwardWeight(dy, atty, kernels::LinearComputeDType(w[v.o].dtype), grad[v.o].data,
                            grad[v.o].dtype, BT, d, qd, acc);
    b_.LinearBackwardData(dy, View(w[v.o]), acts_.dtmp, BT, d, qd, false);
  }
  {
    OpScope s(profile_, OpCategory::kAttention);
    if (Bf16Attention(w)) {
      const int64_t n = b_.AttentionBf16ScratchFloats(B_, T_, c_.n_head, c_.head_dim);
      float* scratch = scratch_.Reserve<float>(n);
      b_.CausalAttentionBackwardBf16(acts_.dtmp, att, atty, lse, acts_.datt, scratch,
                                     scratch_.bytes() / 4, B_, T_, c_.n_head, c_.head_dim);
    } else {
      b_.CausalAttentionBackward(acts_.dtmp, att, atty, lse, acts_.datt, B_, T_, c_.n_head,
                                 c_.head_dim);
    }
    const float* cos = rope_.data<float>();
    const float* sin = cos + int64_t{c_.seq_len} * c_.head_dim / 2;
    const float* qg = c_.qk_norm ? Gain(w[v.q_norm], c_.head_dim, 1) : nullptr;
    const float* kg = c_.qk_norm ? Gain(w[v.k_norm], c_.head_dim, 2) : nullptr;
    const float* rstd = c_.qk_norm ? acts_.qk_rstd + l * BT * (c_.n_head + c_.n_kv_head) : nullptr;
    float* dqg = dgains_.data<float>() + c_.d_model;
    float* dkg = dqg + c_.head_dim;
    b_.RopeQkvBackward(acts_.datt, raw, cos, sin, qg, kg, rstd, acts_.draw,
                       c_.qk_norm ? dqg : nullptr, c_.qk_norm ? dkg : nullptr, Shape());
    if (c_.qk_norm) {
      b_.WriteOrAccumulate(dqg, grad[v.q_norm].data, grad[v.q_norm].dtype, c_.head_dim, acc);
      b_.WriteOrAccumulate(dkg, grad[v.k_norm].data, grad[v.k_norm].dtype, c_.head_dim, acc);
    }
  }
  {
    OpScope s(profile_, OpCategory::kGemm);
    const kernels::LinearInput dy = Shared(acts_.draw, BT * rw, w[v.qkv], 0);
    b_.LinearBackwardWeight(dy, ln1, kernels::LinearComputeDType(w[v.qkv].dtype), grad[v.qkv].data,
                            grad[v.qkv].dtype, BT, rw, d, acc);
    b_.LinearBackwardData(dy, View(w[v.qkv]), acts_.dtmp, BT, rw, d, false);
  }
  NormBackward(acts_.residual + l * BT * d, w[v.ln1], acts_.ln1_rstd + l * BT, grad[v.ln1], acc,
               true);
}

void Llama::BackwardEmbedding(const std::vector<TensorRef>& grad, bool acc) {
  OpScope s(profile_, OpCategory::kEmbedding);
  const int64_t n = grad[0].dtype == DType::kF32 ? 0 : int64_t{c_.padded_vocab()} * c_.d_model;
  float* scratch = scratch_.Reserve<float>(n);
  b_.EmbeddingBackwardTyped(acts_.dres, tokens_.data<int32_t>(), B_, T_, c_.d_model, grad[0].data,
                            grad[0].dtype, c_.padded_vocab(), nullptr, DType::kF32, 0, acc,
                            scratch);
}

double Llama::FlopsPerToken() const {
  const double n_gemm =
      c_.n_layer * AttentionWeights() + mlp_blocks_ * DenseMlpWeights() + HeadWeights();
  return 6.0 * n_gemm + AttentionFlopsPerToken(T_ > 0 ? T_ : c_.seq_len);
}

int64_t Llama::ActivationBytes() const {
  return arena_.bytes() + scratch_.bytes() + gains_.bytes() + dgains_.bytes() + rope_.bytes() +
         round16_[0].bytes() + round16_[1].bytes();
}

}  // namespace sshsdp
