// MoE GPT Forward/Backward per runtime group (see moe.h): the execution-order checks and the
// dispatch by the group's role onto the trunk — the dense GPT's pieces (gpt.h: embeddings,
// a block's attention half, dense blocks, head) on the same backend — and an MoE block's MLP:
// the router (moe_router.cc) and the experts (moe_experts.cc).

#include "sshsdp/base/error.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

void MoeGpt::Forward(int g, const std::vector<TensorRef>& w) {
  SSHSDP_CHECK(B_ > 0, PlanError, "MoE GPT Forward({}) before SetBatch", g);
  order_.StartForward(g);
  CheckViews(g, w, "weight");
  const GroupRole r = roles_[g];
  switch (r.role) {
    case Role::kEmbed:
      trunk_->ForwardEmbedding(w);
      break;
    case Role::kHead:
      trunk_->ForwardHead(w);
      break;
    case Role::kDense:
      trunk_->ForwardBlock(r.layer, w);
      break;
    case Role::kMoe:
      trunk_->ForwardAttention(r.layer, w);
      ForwardRouter(r.layer, w[slots_.router]);
      ForwardExperts(r.layer, w.data() + slots_.w1);
      break;
    case Role::kAttnRouter:
      trunk_->ForwardAttention(r.layer, w);
      ForwardRouter(r.layer, w[slots_.router]);
      break;
    case Role::kExperts:
      ForwardExperts(r.layer, w.data());
      break;
  }
  order_.EndForward(g);
}

void MoeGpt::Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                      GradWrite mode) {
  order_.StartBackward(g);
  CheckViews(g, w, "weight");
  CheckViews(g, grad, "gradient");
  const bool acc = mode == GradWrite::kAccumulate;
  const GroupRole r = roles_[g];
  float* dy = trunk_->DRes();   // ∂/∂(block output)
  float* dln = trunk_->DLn2();  // ∂/∂ln2, which the trunk's attention half reads
  switch (r.role) {
    case Role::kHead:
      trunk_->BackwardHead(w, grad, acc);
      break;
    case Role::kEmbed:
      trunk_->BackwardEmbedding(grad, acc);
      break;
    case Role::kDense:
      trunk_->BackwardBlock(r.layer, w, grad, acc);
      break;
    case Role::kMoe: {  // routed experts, router, shared expert, then the attention half
      const TensorRef *wx = w.data() + slots_.w1, *gx = grad.data() + slots_.w1;
      BackwardRouted(r.layer, wx, gx, acc, dy, dln);
      BackwardRouter(r.layer, w[slots_.router], grad[slots_.router], acc, dln);
      BackwardShared(r.layer, wx, gx, acc, dy, dln);
      trunk_->BackwardAttention(r.layer, w, grad, acc);
      break;
    }
    case Role::kExperts:  // ∂/∂ln2 from the experts; ∂/∂(block output) is left as is
      BackwardRouted(r.layer, w.data(), grad.data(), acc, dy, dln);
      BackwardShared(r.layer, w.data(), grad.data(), acc, dy, dln);
      break;
    case Role::kAttnRouter:
      BackwardRouter(r.layer, w[slots_.router], grad[slots_.router], acc, dln);
      trunk_->BackwardAttention(r.layer, w, grad, acc);
      break;
  }
  order_.EndBackward(g);
}

}  // namespace sshsdp
