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

namespace sshsdp {
namespace {

using kernels::LinearBackwardData;
using kernels::LinearBackwardWeight;
using kernels::LinearForward;

}  // namespace

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

void MoeGpt::BackwardRouter(int l, const TensorRef& router, const TensorRef& gr, bool acc,
                            float* dx) {
  OpScope scope(profile_, OpCategory::kRouting);
  const BlockActs& A = blocks_[l];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const float* x = A.ln2;

  // 4. Router: ∂/∂score from the gates (through the renormalisation) and from the aux loss,
  //    then through softmax or σ to the logits dz.
  std::vector<double> c_aux(E);  // ∂aux/∂q_{t,e}, the same for every token
  for (int e = 0; e < E; ++e) {
    c_aux[e] = c_.aux_loss_weight * E * A.frac[e] / static_cast<double>(N);
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

}  // namespace sshsdp
