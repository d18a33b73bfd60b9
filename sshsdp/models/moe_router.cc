// MoE router: fp32 router logits, top-k gating (softmax or σ scores, optional
// renormalisation), the Switch-Transformer load-balancing loss and the deterministic token
// permutation (counting sort by expert) that feeds the grouped expert GEMMs, with the
// router's backward through the gates and the aux loss (see moe.h). The steps are numbered
// across this file and moe_experts.cc in the order the MoE MLP runs them.
#include "sshsdp/models/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/moe_kernels.h"

namespace sshsdp {
namespace {

using kernels::LinearBackwardData;
using kernels::LinearBackwardWeight;
using kernels::LinearForward;

}  // namespace

kernels::MoeRouterOptions MoeGpt::RouterOptions() const {
  return {c_.gating == Gating::kSoftmax, c_.renormalize, c_.aux_loss_weight};
}

const float* MoeGpt::RouterF32(const TensorRef& t) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  const size_t n = static_cast<size_t>(c_.n_expert) * c_.trunk.d_model;
  router_scratch_.resize(n);
  Bf16ToFloat(static_cast<const bf16*>(t.data), router_scratch_.data(), n);
  return router_scratch_.data();
}

void MoeGpt::ForwardRouter(int l, const TensorRef& router) {
  OpScope scope(profile_, OpCategory::kRouting);  // logits, top-k, gates, aux loss, permutation
  BlockActs& A = blocks_[l];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const float* x = A.ln2;

  // 1. Router logits in fp32 (bf16 router weights are widened: routing decisions are made
  //    from fp32 logits, as MoE implementations do for stability).
  LinearForward(x, RouterF32(router), DType::kF32, A.score, N, E, d);

  // 2.–4. Top-k by logit (ties: lower expert index first), scores and gates, the
  //    load-balancing loss α·E·Σ_e f_e·P_e, and the permutation (counting sort): expert e owns
  //    rows [offsets[e], offsets[e+1]), its tokens in increasing order (kernels/moe_kernels.h).
  A.aux = kernels::MoeRoute(A.score, N, E, k, RouterOptions(),
                            {A.sel, A.gate, A.frac, A.offsets, A.row, A.token});
  kernels::MoeGatherRows(x, A.token, A.xp, N * k, d);
}

void MoeGpt::BackwardRouter(int l, const TensorRef& router, const TensorRef& gr, bool acc,
                            float* dx) {
  OpScope scope(profile_, OpCategory::kRouting);
  const BlockActs& A = blocks_[l];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const float* x = A.ln2;

  // 4. Router: ∂/∂score from the gates (through the renormalisation) and from the aux loss,
  //    then through softmax or σ to the logits dz.
  kernels::MoeRouterBackward(A.score, A.sel, A.gate, A.frac, dgate_, N, E, k, RouterOptions(), dz_);
  LinearBackwardWeight(dz_, x, DType::kF32, gr.data, gr.dtype, N, E, d, acc);
  LinearBackwardData(dz_, RouterF32(router), DType::kF32, dx, N, E, d, true);
}

}  // namespace sshsdp
