// Reference MoE GPT forward/backward (see moe.h), llm.c style: plain loops and GEMM calls
// over activations in one arena; the trunk (embeddings, attention, norms, head) uses the
// same layer kernels as the dense GPT (layers.h). The MoE MLP is a router, a deterministic
// token permutation (counting sort by expert), per-expert GEMMs on slices of the packed
// [E, out, in] runtime weights over each expert's contiguous rows, and an un-permutation
// that gathers every token's k weighted rows. Backward writes each expert's weight gradient
// straight into its slice of the packed gradient view (explicit zeros for an expert without
// tokens in overwrite mode).
#include "sshsdp/models/moe.h"

#include <algorithm>
#include <cmath>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/mx_linear.h"
#include "sshsdp/models/layers.h"

namespace sshsdp {
namespace {

using kernels::LinearBackwardData;
using kernels::LinearBackwardWeight;
using kernels::LinearForward;
using layers::IsFloatType;
using layers::Normal;
using layers::RmsNormBackward;
using layers::RmsNormForward;
using layers::Single;

// ---- Grouped GEMM over experts. ----
// kernels/matmul caches one oneDNN primitive per exact shape (0.1–0.5 MB each, measured) and
// an expert's token count changes every step, so an expert's rows are multiplied in chunks
// of sizes from {2^i} ∪ {3·2^i} (greedy, largest first): a bounded set of about 2·log2(N·k)
// shapes per matrix, a few calls per expert, every row computed exactly once (no padding).
int64_t ChunkRows(int64_t rows) {
  int64_t p = 1;
  while (p * 2 <= rows) p *= 2;
  return p >= 2 && p / 2 * 3 <= rows ? p / 2 * 3 : p;
}

// Expert e's [out, in] matrix inside a packed [E, out, in] view.
const void* Slice(const TensorRef& t, int64_t e, int64_t per_expert) {
  return static_cast<const char*>(t.data) + e * per_expert * DTypeSize(t.dtype);
}
void* MutableSlice(const TensorRef& t, int64_t e, int64_t per_expert) {
  return static_cast<char*>(t.data) + e * per_expert * DTypeSize(t.dtype);
}

// y[rows, n] = x[rows, k] · wᵀ, w [n, k] in w_dtype.
void ExpertForward(const float* x, const void* w, DType w_dtype, float* y, int64_t rows, int64_t n,
                   int64_t k) {
  for (int64_t r = 0; r < rows;) {
    const int64_t c = ChunkRows(rows - r);
    LinearForward(x + r * k, w, w_dtype, y + r * n, c, n, k);
    r += c;
  }
}

// dx[rows, k] (=|+=) dy[rows, n] · w.
void ExpertBackwardData(const float* dy, const void* w, DType w_dtype, float* dx, int64_t rows,
                        int64_t n, int64_t k, bool accumulate) {
  for (int64_t r = 0; r < rows;) {
    const int64_t c = ChunkRows(rows - r);
    LinearBackwardData(dy + r * n, w, w_dtype, dx + r * k, c, n, k, accumulate);
    r += c;
  }
}

// dw[n, k] (=|+=) dyᵀ · x summed over all rows: chunks after the first accumulate; a bf16
// dw that needs several chunks is summed in fp32 scratch and rounded once.
void ExpertBackwardWeight(const float* dy, const float* x, DType compute_dtype, void* dw,
                          DType dw_dtype, int64_t rows, int64_t n, int64_t k, bool accumulate,
                          std::vector<float>& scratch) {
  if (ChunkRows(rows) == rows) {
    LinearBackwardWeight(dy, x, compute_dtype, dw, dw_dtype, rows, n, k, accumulate);
    return;
  }
  const bool direct = dw_dtype == DType::kF32;
  if (!direct && static_cast<int64_t>(scratch.size()) < n * k) scratch.resize(n * k);
  void* dst = direct ? dw : scratch.data();
  bool acc = direct && accumulate;
  for (int64_t r = 0; r < rows;) {
    const int64_t c = ChunkRows(rows - r);
    LinearBackwardWeight(dy + r * n, x + r * k, compute_dtype, dst, DType::kF32, c, n, k, acc);
    acc = true;
    r += c;
  }
  if (!direct) kernels::WriteOrAccumulate(scratch.data(), dw, dw_dtype, n * k, accumulate);
}

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The hidden activation of an expert MLP from its first projection(s).
void ActivationForward(ExpertMlp kind, const float* h1, const float* h3, float* act, int64_t n) {
  if (kind == ExpertMlp::kSwiGLU) {
    layers::SwigluForward(h1, h3, act, n);
  } else {
    layers::GeluForward(h1, act, n);
  }
}

// In place on dh1 (= ∂/∂act on entry): dh1 = ∂/∂h1, dh3 = ∂/∂h3 (SwiGLU only).
void ActivationBackward(ExpertMlp kind, const float* h1, const float* h3, float* dh1, float* dh3,
                        int64_t n) {
  if (kind == ExpertMlp::kSwiGLU) {
    layers::SwigluBackward(h1, h3, dh1, dh1, dh3, n);
  } else {
    layers::GeluBackwardInPlace(h1, dh1, n);
  }
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

bool MoeConfig::IsMoeLayer(int l) const {
  if (!moe_layers.empty())
    return std::find(moe_layers.begin(), moe_layers.end(), l) != moe_layers.end();
  return moe_every > 0 && l % moe_every == moe_every - 1;
}

void MoeConfig::Validate() const {
  trunk.Validate();
  SSHSDP_CHECK(trunk.packed_qkv, ConfigError,
               "MoE config: the MoE GPT runs the packed QKV projection only "
               "(trunk.packed_qkv = false, per-part QKV, is the dense GPT's veScale mode)");
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

namespace {
GptConfig CheckedTrunk(const MoeConfig& c) {
  c.Validate();
  return c.trunk;
}
}  // namespace

MoeGpt::MoeGpt(const MoeConfig& config) : c_(config), trunk_(CheckedTrunk(config)) {
  c_.trunk = trunk_.config();  // d_ff resolved
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  int next = 7;
  if (swiglu) slots_.w3 = next++;
  if (c_.shared_expert) {
    slots_.s1 = next++;
    slots_.s2 = next++;
    if (swiglu) slots_.s3 = next++;
  }
  slots_.count = next;
  mx_scratch_.resize(static_cast<size_t>(slots_.count - slots_.w1));
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
  gain_scratch_.resize(c_.trunk.d_model);
  dgain_scratch_.resize(c_.trunk.d_model);
}

std::vector<RuntimeParamSpec> MoeGpt::GroupParams(int g) const {
  SSHSDP_CHECK(g >= 0 && g < num_groups(), PlanError, "MoE GPT has groups 0..{}, asked for {}",
               num_groups() - 1, g);
  const GroupRole r = roles_[g];
  switch (r.role) {
    case Role::kEmbed:
      return trunk_.GroupParams(0);
    case Role::kHead:
      return trunk_.GroupParams(c_.trunk.n_layer + 1);
    case Role::kDense:
      return trunk_.GroupParams(r.layer + 1);
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
  std::vector<RuntimeParamSpec> specs = trunk_.GroupParams(l + 1);
  specs.resize(4);  // ln1.g, attn.qkv, attn.proj, ln2.g: the dense GPT's, unchanged
  const int64_t E = c_.n_expert, d = c_.trunk.d_model, f = c_.expert_ff(), fs = c_.shared_ff();
  const float std = 0.02f;
  const float proj_std = std / std::sqrt(2.0f * c_.trunk.n_layer);  // as the dense GPT
  const std::string p = fmt::format("blocks.{}.moe.", l);
  RuntimeParamSpec router = Single(p + "router", {E, d}, UpdateKind::kMatrix, Normal(std));
  router.parts[0].muon_eligible = false;  // AdamW by default (see moe.h)
  specs.push_back(std::move(router));
  auto packed = [&](const char* kind, int64_t out, int64_t in, float init_std) {
    RuntimeParamSpec s{p + kind, {E, out, in}, {}};
    for (int64_t e = 0; e < E; ++e) {
      s.parts.push_back(UpdatePart{fmt::format("{}{}.e{}", p, kind, e),
                                   {out, in},
                                   e * out * in,
                                   UpdateKind::kMatrix,
                                   Normal(init_std)});
    }
    return s;
  };
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  specs.push_back(packed("w1", f, d, std));
  specs.push_back(packed("w2", d, f, proj_std));
  if (swiglu) specs.push_back(packed("w3", f, d, std));
  if (c_.shared_expert) {
    specs.push_back(Single(p + "shared.w1", {fs, d}, UpdateKind::kMatrix, Normal(std)));
    specs.push_back(Single(p + "shared.w2", {d, fs}, UpdateKind::kMatrix, Normal(proj_std)));
    if (swiglu) specs.push_back(Single(p + "shared.w3", {fs, d}, UpdateKind::kMatrix, Normal(std)));
  }
  return specs;
}

void MoeGpt::SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) {
  const GptConfig& tc = c_.trunk;
  SSHSDP_CHECK(B > 0 && T > 0 && T <= tc.seq_len, ConfigError,
               "MoE GPT batch B={} T={} invalid (need B > 0 and 0 < T <= seq_len {})", B, T,
               tc.seq_len);
  const int64_t N = static_cast<int64_t>(B) * T;
  for (int64_t i = 0; i < N; ++i) {
    SSHSDP_CHECK(tokens[i] >= 0 && tokens[i] < tc.vocab && targets[i] >= 0 && targets[i] < tc.vocab,
                 ConfigError, "MoE GPT batch position {}: token {} / target {} outside vocab {}", i,
                 tokens[i], targets[i], tc.vocab);
  }
  tokens_.assign(tokens, tokens + N);
  targets_.assign(targets, targets + N);
  B_ = B, T_ = T;

  // Arena layout: every tensor 64-byte aligned in one float and one int32 allocation.
  const int64_t L = tc.n_layer, d = tc.d_model, ff = tc.ff(), V = tc.padded_vocab(), H = tc.n_head;
  const int64_t E = c_.n_expert, k = c_.top_k, f = c_.expert_ff(), fs = c_.shared_ff();
  const int64_t Nk = N * k;
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  std::vector<std::pair<float**, int64_t>> fl;
  std::vector<std::pair<int32_t**, int64_t>> il;
  float* residual = nullptr;
  fl.push_back({&residual, (L + 1) * N * d});
  blocks_.assign(L, BlockActs{});
  bool any_dense = false;
  for (int l = 0; l < L; ++l) {
    BlockActs& A = blocks_[l];
    for (auto [slot, n] : {std::pair{&A.ln1, N * d},
                           {&A.ln1_rstd, N},
                           {&A.qkv, N * 3 * d},
                           {&A.att, B * H * static_cast<int64_t>(T) * T},
                           {&A.atty, N * d},
                           {&A.res_mid, N * d},
                           {&A.ln2, N * d},
                           {&A.ln2_rstd, N}}) {
      fl.push_back({slot, n});
    }
    if (!c_.IsMoeLayer(l)) {
      any_dense = true;
      fl.push_back({&A.fch, N * ff});
      fl.push_back({&A.fcg, N * ff});
      continue;
    }
    for (auto [slot, n] : {std::pair{&A.score, N * E},
                           {&A.gate, Nk},
                           {&A.frac, E},
                           {&A.xp, Nk * d},
                           {&A.h1, Nk * f},
                           {&A.act, Nk * f},
                           {&A.yp, Nk * d}}) {
      fl.push_back({slot, n});
    }
    if (swiglu) fl.push_back({&A.h3, Nk * f});
    if (c_.shared_expert) {
      fl.push_back({&A.sh1, N * fs});
      fl.push_back({&A.sha, N * fs});
      if (swiglu) fl.push_back({&A.sh3, N * fs});
    }
    il.push_back({&A.sel, Nk});
    il.push_back({&A.offsets, E + 1});
    il.push_back({&A.row, Nk});
    il.push_back({&A.token, Nk});
  }
  const bool any_moe = !il.empty();
  for (auto [slot, n] : {std::pair{&lnf_, N * d},
                         {&lnf_rstd_, N},
                         {&probs_, N * V},
                         {&losses_, N},
                         {&dres_, N * d},
                         {&dtmp_, N * d},
                         {&dln_, N * d},
                         {&dqkv_, N * 3 * d},
                         {&dlogits_, N * V},
                         {&datt_, static_cast<int64_t>(T) * T}}) {
    fl.push_back({slot, n});
  }
  dfch_ = dgate_ = dyp_ = dh1_ = dh3_ = dxp_ = dz_ = dsh1_ = dsh3_ = nullptr;
  if (any_dense) fl.push_back({&dfch_, N * ff});
  if (any_moe) {
    for (auto [slot, n] : {std::pair{&dgate_, Nk},
                           {&dyp_, Nk * d},
                           {&dh1_, Nk * f},
                           {&dh3_, Nk * f},
                           {&dxp_, Nk * d},
                           {&dz_, N * E}}) {
      fl.push_back({slot, n});
    }
    if (c_.shared_expert) {
      fl.push_back({&dsh1_, N * fs});
      fl.push_back({&dsh3_, N * fs});
    }
  }
  auto place = [](auto& list, auto& storage) {
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (auto& [slot, n] : list) {
      offsets.push_back(total);
      total += (n + 15) / 16 * 16;
    }
    if (static_cast<int64_t>(storage.size()) < total) {
      storage.clear();
      storage.shrink_to_fit();
      storage.resize(total);
    }
    for (size_t i = 0; i < list.size(); ++i) *list[i].first = storage.data() + offsets[i];
  };
  place(fl, arena_);
  place(il, iarena_);
  res_.resize(L + 1);
  for (int64_t l = 0; l <= L; ++l) res_[l] = residual + l * N * d;

  fwd_next_ = 0;
  fwd_done_ = false;
  bwd_next_ = -1;
}

size_t MoeGpt::NumViews(int g) const {
  switch (roles_[g].role) {
    case Role::kEmbed:
    case Role::kHead:
      return 2;
    case Role::kDense:
      return 6;
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

const float* MoeGpt::Gain(const TensorRef& t) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  Bf16ToFloat(static_cast<const bf16*>(t.data), gain_scratch_.data(), gain_scratch_.size());
  return gain_scratch_.data();
}

const float* MoeGpt::RouterF32(const TensorRef& t) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  const size_t n = static_cast<size_t>(c_.n_expert) * c_.trunk.d_model;
  router_scratch_.resize(n);
  Bf16ToFloat(static_cast<const bf16*>(t.data), router_scratch_.data(), n);
  return router_scratch_.data();
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
      layers::EmbeddingForward(w[0], w[1], tokens_.data(), B_, T_, c_.trunk.d_model, res_[0]);
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

double MoeGpt::CrossEntropy() const {
  SSHSDP_CHECK(fwd_done_, PlanError, "MoE GPT loss read before the last group's Forward");
  return ce_;
}

double MoeGpt::AuxLoss() const {
  SSHSDP_CHECK(fwd_done_, PlanError, "MoE GPT loss read before the last group's Forward");
  double aux = 0.0;
  for (int l = 0; l < c_.trunk.n_layer; ++l) {
    if (c_.IsMoeLayer(l)) aux += blocks_[l].aux;
  }
  return aux;
}

double MoeGpt::Loss() const { return CrossEntropy() + AuxLoss(); }

const MoeGpt::BlockActs& MoeGpt::Routed(int l) const {
  SSHSDP_CHECK(l >= 0 && l < c_.trunk.n_layer && c_.IsMoeLayer(l), PlanError,
               "MoE GPT: block {} is not an MoE block", l);
  SSHSDP_CHECK(B_ > 0 && (fwd_done_ || fwd_next_ > first_group_[l]), PlanError,
               "MoE GPT: routing of block {} read before its forward", l);
  return blocks_[l];
}

std::vector<int32_t> MoeGpt::Routing(int l) const {
  const BlockActs& A = Routed(l);
  return std::vector<int32_t>(A.sel, A.sel + static_cast<int64_t>(B_) * T_ * c_.top_k);
}

std::vector<int64_t> MoeGpt::ExpertTokens(int l) const {
  const BlockActs& A = Routed(l);
  std::vector<int64_t> n(c_.n_expert);
  for (int e = 0; e < c_.n_expert; ++e) n[e] = A.offsets[e + 1] - A.offsets[e];
  return n;
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
      layers::EmbeddingBackward(dres_, tokens_.data(), B_, T_, c_.trunk.d_model, grad[0],
                                c_.trunk.padded_vocab(), grad[1], c_.trunk.seq_len, acc,
                                table_scratch_);
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

void MoeGpt::ForwardAttention(int l, const std::vector<TensorRef>& w) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  BlockActs& A = blocks_[l];
  const float* x = res_[l];
  RmsNormForward(x, Gain(w[0]), A.ln1, A.ln1_rstd, N, d);
  LinearForward(A.ln1, w[1].data, w[1].dtype, A.qkv, N, 3 * d, d);
  layers::AttentionForward(A.qkv, A.att, A.atty, B_, T_, c_.trunk.n_head, c_.trunk.head_dim());
  LinearForward(A.atty, w[2].data, w[2].dtype, A.res_mid, N, d, d);
  kernels::Add(x, A.res_mid, A.res_mid, N * d);
  RmsNormForward(A.res_mid, Gain(w[3]), A.ln2, A.ln2_rstd, N, d);
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
  LinearForward(A.ln2, w[4].data, w[4].dtype, A.fch, N, ff, d);
  layers::GeluForward(A.fch, A.fcg, N * ff);
  LinearForward(A.fcg, w[5].data, w[5].dtype, out, N, d, ff);
  kernels::Add(A.res_mid, out, out, N * d);
}

TensorRef MoeGpt::ExpertView(const TensorRef& t, int64_t rows, int64_t cols, int slot) {
  if (!kernels::IsMxElement(t.dtype)) return t;
  std::vector<float>& s = mx_scratch_[static_cast<size_t>(slot - slots_.w1)];
  s.resize(static_cast<size_t>(rows * cols));
  kernels::MxDequantizeOperand(static_cast<const uint8_t*>(t.data), t.dtype, t.scales,
                               t.scale_layout, rows, cols, s.data());
  return TensorRef{s.data(), DType::kF32};
}

void MoeGpt::ForwardRouter(int l, const TensorRef& router) {
  BlockActs& A = blocks_[l];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const float* x = A.ln2;

  // 1. Router logits in fp32 (bf16 router weights are widened: routing decisions are made
  //    from fp32 logits, as MoE implementations do for stability).
  LinearForward(x, RouterF32(router), DType::kF32, A.score, N, E, d);

  // 2. Top-k by logit (ties: lower expert index first), then scores and gates.
  std::vector<char> taken(E);
  std::vector<int64_t> count(E, 0);
  std::vector<double> pmean(E, 0.0);  // Σ_t q_{t,e}
  for (int64_t t = 0; t < N; ++t) {
    float* z = A.score + t * E;
    int32_t* sel = A.sel + t * k;
    std::fill(taken.begin(), taken.end(), 0);
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (!taken[e] && (best < 0 || z[e] > z[best])) best = e;
      }
      taken[best] = 1;
      sel[j] = best;
      count[best]++;
    }
    // Scores in place of the logits.
    double qsum = 0.0;
    if (c_.gating == Gating::kSoftmax) {
      const float mx = *std::max_element(z, z + E);
      double sum = 0.0;
      for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(z[e] - mx));
      for (int e = 0; e < E; ++e) z[e] = static_cast<float>(std::exp(z[e] - mx) / sum);
      qsum = 1.0;
    } else {
      for (int e = 0; e < E; ++e) {
        z[e] = 1.0f / (1.0f + std::exp(-z[e]));
        qsum += z[e];
      }
    }
    for (int e = 0; e < E; ++e) pmean[e] += z[e] / qsum;
    float* gate = A.gate + t * k;
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s += z[sel[j]];
    for (int j = 0; j < k; ++j) gate[j] = c_.renormalize ? z[sel[j]] / s : z[sel[j]];
  }

  // 3. Load-balancing loss: α·E·Σ_e f_e·P_e.
  double aux = 0.0;
  for (int e = 0; e < E; ++e) {
    A.frac[e] = static_cast<float>(static_cast<double>(count[e]) / static_cast<double>(N * k));
    aux += static_cast<double>(A.frac[e]) * (pmean[e] / static_cast<double>(N));
  }
  A.aux = static_cast<double>(c_.aux_loss_weight) * E * aux;

  // 4. Permutation (counting sort): expert e owns rows [offsets[e], offsets[e+1]), its
  //    tokens in increasing order; row[t·k + j] is where assignment (t, j) lives.
  A.offsets[0] = 0;
  for (int e = 0; e < E; ++e) A.offsets[e + 1] = A.offsets[e] + static_cast<int32_t>(count[e]);
  std::vector<int32_t> cursor(A.offsets, A.offsets + E);
  for (int64_t t = 0; t < N; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t r = cursor[A.sel[t * k + j]]++;
      A.row[t * k + j] = r;
      A.token[r] = static_cast<int32_t>(t);
    }
  }
  const int64_t Nk = N * k;
  for (int64_t r = 0; r < Nk; ++r) std::copy_n(x + A.token[r] * d, d, A.xp + r * d);
}

void MoeGpt::ForwardExperts(int l, const TensorRef* wx) {
  BlockActs& A = blocks_[l];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const int64_t f = c_.expert_ff(), fs = c_.shared_ff();
  const float* x = A.ln2;
  float* out = res_[l + 1];
  auto view = [&](int slot, int64_t rows, int64_t cols) {
    return ExpertView(wx[slot - slots_.w1], rows, cols, slot);
  };

  // 5. Experts: GEMMs on each expert's slice of the packed weights over its rows (an MXFP8
  //    packed weight is dequantized whole first: its scales are laid out for [E·out, in]).
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  const TensorRef w1 = view(slots_.w1, E * f, d);
  const TensorRef w2 = view(slots_.w2, E * d, f);
  const TensorRef w3 = swiglu ? view(slots_.w3, E * f, d) : TensorRef{};
  for (int e = 0; e < E; ++e) {
    const int64_t off = A.offsets[e], n = A.offsets[e + 1] - off;
    if (n == 0) continue;
    const float* xe = A.xp + off * d;
    ExpertForward(xe, Slice(w1, e, f * d), w1.dtype, A.h1 + off * f, n, f, d);
    if (swiglu) ExpertForward(xe, Slice(w3, e, f * d), w3.dtype, A.h3 + off * f, n, f, d);
    ActivationForward(c_.expert_mlp, A.h1 + off * f, swiglu ? A.h3 + off * f : nullptr,
                      A.act + off * f, n * f);
    ExpertForward(A.act + off * f, Slice(w2, e, d * f), w2.dtype, A.yp + off * d, n, d, f);
  }

  // 6. Shared expert (ungated) or zeros, then un-permute: out[t] += Σ_j gate_j · yp[row].
  if (c_.shared_expert) {
    const TensorRef s1 = view(slots_.s1, fs, d);
    LinearForward(x, s1.data, s1.dtype, A.sh1, N, fs, d);
    if (swiglu) {
      const TensorRef s3 = view(slots_.s3, fs, d);
      LinearForward(x, s3.data, s3.dtype, A.sh3, N, fs, d);
    }
    ActivationForward(c_.expert_mlp, A.sh1, A.sh3, A.sha, N * fs);
    const TensorRef s2 = view(slots_.s2, d, fs);
    LinearForward(A.sha, s2.data, s2.dtype, out, N, d, fs);
  } else {
    kernels::Fill(out, N * d, 0.0f);
  }
  for (int64_t t = 0; t < N; ++t) {
    for (int j = 0; j < k; ++j) {
      kernels::Axpy(A.gate[t * k + j], A.yp + static_cast<int64_t>(A.row[t * k + j]) * d,
                    out + t * d, d);
    }
  }
  kernels::Add(A.res_mid, out, out, N * d);
}

void MoeGpt::ForwardHead(const std::vector<TensorRef>& w) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model,
                V = c_.trunk.padded_vocab();
  RmsNormForward(res_[c_.trunk.n_layer], Gain(w[0]), lnf_, lnf_rstd_, N, d);
  LinearForward(lnf_, w[1].data, w[1].dtype, probs_, N, V, d);
  ce_ = layers::SoftmaxCrossEntropyForward(probs_, targets_.data(), losses_, N, c_.trunk.vocab, V) /
        static_cast<double>(N);
}

void MoeGpt::BackwardHead(const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                          bool acc) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model,
                V = c_.trunk.padded_vocab();
  layers::SoftmaxCrossEntropyBackward(probs_, targets_.data(), dlogits_, N, V,
                                      static_cast<float>(grad_scale_ / static_cast<double>(N)));
  LinearBackwardWeight(dlogits_, lnf_, w[1].dtype, grad[1].data, grad[1].dtype, N, V, d, acc);
  LinearBackwardData(dlogits_, w[1].data, w[1].dtype, dtmp_, N, V, d, false);
  RmsNormBackward(dtmp_, res_[c_.trunk.n_layer], Gain(w[0]), lnf_rstd_, dres_,
                  dgain_scratch_.data(), N, d, /*accumulate_dx=*/false);
  kernels::WriteOrAccumulate(dgain_scratch_.data(), grad[0].data, grad[0].dtype, d, acc);
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
    LinearBackwardWeight(dres, A.fcg, w[5].dtype, grad[5].data, grad[5].dtype, N, d, ff, acc);
    LinearBackwardData(dres, w[5].data, w[5].dtype, dfch_, N, d, ff, false);
    layers::GeluBackwardInPlace(A.fch, dfch_, N * ff);
    LinearBackwardWeight(dfch_, A.ln2, w[4].dtype, grad[4].data, grad[4].dtype, N, ff, d, acc);
    LinearBackwardData(dfch_, w[4].data, w[4].dtype, dln_, N, ff, d, false);
  }
  BackwardAttention(l, w, grad, acc);
}

void MoeGpt::BackwardAttention(int l, const std::vector<TensorRef>& w,
                               const std::vector<TensorRef>& grad, bool acc) {
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const BlockActs& A = blocks_[l];
  const float* x = res_[l];
  float* dres = dres_;  // in: ∂/∂out; after ln2: ∂/∂res_mid; out: ∂/∂x
  RmsNormBackward(dln_, A.res_mid, Gain(w[3]), A.ln2_rstd, dres, dgain_scratch_.data(), N, d,
                  /*accumulate_dx=*/true);
  kernels::WriteOrAccumulate(dgain_scratch_.data(), grad[3].data, grad[3].dtype, d, acc);

  // Attention: res_mid = x + proj(attention(qkv(ln1(x)))).
  LinearBackwardWeight(dres, A.atty, w[2].dtype, grad[2].data, grad[2].dtype, N, d, d, acc);
  LinearBackwardData(dres, w[2].data, w[2].dtype, dtmp_, N, d, d, false);
  layers::AttentionBackward(dtmp_, A.qkv, A.att, dqkv_, datt_, B_, T_, c_.trunk.n_head,
                            c_.trunk.head_dim());
  LinearBackwardWeight(dqkv_, A.ln1, w[1].dtype, grad[1].data, grad[1].dtype, N, 3 * d, d, acc);
  LinearBackwardData(dqkv_, w[1].data, w[1].dtype, dtmp_, N, 3 * d, d, false);
  RmsNormBackward(dtmp_, x, Gain(w[0]), A.ln1_rstd, dres, dgain_scratch_.data(), N, d,
                  /*accumulate_dx=*/true);
  kernels::WriteOrAccumulate(dgain_scratch_.data(), grad[0].data, grad[0].dtype, d, acc);
}

void MoeGpt::BackwardRouted(int l, const TensorRef* wx, const TensorRef* gx, bool acc,
                            const float* dy, float* dx) {
  const BlockActs& A = blocks_[l];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const int64_t f = c_.expert_ff();
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;

  // 1. Un-permutation backward: ∂/∂gate_j = ⟨dy_t, yp[row]⟩ and dyp[row] = gate_j · dy_t
  //    (a permuted copy of the output gradient, every row written once).
  for (int64_t t = 0; t < N; ++t) {
    const float* dyt = dy + t * d;
    for (int j = 0; j < k; ++j) {
      const int64_t r = A.row[t * k + j];
      dgate_[t * k + j] = Dot(dyt, A.yp + r * d, d);
      const float g = A.gate[t * k + j];
      float* dst = dyp_ + r * d;
      for (int64_t i = 0; i < d; ++i) dst[i] = g * dyt[i];
    }
  }

  // 2. Experts: weight gradients straight into each expert's slice of the packed gradient
  //    views; dxp = ∂/∂(permuted input). No tokens: explicit zeros (overwrite) or nothing.
  //    MXFP8 weights: the data GEMMs use the dequantized weight, the weight-gradient GEMMs run
  //    in fp32 (the dequantized view's dtype; LinearComputeDType of an MX weight).
  const int x0 = slots_.w1;
  const TensorRef w1 = ExpertView(wx[slots_.w1 - x0], E * f, d, slots_.w1);
  const TensorRef w2 = ExpertView(wx[slots_.w2 - x0], E * d, f, slots_.w2);
  const TensorRef w3 = swiglu ? ExpertView(wx[slots_.w3 - x0], E * f, d, slots_.w3) : TensorRef{};
  const TensorRef &g1 = gx[slots_.w1 - x0], &g2 = gx[slots_.w2 - x0];
  const TensorRef g3 = swiglu ? gx[slots_.w3 - x0] : TensorRef{};
  for (int e = 0; e < E; ++e) {
    const int64_t off = A.offsets[e], n = A.offsets[e + 1] - off;
    if (n == 0) {
      if (!acc) {
        kernels::FillZero(MutableSlice(g1, e, f * d), g1.dtype, f * d);
        kernels::FillZero(MutableSlice(g2, e, d * f), g2.dtype, d * f);
        if (swiglu) kernels::FillZero(MutableSlice(g3, e, f * d), g3.dtype, f * d);
      }
      continue;
    }
    const float* xe = A.xp + off * d;
    const float* dye = dyp_ + off * d;
    float* dh1 = dh1_ + off * f;
    float* dh3 = dh3_ + off * f;
    float* dxe = dxp_ + off * d;
    ExpertBackwardWeight(dye, A.act + off * f, w2.dtype, MutableSlice(g2, e, d * f), g2.dtype, n, d,
                         f, acc, wgrad_scratch_);
    ExpertBackwardData(dye, Slice(w2, e, d * f), w2.dtype, dh1, n, d, f, false);
    ActivationBackward(c_.expert_mlp, A.h1 + off * f, swiglu ? A.h3 + off * f : nullptr, dh1, dh3,
                       n * f);
    ExpertBackwardWeight(dh1, xe, w1.dtype, MutableSlice(g1, e, f * d), g1.dtype, n, f, d, acc,
                         wgrad_scratch_);
    ExpertBackwardData(dh1, Slice(w1, e, f * d), w1.dtype, dxe, n, f, d, false);
    if (swiglu) {
      ExpertBackwardWeight(dh3, xe, w3.dtype, MutableSlice(g3, e, f * d), g3.dtype, n, f, d, acc,
                           wgrad_scratch_);
      ExpertBackwardData(dh3, Slice(w3, e, f * d), w3.dtype, dxe, n, f, d, true);
    }
  }

  // 3. Un-permute the input gradient: dx_t = Σ_j dxp[row(t, j)] (a gather: deterministic).
  for (int64_t t = 0; t < N; ++t) {
    float* dxt = dx + t * d;
    std::copy_n(dxp_ + static_cast<int64_t>(A.row[t * k]) * d, d, dxt);
    for (int j = 1; j < k; ++j)
      kernels::Add(dxt, dxp_ + static_cast<int64_t>(A.row[t * k + j]) * d, dxt, d);
  }
}

void MoeGpt::BackwardRouter(int l, const TensorRef& router, const TensorRef& gr, bool acc,
                            float* dx) {
  const BlockActs& A = blocks_[l];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const float* x = A.ln2;

  // 4. Router: ∂/∂score from the gates (through the renormalisation) and from the aux loss,
  //    then through softmax or σ to the logits dz.
  const double scale = grad_scale_;
  std::vector<double> c_aux(E);  // ∂(grad_scale·aux)/∂q_{t,e}, the same for every token
  for (int e = 0; e < E; ++e) {
    c_aux[e] = scale * c_.aux_loss_weight * E * A.frac[e] / static_cast<double>(N);
  }
  std::vector<double> ds(E);
  for (int64_t t = 0; t < N; ++t) {
    const float* s = A.score + t * E;
    const int32_t* sel = A.sel + t * k;
    const float* gate = A.gate + t * k;
    const float* dg = dgate_ + t * k;
    std::fill(ds.begin(), ds.end(), 0.0);
    if (c_.renormalize) {
      // gate_j = a_j / S  ⇒  ∂/∂a_i = (dg_i − Σ_j dg_j·gate_j) / S.
      double S = 0.0, dot = 0.0;
      for (int j = 0; j < k; ++j) S += s[sel[j]], dot += static_cast<double>(dg[j]) * gate[j];
      for (int j = 0; j < k; ++j) ds[sel[j]] += (dg[j] - dot) / S;
    } else {
      for (int j = 0; j < k; ++j) ds[sel[j]] += dg[j];
    }
    float* dz = dz_ + t * E;
    if (c_.gating == Gating::kSoftmax) {
      // q = p: dz = p ⊙ (ds − Σ p·ds).
      double pds = 0.0;
      for (int e = 0; e < E; ++e) ds[e] += c_aux[e], pds += s[e] * ds[e];
      for (int e = 0; e < E; ++e) dz[e] = static_cast<float>(s[e] * (ds[e] - pds));
    } else {
      // q = σ/Σσ: ∂/∂σ_i += (c_i − Σ_e c_e·q_e) / Σσ; dz = ds · σ(1 − σ).
      double ssum = 0.0, cq = 0.0;
      for (int e = 0; e < E; ++e) ssum += s[e];
      for (int e = 0; e < E; ++e) cq += c_aux[e] * s[e] / ssum;
      for (int e = 0; e < E; ++e) {
        ds[e] += (c_aux[e] - cq) / ssum;
        dz[e] = static_cast<float>(ds[e] * s[e] * (1.0f - s[e]));
      }
    }
  }
  LinearBackwardWeight(dz_, x, DType::kF32, gr.data, gr.dtype, N, E, d, acc);
  LinearBackwardData(dz_, RouterF32(router), DType::kF32, dx, N, E, d, true);
}

void MoeGpt::BackwardShared(int l, const TensorRef* wx, const TensorRef* gx, bool acc,
                            const float* dy, float* dx) {
  // 5. Shared expert: a dense MLP on x.
  if (!c_.shared_expert) return;
  const BlockActs& A = blocks_[l];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model, fs = c_.shared_ff();
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  const float* x = A.ln2;
  const int x0 = slots_.w1;
  const TensorRef s1 = ExpertView(wx[slots_.s1 - x0], fs, d, slots_.s1);
  const TensorRef s2 = ExpertView(wx[slots_.s2 - x0], d, fs, slots_.s2);
  const TensorRef &gs1 = gx[slots_.s1 - x0], &gs2 = gx[slots_.s2 - x0];
  LinearBackwardWeight(dy, A.sha, s2.dtype, gs2.data, gs2.dtype, N, d, fs, acc);
  LinearBackwardData(dy, s2.data, s2.dtype, dsh1_, N, d, fs, false);
  ActivationBackward(c_.expert_mlp, A.sh1, A.sh3, dsh1_, dsh3_, N * fs);
  LinearBackwardWeight(dsh1_, x, s1.dtype, gs1.data, gs1.dtype, N, fs, d, acc);
  LinearBackwardData(dsh1_, s1.data, s1.dtype, dx, N, fs, d, true);
  if (swiglu) {
    const TensorRef s3 = ExpertView(wx[slots_.s3 - x0], fs, d, slots_.s3);
    const TensorRef& gs3 = gx[slots_.s3 - x0];
    LinearBackwardWeight(dsh3_, x, s3.dtype, gs3.data, gs3.dtype, N, fs, d, acc);
    LinearBackwardData(dsh3_, s3.data, s3.dtype, dx, N, fs, d, true);
  }
}

double MoeGpt::FlopsPerToken() const {
  const GptConfig& tc = c_.trunk;
  const double d = tc.d_model, ff = tc.ff(), L = tc.n_layer, V = tc.padded_vocab();
  const double mats = c_.expert_mlp == ExpertMlp::kSwiGLU ? 3 : 2;
  double n_active = V * d;  // LM head
  for (int l = 0; l < tc.n_layer; ++l) {
    n_active += 4 * d * d;  // QKV + projection
    if (c_.IsMoeLayer(l)) {
      n_active += c_.n_expert * d + c_.top_k * mats * d * c_.expert_ff();
      if (c_.shared_expert) n_active += mats * d * c_.shared_ff();
    } else {
      n_active += 2 * d * ff;
    }
  }
  const double T = T_ > 0 ? T_ : tc.seq_len;
  return 6.0 * n_active + 12.0 * L * d * T;
}

int64_t MoeGpt::ActivationBytes() const {
  size_t mx = 0;  // dequantized MXFP8 expert weights
  for (const std::vector<float>& v : mx_scratch_) mx += v.size();
  return static_cast<int64_t>((arena_.size() + table_scratch_.size() + gain_scratch_.size() +
                               dgain_scratch_.size() + router_scratch_.size() +
                               wgrad_scratch_.size() + mx) *
                                  sizeof(float) +
                              iarena_.size() * sizeof(int32_t));
}

}  // namespace sshsdp
