// BackendMoeModel (backend_moe.h): Model's contract around BackendGpt's trunk and the MoE blocks'
// MLPs on the backend — the groups, views, activations and the per-group dispatch. The MoE MLP
// itself (router, experts, shared expert) is in backend_moe_mlp.cc.
#include "sshsdp/models/backend_moe.h"

#include <algorithm>
#include <string>
#include <utility>

#include "sshsdp/base/error.h"

namespace sshsdp {

BackendMoeModel::BackendMoeModel(Backend& b, const MoeConfig& c) : b_(b), c_(c), spec_(c), mx_(b) {
  c_ = spec_.config();  // d_ff resolved
  CheckAttentionFits(b, c_.trunk, "BackendMoeModel");
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  int next = 7;
  if (swiglu) slots_.w3 = next++;
  if (c_.shared_expert) {
    slots_.s1 = next++;
    slots_.s2 = next++;
    if (swiglu) slots_.s3 = next++;
  }
  slots_.count = next;
  roles_.push_back({Role::kEmbed, -1});
  for (int l = 0; l < c_.trunk.n_layer; ++l) {
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
  SSHSDP_CHECK(static_cast<int>(roles_.size()) == spec_.num_groups(), PlanError,
               "BackendMoeModel: {} groups where MoeGpt has {}", roles_.size(), spec_.num_groups());
}

BackendMoeModel::~BackendMoeModel() {
  b_.Free(arena_);
  b_.Free(bf16_scratch_);
}

void BackendMoeModel::Allocate(int B, int T) {
  if (gpt_)
    for (double l : gpt_->TakeLosses()) taken_.push_back(l);
  gpt_.reset();  // free the old activations first
  b_.Free(arena_);
  b_.Free(bf16_scratch_);
  arena_ = nullptr;
  bf16_scratch_ = nullptr;
  x16_ = dy16_ = nullptr;
  B_ = T_ = 0;  // until every allocation below succeeded (SetBatch retries otherwise)
  arena_bytes_ = bf16_bytes_ = 0;
  std::vector<bool> dense;  // the trunk keeps MLP activations for the dense blocks only
  for (int l = 0; l < c_.trunk.n_layer; ++l) dense.push_back(!c_.IsMoeLayer(l));
  gpt_ = std::make_unique<BackendGpt>(b_, c_.trunk, B, T, dense);
  const int64_t N = int64_t{B} * T, d = c_.trunk.d_model, E = c_.n_expert, k = c_.top_k;
  const int64_t Nk = N * k, f = c_.expert_ff(), fs = c_.shared_ff();
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU, shared = c_.shared_expert;
  // A table of (slot, floats): int32 arrays take a float's 4 bytes, bf16 arrays half of one.
  std::vector<std::pair<float**, int64_t>> table;
  std::vector<std::pair<int32_t**, int64_t>> ints;
  blocks_.assign(static_cast<size_t>(c_.trunk.n_layer), Block{});
  for (int l = 0; l < c_.trunk.n_layer; ++l) {
    if (!c_.IsMoeLayer(l)) continue;
    Block& A = blocks_[static_cast<size_t>(l)];
    for (auto [slot, n] : {std::pair{&A.score, N * E},
                           {&A.frac, E},
                           {&A.gate, Nk},
                           {&A.xp, Nk * d},
                           {&A.h1, Nk * f},
                           {&A.act, Nk * f},
                           {&A.yp, Nk * d}})
      table.push_back({slot, n});
    if (swiglu) table.push_back({&A.h3, Nk * f});
    if (shared) {
      table.push_back({&A.sh1, N * fs});
      table.push_back({&A.sha, N * fs});
      if (swiglu) table.push_back({&A.sh3, N * fs});
    }
    ints.push_back({&A.sel, Nk});
    ints.push_back({&A.offsets, E + 1});
    ints.push_back({&A.row, Nk});
    ints.push_back({&A.token, Nk});
    A.offsets_h.resize(static_cast<size_t>(E + 1));
  }
  float* psum = nullptr;  // E doubles: 2·E floats of the arena (8-byte aligned: every slot is 64)
  table.push_back({&psum, 2 * E});
  ints.push_back({&count_, E});
  for (auto [slot, n] : {std::pair{&dz_, N * E},
                         {&dgate_, Nk},
                         {&dyp_, Nk * d},
                         {&dh1_, Nk * f},
                         {&dxp_, Nk * d},
                         {&dln2_, N * d},
                         {&router32_, E * d}})
    table.push_back({slot, n});
  dh3_ = dsh1_ = dsh3_ = nullptr;
  if (swiglu) table.push_back({&dh3_, Nk * f});
  if (shared) {
    table.push_back({&dsh1_, N * fs});
    if (swiglu) table.push_back({&dsh3_, N * fs});
  }
  int64_t total = 0;
  std::vector<int64_t> at;
  auto place = [&](int64_t n) {
    at.push_back(total);
    total += (n + 15) / 16 * 16;  // 64-byte aligned
  };
  for (auto& [slot, n] : table) place(n);
  for (auto& [slot, n] : ints) place(n);
  arena_bytes_ = total * 4;
  arena_ = static_cast<float*>(b_.Alloc(static_cast<size_t>(arena_bytes_)));
  size_t i = 0;
  for (auto& [slot, n] : table) *slot = arena_ + at[i++];
  for (auto& [slot, n] : ints) *slot = reinterpret_cast<int32_t*>(arena_ + at[i++]);
  psum_ = reinterpret_cast<double*>(psum);
  count_h_.resize(static_cast<size_t>(E));
  psum_h_.resize(static_cast<size_t>(E));
  frac_h_.resize(static_cast<size_t>(E));
  B_ = B, T_ = T;
}

void BackendMoeModel::RequireBf16Scratch() {
  if (bf16_scratch_) return;
  // The bf16 operands of a product (bf16 weights): the largest x and dy of any product.
  const int64_t N = int64_t{B_} * T_, Nk = N * c_.top_k, d = c_.trunk.d_model;
  const int64_t n =
      std::max(Nk * std::max<int64_t>(d, c_.expert_ff()), N * std::max<int64_t>(d, c_.shared_ff()));
  const int64_t padded = (n + 31) / 32 * 32;  // keeps dy16_ 64-byte aligned
  bf16_scratch_ = b_.Alloc(static_cast<size_t>(2 * padded) * sizeof(bf16));
  bf16_bytes_ = 2 * padded * static_cast<int64_t>(sizeof(bf16));
  x16_ = static_cast<bf16*>(bf16_scratch_);
  dy16_ = x16_ + padded;
}

void BackendMoeModel::SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (!gpt_ || B != B_ || T != T_) Allocate(B, T);
  gpt_->SetTokens(tokens, targets);
  routed_.assign(static_cast<size_t>(c_.trunk.n_layer), 0);
  fwd_next_ = 0;
  bwd_next_ = -1;
  loss_valid_ = false;
}

void BackendMoeModel::Forward(int g, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(gpt_ != nullptr, PlanError, "BackendMoeModel Forward({}) before SetBatch", g);
  SSHSDP_CHECK(g == fwd_next_, PlanError,
               "BackendMoeModel Forward({}) out of order: expected group {} (forward runs 0..{})",
               g, fwd_next_, num_groups() - 1);
  DType wdt = DType::kF32;
  const std::vector<const void*> p = BackendWeights(b_, "BackendMoeModel", g, w, GroupParams(g),
                                                    GroupConsumesMx(g), DType::kF32, &mx_, &wdt);
  const GroupRole r = roles_[static_cast<size_t>(g)];
  const int L = c_.trunk.n_layer;
  switch (r.role) {
    case Role::kEmbed:
      gpt_->ForwardGroup(0, p.data(), wdt);
      break;
    case Role::kHead:
      gpt_->ForwardGroup(L + 1, p.data(), wdt);
      break;
    case Role::kDense:
      gpt_->ForwardGroup(r.layer + 1, p.data(), wdt);
      break;
    case Role::kMoe:
      gpt_->ForwardAttention(r.layer, p.data(), wdt);
      ForwardRouter(r.layer, p[static_cast<size_t>(slots_.router)], wdt);
      ForwardExperts(r.layer, p.data() + slots_.w1, wdt);
      break;
    case Role::kAttnRouter:
      gpt_->ForwardAttention(r.layer, p.data(), wdt);
      ForwardRouter(r.layer, p[static_cast<size_t>(slots_.router)], wdt);
      break;
    case Role::kExperts:
      ForwardExperts(r.layer, p.data(), wdt);
      break;
  }
  fwd_next_ = g + 1;
  if (g == num_groups() - 1) {
    loss_valid_ = true;
    bwd_next_ = g;
  }
}

double BackendMoeModel::AuxLoss() const {
  SSHSDP_CHECK(loss_valid_, PlanError,
               "BackendMoeModel: loss read before the last group's Forward");
  double aux = 0.0;
  for (int l = 0; l < c_.trunk.n_layer; ++l)
    if (c_.IsMoeLayer(l)) aux += blocks_[static_cast<size_t>(l)].aux;
  return aux;
}

double BackendMoeModel::Loss() const { return gpt_->loss() + AuxLoss(); }

void BackendMoeModel::KeepLoss() {
  const double aux = AuxLoss();  // PlanError before the last group's Forward
  gpt_->KeepLoss();
  kept_aux_.push_back(aux);  // only once the trunk kept its half
}

std::vector<double> BackendMoeModel::TakeLosses() {
  const std::vector<double> trunk = gpt_ ? gpt_->TakeLosses() : std::vector<double>{};
  std::vector<double> out = std::exchange(taken_, {});
  const std::vector<double> aux = std::exchange(kept_aux_, {});
  out.insert(out.end(), trunk.begin(), trunk.end());
  SSHSDP_CHECK(out.size() == aux.size(), PlanError,
               "BackendMoeModel: {} kept cross-entropies against {} aux losses", out.size(),
               aux.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] += aux[i];  // as Loss() adds them
  return out;
}

void BackendMoeModel::Backward(int g, const std::vector<TensorRef>& w,
                               const std::vector<TensorRef>& grad, GradWrite mode) {
  SSHSDP_CHECK(gpt_ != nullptr && g == bwd_next_, PlanError,
               "BackendMoeModel Backward({}) out of order: expected group {} (backward runs "
               "{}..0 after the whole forward)",
               g, bwd_next_, num_groups() - 1);
  DType wdt = DType::kF32;
  const std::vector<const void*> p = BackendWeights(b_, "BackendMoeModel", g, w, GroupParams(g),
                                                    GroupConsumesMx(g), DType::kF32, &mx_, &wdt);
  const std::vector<float*> d = BackendGrads("BackendMoeModel", g, grad, p.size());
  const bool acc = mode == GradWrite::kAccumulate;
  const GroupRole r = roles_[static_cast<size_t>(g)];
  const int L = c_.trunk.n_layer;
  const auto router = static_cast<size_t>(slots_.router);
  switch (r.role) {
    case Role::kEmbed:
      gpt_->BackwardGroup(0, p.data(), wdt, d.data(), acc);
      break;
    case Role::kHead:
      gpt_->BackwardGroup(L + 1, p.data(), wdt, d.data(), acc);
      break;
    case Role::kDense:
      gpt_->BackwardGroup(r.layer + 1, p.data(), wdt, d.data(), acc);
      break;
    case Role::kMoe:  // MoeGpt's order: routed experts, router, shared expert
      BackwardRouted(r.layer, p.data() + slots_.w1, wdt, d.data() + slots_.w1, acc);
      BackwardRouter(r.layer, p[router], wdt, d[router], acc);
      BackwardShared(r.layer, p.data() + slots_.w1, wdt, d.data() + slots_.w1, acc);
      gpt_->BackwardAttention(r.layer, p.data(), wdt, d.data(), acc, dln2_);
      break;
    case Role::kExperts:  // dln2_ from the experts; dres (∂/∂ block output) left as is
      BackwardRouted(r.layer, p.data(), wdt, d.data(), acc);
      BackwardShared(r.layer, p.data(), wdt, d.data(), acc);
      break;
    case Role::kAttnRouter:
      BackwardRouter(r.layer, p[router], wdt, d[router], acc);
      gpt_->BackwardAttention(r.layer, p.data(), wdt, d.data(), acc, dln2_);
      break;
  }
  bwd_next_ = g - 1;
}

const BackendMoeModel::Block& BackendMoeModel::Routed(int l) const {
  SSHSDP_CHECK(l >= 0 && l < c_.trunk.n_layer && c_.IsMoeLayer(l), PlanError,
               "BackendMoeModel: block {} is not an MoE block", l);
  SSHSDP_CHECK(static_cast<size_t>(l) < routed_.size() && routed_[static_cast<size_t>(l)],
               PlanError, "BackendMoeModel: routing of block {} read before its forward", l);
  return blocks_[static_cast<size_t>(l)];
}

std::vector<int32_t> BackendMoeModel::Routing(int l) const {
  const Block& A = Routed(l);
  std::vector<int32_t> sel(static_cast<size_t>(int64_t{B_} * T_ * c_.top_k));
  b_.CopyOut(sel.data(), A.sel, sel.size() * sizeof(int32_t));
  return sel;
}

std::vector<int64_t> BackendMoeModel::ExpertTokens(int l) const {
  const Block& A = Routed(l);
  std::vector<int64_t> n(static_cast<size_t>(c_.n_expert));
  for (int e = 0; e < c_.n_expert; ++e)
    n[static_cast<size_t>(e)] = A.offsets_h[e + 1] - A.offsets_h[e];
  return n;
}

int64_t BackendMoeModel::ActivationBytes() const {
  int64_t host =
      static_cast<int64_t>(count_h_.size() * 4 + psum_h_.size() * 8 + frac_h_.size() * 4);
  for (const Block& A : blocks_) host += static_cast<int64_t>(A.offsets_h.size()) * 4;
  return (gpt_ ? gpt_->activation_bytes() : 0) + arena_bytes_ + bf16_bytes_ + mx_.bytes() + host;
}

}  // namespace sshsdp
