// Mixture-of-Experts kernels on fp32 host arrays: the router's top-k gating, load-balancing loss
// and counting-sort permutation (forward and backward), the row gathers that permute tokens to
// their experts and back, and the gated combination of the experts' outputs. The reference MoE
// GPT (models/moe.h) runs them as the CPU backend's MoE ops (backend/backend.h); every other
// backend's MoE ops are checked against them.
//
//   N tokens, E experts, k = top_k; assignment (t, j) is token t's j-th best expert.
//   std::vector<float> score(logits);                          // [N, E] in, scores out
//   MoeTopK(score.data(), N, E, k, opt, sel, gate);            // 1. top-k, scores, gates
//   MoeExpertStats(score.data(), sel, N, E, k, opt, count, psum);     // 2. per expert
//   double aux = MoeBalance(count, psum, N, E, k, opt.aux_weight, frac, offsets);  // 3.
//   MoePermute(sel, offsets, N, E, k, row, token);             // 4. the counting sort
//   MoeGatherRows(x, token, xp, N * k, d);                     // permuted input
//   ... experts on xp's rows [offsets[e], offsets[e+1]) ...
//   MoeCombine(yp, row, gate, out, N, k, d, /*accumulate=*/false);
#pragma once

#include <cstdint>

namespace sshsdp::kernels {

struct MoeRouterOptions {
  bool softmax = true;       // scores softmax(z); false: σ(z)
  bool renormalize = true;   // gates divided by the sum of the k chosen scores
  float aux_weight = 0.01f;  // α of the load-balancing loss
};

// Rows of an expert's grouped GEMM go in chunks of sizes from {2^i} ∪ {3·2^i}, greedy,
// largest first: the first chunk of `rows` rows (every row computed once; a bounded set of
// GEMM shapes, so oneDNN's primitive cache stays small).
int64_t MoeChunkRows(int64_t rows);

// The routing of one batch, four steps (a device runs 1, 2 and 4, the host 3). sel [N·k]: the
// expert of assignment (t, j), best first (ties: lower index); gate [N·k] its gate weight;
// frac [E] f_e = assignments to e / (N·k); offsets [E+1]: expert e owns permuted rows
// [offsets[e], offsets[e+1]) (experts in index order, tokens in index order inside each);
// row [N·k] the permuted row of assignment (t, j); token [N·k] the token of permuted row r.
// 1. Per token: top-k by logit into sel (ties: lower index first), the logits in score turned
//    into scores in place, the k gates (renormalised when asked).
void MoeTopK(float* score, int64_t N, int E, int k, const MoeRouterOptions& opt, int32_t* sel,
             float* gate);
// 2. Per expert: count[e] = assignments to e, psum[e] = Σ_t q_{t,e} in double, t in order (q:
//    the score normalised to sum 1 over the experts: itself for softmax, σ/Σσ).
void MoeExpertStats(const float* score, const int32_t* sel, int64_t N, int E, int k,
                    const MoeRouterOptions& opt, int32_t* count, double* psum);
// 3. frac[e] = count[e] / (N·k), offsets [E+1] (the prefix sums of count), and the returned
//    aux loss α·E·Σ_e f_e·psum[e]/N.
double MoeBalance(const int32_t* count, const double* psum, int64_t N, int E, int k,
                  float aux_weight, float* frac, int32_t* offsets);
// 4. The counting sort: row[t·k+j] = the permuted row of assignment (t, j) (expert sel[t·k+j]'s
//    rows from offsets[e], in assignment order), token[row] = t.
void MoePermute(const int32_t* sel, const int32_t* offsets, int64_t N, int E, int k, int32_t* row,
                int32_t* token);
// dz [N, E] = ∂loss/∂logits from dgate [N·k] = ∂loss/∂gate and the aux loss, through the
// renormalisation and softmax / σ (score, sel, gate, frac as the four steps left them).
void MoeRouterBackward(const float* score, const int32_t* sel, const float* gate, const float* frac,
                       const float* dgate, int64_t N, int E, int k, const MoeRouterOptions& opt,
                       float* dz);

// dst[r] = src[idx[r]] for r < rows, rows of d floats (the permuted input xp = x[token[r]]).
void MoeGatherRows(const float* src, const int32_t* idx, float* dst, int64_t rows, int64_t d);
// out[t] (=|+=) Σ_j gate[t·k+j] · yp[row[t·k+j]], j in order (without accumulate out starts
// at zero): the un-permutation, a per-token gather (deterministic, no races).
void MoeCombine(const float* yp, const int32_t* row, const float* gate, float* out, int64_t N,
                int k, int64_t d, bool accumulate);
// Its backward: dgate[t·k+j] = ⟨dy[t], yp[row]⟩ and dyp[row] = gate[t·k+j] · dy[t] (every
// permuted row written once).
void MoeCombineBackward(const float* dy, const float* yp, const int32_t* row, const float* gate,
                        float* dgate, float* dyp, int64_t N, int k, int64_t d);
// dx[t] = Σ_j dxp[row[t·k+j]], j in order: the permutation's backward.
void MoeUnpermuteSum(const float* dxp, const int32_t* row, float* dx, int64_t N, int k, int64_t d);

}  // namespace sshsdp::kernels
