// Reference MoE GPT (see moe.h): the model definition — MoeConfig names, presets and
// validation, the runtime groups and their parameter specs (packed [E, out, in] expert
// weights with per-expert update parts), the MoE blocks' activation arena, view checks, the
// loss and routing accessors, and the FLOP / memory estimates. The compute is split by
// concern, llm.c style (backend ops over activations in the arena):
//   moe_groups.cc   per-group Forward/Backward dispatch onto the trunk (Gpt's pieces: the
//                   embeddings, attention, dense MLP blocks, head) and the MoE MLP;
//   moe_router.cc   router logits, top-k gating, load-balancing aux loss, token permutation;
//   moe_experts.cc  grouped expert GEMMs, shared expert, un-permutation.
#include "sshsdp/models/moe.h"

#include <algorithm>
#include <cmath>

#include <utility>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/mx_linear.h"
#include "sshsdp/models/layers.h"
#include "sshsdp/models/size_limits.h"

namespace sshsdp {
namespace {

using layers::IsFloatType;
using layers::Normal;
using layers::Single;

// Which blocks keep the trunk's dense MLP.
std::vector<bool> DenseBlocks(const MoeConfig& c) {
  std::vector<bool> dense;
  for (int l = 0; l < c.trunk.n_layer; ++l) dense.push_back(!c.IsMoeLayer(l));
  return dense;
}

std::unique_ptr<Trunk> MakeTrunk(const MoeConfig& c, Backend& b) {
  c.Validate();
  if (c.llama) return std::make_unique<Llama>(*c.llama, b, DenseBlocks(c));
  return std::make_unique<Gpt>(c.trunk, b, DenseBlocks(c));
}

}  // namespace

const char* GatingName(Gating g) { return g == Gating::kSoftmax ? "softmax" : "sigmoid"; }
const char* ExpertMlpName(ExpertMlp m) { return m == ExpertMlp::kSwiGLU ? "swiglu" : "gelu"; }

Gating ParseGating(std::string_view s) {
  if (s == "softmax") return Gating::kSoftmax;
  if (s == "sigmoid") return Gating::kSigmoid;
  throw ConfigError(fmt::format("unknown MoE gating '{}': use softmax or sigmoid", s));
}

ExpertMlp ParseExpertMlp(std::string_view s) {
  if (s == "swiglu") return ExpertMlp::kSwiGLU;
  if (s == "gelu") return ExpertMlp::kGelu;
  throw ConfigError(fmt::format("unknown expert MLP '{}': use swiglu or gelu", s));
}

MoeConfig MoeConfig::Preset(std::string_view name) {
  MoeConfig c;
  if (name == "moe-tiny") {
    c.trunk = GptConfig::Preset("tiny");
    c.n_expert = 4, c.top_k = 2, c.d_expert = 128;
  } else if (name == "moe-small") {
    c.trunk = GptConfig::Preset("small");
    c.n_expert = 8, c.top_k = 2, c.d_expert = 256;
  } else {
    throw ConfigError(fmt::format("unknown MoE preset '{}': use moe-tiny or moe-small", name));
  }
  return c;
}

MoeConfig MoeConfigOf(const LlamaConfig& c) {
  MoeConfig m;
  m.llama = c;
  m.trunk.vocab = c.vocab, m.trunk.vocab_multiple = c.vocab_multiple, m.trunk.seq_len = c.seq_len;
  m.trunk.d_model = c.d_model, m.trunk.n_layer = c.n_layer, m.trunk.n_head = c.n_head;
  m.trunk.d_ff = c.d_ff;
  m.n_expert = c.n_expert, m.top_k = c.top_k, m.d_expert = c.d_expert;
  for (int l = 0; l < c.n_layer; ++l)
    if (c.IsMoeLayer(l)) m.moe_layers.push_back(l);
  m.gating = Gating::kSoftmax;
  m.renormalize = c.norm_topk_prob;
  m.expert_mlp = ExpertMlp::kSwiGLU;
  // transformers adds its pooled load-balancing loss only with output_router_logits.
  m.aux_loss_weight = c.output_router_logits ? static_cast<float>(c.router_aux_loss_coef) : 0.0f;
  m.aux_pooled = true;
  m.Validate();
  return m;
}

std::unique_ptr<Model> MakeLlamaFamilyModel(const LlamaConfig& c, Backend* backend,
                                            bool expert_group) {
  if (!c.IsMoe())
    return backend ? std::make_unique<Llama>(c, *backend) : std::make_unique<Llama>(c);
  MoeConfig m = MoeConfigOf(c);
  m.expert_group = expert_group;  // MXFP8: the experts in groups of their own (moe.h)
  return backend ? std::make_unique<MoeGpt>(m, *backend) : std::make_unique<MoeGpt>(m);
}

bool MoeConfig::IsMoeLayer(int l) const {
  if (!moe_layers.empty())
    return std::find(moe_layers.begin(), moe_layers.end(), l) != moe_layers.end();
  return moe_every > 0 && l % moe_every == moe_every - 1;
}

void MoeConfig::Validate() const {
  if (llama) {
    llama->Validate();
    SSHSDP_CHECK(trunk.n_layer == llama->n_layer && trunk.d_model == llama->d_model &&
                     trunk.vocab == llama->vocab,
                 ConfigError, "MoE config: the trunk summary differs from the Llama config");
  } else {
    trunk.Validate();
    SSHSDP_CHECK(trunk.packed_qkv, ConfigError,
                 "MoE config: the MoE GPT runs the packed QKV projection only "
                 "(trunk.packed_qkv = false, per-part QKV, is the dense GPT's veScale mode)");
  }
  SSHSDP_CHECK(trunk.mx_gemm == DType::kF32, ConfigError,
               "MoE config: MXFP8 experts are dequantized for fp32 GEMMs (trunk.mx_gemm bf16 "
               "is the dense GPT's)");
  CheckDimensions("MoE config", {{"experts", n_expert, kMaxHeadsOrExperts},
                                 {"expert width", d_expert, kMaxFfnWidth},
                                 {"shared expert width", d_shared, kMaxFfnWidth}});
  SSHSDP_CHECK(n_expert >= 1 && top_k >= 1 && top_k <= n_expert, ConfigError,
               "MoE config: need 1 <= top_k ({}) <= experts ({})", top_k, n_expert);
  SSHSDP_CHECK(
      d_expert >= 0 && d_shared >= 0, ConfigError,
      "MoE config: expert width {} / shared expert width {} must be >= 0 (0: the preset default)",
      d_expert, d_shared);
  SSHSDP_CHECK(expert_ff() > 0 && shared_ff() > 0, ConfigError,
               "MoE config: expert width {} and shared expert width {} must be positive",
               expert_ff(), shared_ff());
  SSHSDP_CHECK(moe_every >= 1, ConfigError, "MoE config: moe_every must be >= 1, got {}",
               moe_every);
  for (int l : moe_layers) {
    SSHSDP_CHECK(l >= 0 && l < trunk.n_layer, ConfigError,
                 "MoE config: moe_layers names block {}, the model has blocks 0..{}", l,
                 trunk.n_layer - 1);
  }
  SSHSDP_CHECK(std::isfinite(aux_loss_weight) && aux_loss_weight >= 0.0f, ConfigError,
               "MoE config: aux_loss_weight must be finite and >= 0, got {}", aux_loss_weight);
  bool any = false;
  for (int l = 0; l < trunk.n_layer; ++l) any = any || IsMoeLayer(l);
  SSHSDP_CHECK(any, ConfigError,
               "MoE config selects no MoE block (moe_every {} with {} blocks): use the dense GPT",
               moe_every, trunk.n_layer);
}

MoeGpt::MoeGpt(const MoeConfig& config) : MoeGpt(config, MakeCpuBackend()) {}

// The buffers bind to *own, which keeps its address when own_ takes it over.
MoeGpt::MoeGpt(const MoeConfig& config, std::unique_ptr<Backend> own) : MoeGpt(config, *own) {
  own_ = std::move(own);
}

MoeGpt::MoeGpt(const MoeConfig& config, Backend& backend)
    : b_(backend),
      c_(config),
      trunk_(MakeTrunk(config, backend)),
      arena_(backend),
      wgrad_scratch_(backend) {
  if (!c_.llama) c_.trunk = static_cast<const Gpt&>(*trunk_).config();  // d_ff resolved
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  slots_.router = trunk_->AttentionViews();
  slots_.w1 = slots_.router + 1;
  slots_.w2 = slots_.router + 2;
  int next = slots_.router + 3;
  if (swiglu) slots_.w3 = next++;
  if (c_.shared_expert) {
    slots_.s1 = next++;
    slots_.s2 = next++;
    if (swiglu) slots_.s3 = next++;
  }
  slots_.count = next;
  for (int i = slots_.w1; i < slots_.count; ++i)
    mx_scratch_.push_back(std::make_unique<BackendBuffer>(b_));
  roles_.push_back({Role::kEmbed, -1});
  for (int l = 0; l < c_.trunk.n_layer; ++l) {
    first_group_.push_back(static_cast<int>(roles_.size()));
    if (!c_.IsMoeLayer(l)) {
      roles_.push_back({Role::kDense, l});
    } else if (!c_.expert_group) {
      roles_.push_back({Role::kMoe, l});
    } else {
      roles_.push_back({Role::kAttnRouter, l});
      roles_.push_back({Role::kExperts, l});
    }
  }
  roles_.push_back({Role::kHead, -1});
}

std::vector<RuntimeParamSpec> MoeGpt::GroupParams(int g) const {
  SSHSDP_CHECK(g >= 0 && g < num_groups(), PlanError, "MoE GPT has groups 0..{}, asked for {}",
               num_groups() - 1, g);
  const GroupRole r = roles_[g];
  switch (r.role) {
    case Role::kEmbed:
      return trunk_->GroupParams(0);
    case Role::kHead:
      return trunk_->GroupParams(c_.trunk.n_layer + 1);
    case Role::kDense:
      return trunk_->GroupParams(r.layer + 1);
    case Role::kMoe:
      return MoeBlockParams(r.layer);
    case Role::kAttnRouter: {
      std::vector<RuntimeParamSpec> specs = MoeBlockParams(r.layer);
      specs.resize(static_cast<size_t>(slots_.w1));
      return specs;
    }
    case Role::kExperts: {
      std::vector<RuntimeParamSpec> specs = MoeBlockParams(r.layer);
      specs.erase(specs.begin(), specs.begin() + slots_.w1);
      return specs;
    }
  }
  return {};
}

bool MoeGpt::GroupConsumesMx(int g) const {
  SSHSDP_CHECK(g >= 0 && g < num_groups(), PlanError, "MoE GPT has groups 0..{}, asked for {}",
               num_groups() - 1, g);
  return roles_[g].role == Role::kExperts;
}

int MoeGpt::ExpertGroup(int l) const {
  SSHSDP_CHECK(l >= 0 && l < c_.trunk.n_layer && c_.IsMoeLayer(l), PlanError,
               "MoE GPT: block {} is not an MoE block", l);
  return c_.expert_group ? first_group_[l] + 1 : first_group_[l];
}

std::vector<RuntimeParamSpec> MoeGpt::MoeBlockParams(int l) const {
  std::vector<RuntimeParamSpec> specs = trunk_->GroupParams(l + 1);
  specs.resize(static_cast<size_t>(slots_.router));  // the trunk's attention half, unchanged
  const int64_t E = c_.n_expert, d = c_.trunk.d_model, f = c_.expert_ff(), fs = c_.shared_ff();
  const float std = 0.02f;
  // As the dense GPT; the Llama family initialises every matrix alike (transformers').
  const float proj_std = c_.llama ? std : std / std::sqrt(2.0f * c_.trunk.n_layer);
  const bool hf = c_.llama.has_value();
  const std::string p = hf ? fmt::format("layers.{}.mlp.", l) : fmt::format("blocks.{}.moe.", l);
  RuntimeParamSpec router =
      Single(p + (hf ? "gate" : "router"), {E, d}, UpdateKind::kMatrix, Normal(std));
  router.parts[0].muon_eligible = false;  // AdamW by default (see moe.h)
  specs.push_back(std::move(router));
  // The packed [E, out, in] weight; expert e's part "blocks.l.moe.w1.e3", or transformers'
  // "layers.l.mlp.experts.3.gate_proj".
  auto packed = [&](const char* kind, const char* hf_kind, int64_t out, int64_t in,
                    float init_std) {
    RuntimeParamSpec s{
        p + (hf ? fmt::format("experts.{}", hf_kind) : std::string(kind)), {E, out, in}, {}};
    for (int64_t e = 0; e < E; ++e) {
      s.parts.push_back(UpdatePart{
          hf ? fmt::format("{}experts.{}.{}", p, e, hf_kind) : fmt::format("{}{}.e{}", p, kind, e),
          {out, in},
          e * out * in,
          UpdateKind::kMatrix,
          Normal(init_std)});
    }
    return s;
  };
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  specs.push_back(packed("w1", "gate_proj", f, d, std));
  specs.push_back(packed("w2", "down_proj", d, f, proj_std));
  if (swiglu) specs.push_back(packed("w3", "up_proj", f, d, std));
  if (c_.shared_expert) {
    specs.push_back(Single(p + "shared.w1", {fs, d}, UpdateKind::kMatrix, Normal(std)));
    specs.push_back(Single(p + "shared.w2", {d, fs}, UpdateKind::kMatrix, Normal(proj_std)));
    if (swiglu) specs.push_back(Single(p + "shared.w3", {fs, d}, UpdateKind::kMatrix, Normal(std)));
  }
  return specs;
}

void MoeGpt::SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) {
  trunk_->SetBatch(tokens, targets, B, T);  // checks the batch
  if (B != B_ || T != T_) Allocate(B, T);
  for (BlockActs& A : blocks_) A.routed = false;
  order_.Reset(num_groups());
}

void MoeGpt::Allocate(int B, int T) {
  B_ = T_ = 0;  // until the allocation below succeeded (SetBatch retries otherwise)
  const int64_t N = int64_t{B} * T, d = c_.trunk.d_model, E = c_.n_expert, k = c_.top_k;
  const int64_t Nk = N * k, f = c_.expert_ff(), fs = c_.shared_ff();
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU, shared = c_.shared_expert;
  // A table of (slot, floats): int32 arrays take a float's 4 bytes, doubles two.
  std::vector<std::pair<float**, int64_t>> fl;
  std::vector<std::pair<int32_t**, int64_t>> il;
  blocks_.assign(static_cast<size_t>(c_.trunk.n_layer), BlockActs{});
  for (int l = 0; l < c_.trunk.n_layer; ++l) {
    if (!c_.IsMoeLayer(l)) continue;
    BlockActs& A = blocks_[static_cast<size_t>(l)];
    for (auto [slot, n] : {std::pair{&A.score, N * E},
                           {&A.gate, Nk},
                           {&A.frac, E},
                           {&A.xp, Nk * d},
                           {&A.h1, Nk * f},
                           {&A.act, Nk * f},
                           {&A.yp, Nk * d}})
      fl.push_back({slot, n});
    if (swiglu) fl.push_back({&A.h3, Nk * f});
    if (shared) {
      fl.push_back({&A.sh1, N * fs});
      fl.push_back({&A.sha, N * fs});
      if (swiglu) fl.push_back({&A.sh3, N * fs});
    }
    for (int32_t** slot : {&A.sel, &A.row, &A.token}) il.push_back({slot, Nk});
    il.push_back({&A.offsets, E + 1});
    A.offsets_h.resize(static_cast<size_t>(E + 1));
  }
  float* psum = nullptr;  // E doubles (8-byte aligned: every slot is 64)
  fl.push_back({&psum, 2 * E});
  il.push_back({&count_, E});
  for (auto [slot, n] : {std::pair{&dgate_, Nk},
                         {&dyp_, Nk * d},
                         {&dh1_, Nk * f},
                         {&dxp_, Nk * d},
                         {&dz_, N * E},
                         {&router32_, E * d}})
    fl.push_back({slot, n});
  dh3_ = dsh1_ = dsh3_ = nullptr;
  if (swiglu) fl.push_back({&dh3_, Nk * f});
  if (shared) {
    fl.push_back({&dsh1_, N * fs});
    if (swiglu) fl.push_back({&dsh3_, N * fs});
  }
  std::vector<int64_t> at;
  int64_t total = 0;
  for (const auto& e : fl) at.push_back(std::exchange(total, total + (e.second + 15) / 16 * 16));
  for (const auto& e : il) at.push_back(std::exchange(total, total + (e.second + 15) / 16 * 16));
  float* arena = arena_.Reserve<float>(total);
  size_t i = 0;
  for (auto& e : fl) *e.first = arena + at[i++];
  for (auto& e : il) *e.first = reinterpret_cast<int32_t*>(arena + at[i++]);
  psum_ = reinterpret_cast<double*>(psum);
  count_h_.resize(static_cast<size_t>(E));
  psum_h_.resize(static_cast<size_t>(E));
  frac_h_.resize(static_cast<size_t>(E));
  B_ = B, T_ = T;
}

size_t MoeGpt::NumViews(int g) const {
  switch (roles_[g].role) {
    case Role::kEmbed:
      return trunk_->GroupParams(0).size();
    case Role::kHead:
      return 2;  // a tied trunk's head: its norm and group 0's table
    case Role::kDense:
      return static_cast<size_t>(trunk_->DenseBlockViews());
    case Role::kMoe:
      return static_cast<size_t>(slots_.count);
    case Role::kAttnRouter:
      return static_cast<size_t>(slots_.w1);
    case Role::kExperts:
      return static_cast<size_t>(slots_.count - slots_.w1);
  }
  return 0;
}

void MoeGpt::CheckViews(int g, const std::vector<TensorRef>& v, const char* what) const {
  const size_t want = NumViews(g);
  SSHSDP_CHECK(v.size() == want, PlanError, "MoE GPT group {}: got {} {} views, expected {}", g,
               v.size(), what, want);
  const Role role = roles_[g].role;
  for (size_t i = 0; i < v.size(); ++i) {
    // MXFP8 (codes + scales) only for expert weights.
    const bool expert =
        role == Role::kExperts || (role == Role::kMoe && i >= static_cast<size_t>(slots_.w1));
    const bool mx = expert && kernels::IsMxElement(v[i].dtype) && v[i].scales != nullptr &&
                    std::string_view(what) == "weight";
    SSHSDP_CHECK(v[i].data != nullptr && (IsFloatType(v[i].dtype) || mx), PlanError,
                 "MoE GPT group {}: {} view {} must be non-null fp32 or bf16 (MXFP8 with scales "
                 "for expert weights) (got {})",
                 g, what, i, DTypeName(v[i].dtype));
  }
}

double MoeGpt::CrossEntropy() const {
  SSHSDP_CHECK(order_.forward_done(), PlanError,
               "MoE GPT loss read before the last group's Forward");
  return trunk_->Loss();
}

double MoeGpt::AuxLoss() const {
  SSHSDP_CHECK(order_.forward_done(), PlanError,
               "MoE GPT loss read before the last group's Forward");
  double aux = 0.0;
  if (c_.aux_pooled) {
    const double LN = static_cast<double>(NumMoeLayers()) * B_ * T_;
    for (int e = 0; e < c_.n_expert; ++e) aux += pool_count_[e] * pool_psum_[e];
    return c_.aux_loss_weight * c_.n_expert * aux / (LN * LN);
  }
  for (int l = 0; l < c_.trunk.n_layer; ++l) {
    if (c_.IsMoeLayer(l)) aux += blocks_[l].aux;
  }
  return aux;
}

double MoeGpt::Loss() const { return CrossEntropy() + AuxLoss(); }

void MoeGpt::KeepLoss() {
  const double aux = AuxLoss();  // PlanError before the last group's Forward
  trunk_->KeepLoss();
  kept_aux_.push_back(aux);  // only once the trunk kept its half
}

std::vector<double> MoeGpt::TakeLosses() {
  std::vector<double> out = trunk_->TakeLosses();
  const std::vector<double> aux = std::exchange(kept_aux_, {});
  SSHSDP_CHECK(out.size() == aux.size(), PlanError,
               "MoE GPT: {} kept cross-entropies against {} aux losses", out.size(), aux.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] += aux[i];  // as Loss() adds them
  return out;
}

const MoeGpt::BlockActs& MoeGpt::Routed(int l) const {
  SSHSDP_CHECK(l >= 0 && l < c_.trunk.n_layer && c_.IsMoeLayer(l), PlanError,
               "MoE GPT: block {} is not an MoE block", l);
  SSHSDP_CHECK(B_ > 0 && blocks_[static_cast<size_t>(l)].routed, PlanError,
               "MoE GPT: routing of block {} read before its forward", l);
  return blocks_[static_cast<size_t>(l)];
}

std::vector<int32_t> MoeGpt::Routing(int l) const {
  const BlockActs& A = Routed(l);
  std::vector<int32_t> sel(static_cast<size_t>(int64_t{B_} * T_ * c_.top_k));
  b_.CopyOut(sel.data(), A.sel, sel.size() * sizeof(int32_t));
  return sel;
}

std::vector<int64_t> MoeGpt::ExpertTokens(int l) const {
  const BlockActs& A = Routed(l);
  std::vector<int64_t> n(c_.n_expert);
  for (int e = 0; e < c_.n_expert; ++e) n[e] = A.offsets_h[e + 1] - A.offsets_h[e];
  return n;
}

double MoeGpt::FlopsPerToken() const {
  const GptConfig& tc = c_.trunk;
  const double d = tc.d_model;
  const double mats = c_.expert_mlp == ExpertMlp::kSwiGLU ? 3 : 2;
  double n_active = trunk_->HeadWeights();
  for (int l = 0; l < tc.n_layer; ++l) {
    n_active += trunk_->AttentionWeights();
    if (c_.IsMoeLayer(l)) {
      n_active += c_.n_expert * d + c_.top_k * mats * d * c_.expert_ff();
      if (c_.shared_expert) n_active += mats * d * c_.shared_ff();
    } else {
      n_active += trunk_->DenseMlpWeights();
    }
  }
  return 6.0 * n_active + trunk_->AttentionFlopsPerToken(T_ > 0 ? T_ : tc.seq_len);
}

int64_t MoeGpt::ActivationBytes() const {
  int64_t bytes = trunk_->ActivationBytes() + arena_.bytes() + wgrad_scratch_.bytes();
  for (const auto& mx : mx_scratch_) bytes += mx->bytes();  // dequantized MXFP8 expert weights
  return bytes;
}

}  // namespace sshsdp
