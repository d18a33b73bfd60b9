// MoE router: fp32 router logits, top-k gating (softmax or σ scores, optional
// renormalisation), the Switch-Transformer load-balancing loss and the deterministic token
// permutation (counting sort by expert) that feeds the grouped expert GEMMs, with the
// router's backward through the gates and the aux loss (see moe.h). The steps are numbered
// across this file and moe_experts.cc in the order the MoE MLP runs them.
#include <vector>

#include "sshsdp/kernels/moe_kernels.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

kernels::MoeRouterOptions MoeGpt::RouterOptions() const {
  return {c_.gating == Gating::kSoftmax, c_.renormalize, c_.aux_loss_weight};
}

const float* MoeGpt::RouterF32(const TensorRef& t) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  b_.CastBf16ToF32(static_cast<const bf16*>(t.data), router32_,
                   int64_t{c_.n_expert} * c_.trunk.d_model);
  return router32_;
}

void MoeGpt::ForwardRouter(int l, const TensorRef& router) {
  OpScope scope(profile_, OpCategory::kRouting);  // logits, top-k, gates, aux loss, permutation
  BlockActs& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const kernels::MoeRouterOptions opt = RouterOptions();
  const float* x = trunk_->Ln2(l);

  // 1. Router logits in fp32 (bf16 router weights are widened: routing decisions are made
  //    from fp32 logits, as MoE implementations do for stability), then top-k by logit (ties:
  //    lower expert index first), scores and gates.
  b_.LinearForward(x, kernels::WeightView{RouterF32(router), DType::kF32}, A.score, N, E, d);
  b_.MoeTopK(A.score, N, E, k, opt, A.sel, A.gate);
  // 2. Per expert, its assignments and score sum; 3. on the host (the one wait): f_e, each
  //    expert's rows and the load-balancing loss α·E·Σ_e f_e·P_e.
  b_.MoeExpertStats(A.score, A.sel, N, E, k, opt, count_, psum_);
  b_.CopyOut(count_h_.data(), count_, count_h_.size() * sizeof(int32_t));
  b_.CopyOut(psum_h_.data(), psum_, psum_h_.size() * sizeof(double));
  A.aux = kernels::MoeBalance(count_h_.data(), psum_h_.data(), N, E, k, opt.aux_weight,
                              frac_h_.data(), A.offsets_h.data());
  b_.CopyIn(A.frac, frac_h_.data(), frac_h_.size() * sizeof(float));
  if (c_.aux_pooled) PoolRouterStats(l);
  b_.CopyIn(A.offsets, A.offsets_h.data(), A.offsets_h.size() * sizeof(int32_t));
  // 4. The permutation (counting sort): expert e owns rows [offsets[e], offsets[e+1]), its
  //    tokens in increasing order; then the permuted input.
  b_.MoePermute(A.sel, A.offsets, N, E, k, A.row, A.token);
  b_.GatherRows(x, A.token, A.xp, N * k, d);
  A.routed = true;
}

void MoeGpt::BackwardRouter(int l, const TensorRef& router, const TensorRef& gr, bool acc,
                            float* dx) {
  OpScope scope(profile_, OpCategory::kRouting);
  const BlockActs& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const float* x = trunk_->Ln2(l);

  // 4. Router: ∂/∂score from the gates (through the renormalisation) and from the aux loss,
  //    then through softmax or σ to the logits dz. Pooled: ∂aux/∂p_{t,e} = α·E·C_e/(L·N)²,
  //    the per-block form's α·E·f_e/N with f_e = C_e/(L²·N), the same for every block.
  if (c_.aux_pooled) {
    const double L = NumMoeLayers();
    for (int e = 0; e < E; ++e) frac_h_[e] = static_cast<float>(pool_count_[e] / (L * L * N));
    b_.CopyIn(A.frac, frac_h_.data(), frac_h_.size() * sizeof(float));
  }
  b_.MoeRouterBackward(A.score, A.sel, A.gate, A.frac, dgate_, N, E, k, RouterOptions(), dz_);
  b_.LinearBackwardWeight(dz_, x, DType::kF32, gr.data, gr.dtype, N, E, d, acc);
  b_.LinearBackwardData(dz_, kernels::WeightView{RouterF32(router), DType::kF32}, dx, N, E, d,
                        true);
}

int MoeGpt::NumMoeLayers() const {
  int n = 0;
  for (int l = 0; l < c_.trunk.n_layer; ++l) n += c_.IsMoeLayer(l);
  return n;
}

// aux_pooled: block l's assignment counts and probability sums added to C_e and S_e (reset at
// the first MoE block of a forward).
void MoeGpt::PoolRouterStats(int l) {
  const int E = c_.n_expert;
  int first = 0;
  while (!c_.IsMoeLayer(first)) ++first;
  if (l == first || pool_count_.empty()) {
    pool_count_.assign(E, 0.0);
    pool_psum_.assign(E, 0.0);
  }
  for (int e = 0; e < E; ++e) {
    pool_count_[e] += count_h_[e];
    pool_psum_[e] += psum_h_[e];
  }
}

}  // namespace sshsdp
