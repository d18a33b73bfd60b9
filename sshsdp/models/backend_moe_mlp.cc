// BackendMoeModel's MoE MLP (backend_moe.h): moe_router.cc and moe_experts.cc op for op on a
// device backend — the router (its GEMMs and kernels/moe_kernels.h's steps as backend ops, the
// per-expert counts read back once), the grouped expert GEMMs on slices of the packed weights in
// MoeGpt's row chunks, the shared expert, and the permutation ops (Backend::GatherRows,
// MoeCombine, MoeCombineBackward, MoeUnpermuteSum).
#include <algorithm>

#include "sshsdp/kernels/moe_kernels.h"
#include "sshsdp/models/backend_moe.h"

namespace sshsdp {
namespace {

// Expert e's [out, in] matrix inside a packed [E, out, in] weight or gradient.
const void* Slice(const void* w, DType wdt, int64_t e, int64_t per_expert) {
  return static_cast<const char*>(w) + e * per_expert * static_cast<int64_t>(DTypeSize(wdt));
}

}  // namespace

// ---- kernels/matmul.h's linear layers on the backend (BackendGpt's rules). ----

void BackendMoeModel::Linear(const float* x, const void* w, DType wdt, float* y, int64_t m,
                             int64_t n, int64_t k) {
  if (wdt == DType::kF32) {
    b_.Gemm(false, true, m, n, k, x, static_cast<const float*>(w), y, false);
    return;
  }
  RequireBf16Scratch();
  b_.CastF32ToBf16(x, x16_, m * k);
  b_.GemmBf16(false, true, m, n, k, x16_, static_cast<const bf16*>(w), y, false);
}

void BackendMoeModel::LinearBackwardData(const float* dy, const void* w, DType wdt, float* dx,
                                         int64_t m, int64_t n, int64_t k, bool acc) {
  if (wdt == DType::kF32) {
    b_.Gemm(false, false, m, k, n, dy, static_cast<const float*>(w), dx, acc);
    return;
  }
  RequireBf16Scratch();
  b_.CastF32ToBf16(dy, dy16_, m * n);
  b_.GemmBf16(false, false, m, k, n, dy16_, static_cast<const bf16*>(w), dx, acc);
}

void BackendMoeModel::LinearBackwardWeight(const float* dy, const float* x, DType wdt, float* dw,
                                           int64_t m, int64_t n, int64_t k, bool acc) {
  if (wdt == DType::kF32) {
    b_.Gemm(true, false, n, k, m, dy, x, dw, acc);
    return;
  }
  RequireBf16Scratch();
  b_.CastF32ToBf16(dy, dy16_, m * n);
  b_.CastF32ToBf16(x, x16_, m * k);
  b_.GemmBf16(true, false, n, k, m, dy16_, x16_, dw, acc);
}

void BackendMoeModel::ExpertForward(const float* x, const void* w, DType wdt, float* y,
                                    int64_t rows, int64_t n, int64_t k) {
  for (int64_t r = 0; r < rows;) {
    const int64_t c = kernels::MoeChunkRows(rows - r);
    Linear(x + r * k, w, wdt, y + r * n, c, n, k);
    r += c;
  }
}

void BackendMoeModel::ExpertBackwardData(const float* dy, const void* w, DType wdt, float* dx,
                                         int64_t rows, int64_t n, int64_t k, bool acc) {
  for (int64_t r = 0; r < rows;) {
    const int64_t c = kernels::MoeChunkRows(rows - r);
    LinearBackwardData(dy + r * n, w, wdt, dx + r * k, c, n, k, acc);
    r += c;
  }
}

// fp32 dw: chunks after the first accumulate (moe_experts.cc's ExpertBackwardWeight).
void BackendMoeModel::ExpertBackwardWeight(const float* dy, const float* x, DType wdt, float* dw,
                                           int64_t rows, int64_t n, int64_t k, bool acc) {
  for (int64_t r = 0; r < rows;) {
    const int64_t c = kernels::MoeChunkRows(rows - r);
    LinearBackwardWeight(dy + r * n, x + r * k, wdt, dw, c, n, k, acc);
    acc = true;
    r += c;
  }
}

const float* BackendMoeModel::RouterF32(const void* router, DType wdt) {
  if (wdt == DType::kF32) return static_cast<const float*>(router);
  b_.CastBf16ToF32(static_cast<const bf16*>(router), router32_,
                   int64_t{c_.n_expert} * c_.trunk.d_model);
  return router32_;
}

// ---- Forward. ----

void BackendMoeModel::ForwardRouter(int l, const void* router, DType wdt) {
  Block& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = int64_t{B_} * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const kernels::MoeRouterOptions opt{c_.gating == Gating::kSoftmax, c_.renormalize,
                                      c_.aux_loss_weight};
  // 1. fp32 logits, then top-k, scores and gates; 2. per expert counts and score sums.
  b_.Gemm(false, true, N, E, d, gpt_->ln2(l), RouterF32(router, wdt), A.score, false);
  b_.MoeTopK(A.score, N, E, k, opt, A.sel, A.gate);
  b_.MoeExpertStats(A.score, A.sel, N, E, k, opt, count_, psum_);
  // 3. On the host (the wait): f_e, each expert's rows, the aux loss.
  b_.CopyOut(count_h_.data(), count_, count_h_.size() * sizeof(int32_t));
  b_.CopyOut(psum_h_.data(), psum_, psum_h_.size() * sizeof(double));
  A.aux = kernels::MoeBalance(count_h_.data(), psum_h_.data(), N, E, k, opt.aux_weight,
                              frac_h_.data(), A.offsets_h.data());
  b_.CopyIn(A.frac, frac_h_.data(), frac_h_.size() * sizeof(float));
  b_.CopyIn(A.offsets, A.offsets_h.data(), A.offsets_h.size() * sizeof(int32_t));
  // 4. The counting sort and the permuted input.
  b_.MoePermute(A.sel, A.offsets, N, E, k, A.row, A.token);
  b_.GatherRows(gpt_->ln2(l), A.token, A.xp, N * k, d);
  routed_[static_cast<size_t>(l)] = 1;
}

void BackendMoeModel::ForwardExperts(int l, const void* const* wx, DType wdt) {
  Block& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = int64_t{B_} * T_, d = c_.trunk.d_model, f = c_.expert_ff(), fs = c_.shared_ff();
  const int E = c_.n_expert, k = c_.top_k;
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  auto view = [&](int slot) { return wx[slot - slots_.w1]; };
  // 5. Experts on their rows of the permuted input.
  for (int e = 0; e < E; ++e) {
    const int64_t off = A.offsets_h[e], n = A.offsets_h[e + 1] - off;
    if (n == 0) continue;
    const float* xe = A.xp + off * d;
    ExpertForward(xe, Slice(view(slots_.w1), wdt, e, f * d), wdt, A.h1 + off * f, n, f, d);
    if (swiglu) {
      ExpertForward(xe, Slice(view(slots_.w3), wdt, e, f * d), wdt, A.h3 + off * f, n, f, d);
      b_.SwigluForward(A.h1 + off * f, A.h3 + off * f, A.act + off * f, n * f);
    } else {
      b_.GeluForward(A.h1 + off * f, A.act + off * f, n * f);
    }
    ExpertForward(A.act + off * f, Slice(view(slots_.w2), wdt, e, d * f), wdt, A.yp + off * d, n, d,
                  f);
  }
  // 6. Shared expert (ungated), then out (+)= Σ_j gate_j · yp[row], then the residual.
  const float* x = gpt_->ln2(l);
  float* out = gpt_->block_output(l);
  if (c_.shared_expert) {
    Linear(x, view(slots_.s1), wdt, A.sh1, N, fs, d);
    if (swiglu) {
      Linear(x, view(slots_.s3), wdt, A.sh3, N, fs, d);
      b_.SwigluForward(A.sh1, A.sh3, A.sha, N * fs);
    } else {
      b_.GeluForward(A.sh1, A.sha, N * fs);
    }
    Linear(A.sha, view(slots_.s2), wdt, out, N, d, fs);
  }
  b_.MoeCombine(A.yp, A.row, A.gate, out, N, k, d, /*accumulate=*/c_.shared_expert);
  b_.Add(gpt_->res_mid(l), out, out, N * d);
}

// ---- Backward. ----

void BackendMoeModel::BackwardRouted(int l, const void* const* wx, DType wdt, float* const* gx,
                                     bool acc) {
  const Block& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = int64_t{B_} * T_, d = c_.trunk.d_model, f = c_.expert_ff();
  const int E = c_.n_expert, k = c_.top_k;
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  const float* dy = gpt_->dres();
  // 1. Un-permutation backward: ∂/∂gate and the permuted output gradient.
  b_.MoeCombineBackward(dy, A.yp, A.row, A.gate, dgate_, dyp_, N, k, d);
  // 2. Experts: weight gradients straight into each expert's slice of the packed gradients.
  const int x0 = slots_.w1;
  const void *w1 = wx[slots_.w1 - x0], *w2 = wx[slots_.w2 - x0];
  const void* w3 = swiglu ? wx[slots_.w3 - x0] : nullptr;
  float *g1 = gx[slots_.w1 - x0], *g2 = gx[slots_.w2 - x0];
  float* g3 = swiglu ? gx[slots_.w3 - x0] : nullptr;
  for (int e = 0; e < E; ++e) {
    const int64_t off = A.offsets_h[e], n = A.offsets_h[e + 1] - off;
    if (n == 0) {
      if (!acc) {  // an expert without tokens: zero gradients
        b_.Fill(g1 + e * f * d, f * d, 0.0f);
        b_.Fill(g2 + e * d * f, d * f, 0.0f);
        if (swiglu) b_.Fill(g3 + e * f * d, f * d, 0.0f);
      }
      continue;
    }
    const float* xe = A.xp + off * d;
    const float* dye = dyp_ + off * d;
    float* dh1 = dh1_ + off * f;
    float* dh3 = dh3_ + off * f;
    float* dxe = dxp_ + off * d;
    ExpertBackwardWeight(dye, A.act + off * f, wdt, g2 + e * d * f, n, d, f, acc);
    ExpertBackwardData(dye, Slice(w2, wdt, e, d * f), wdt, dh1, n, d, f, false);
    if (swiglu) {
      b_.SwigluBackward(A.h1 + off * f, A.h3 + off * f, dh1, dh1, dh3, n * f);
    } else {
      b_.GeluBackwardInPlace(A.h1 + off * f, dh1, n * f);
    }
    ExpertBackwardWeight(dh1, xe, wdt, g1 + e * f * d, n, f, d, acc);
    ExpertBackwardData(dh1, Slice(w1, wdt, e, f * d), wdt, dxe, n, f, d, false);
    if (swiglu) {
      ExpertBackwardWeight(dh3, xe, wdt, g3 + e * f * d, n, f, d, acc);
      ExpertBackwardData(dh3, Slice(w3, wdt, e, f * d), wdt, dxe, n, f, d, true);
    }
  }
  // 3. Un-permute the input gradient: dln2 = Σ_j dxp[row(t, j)].
  b_.MoeUnpermuteSum(dxp_, A.row, dln2_, N, k, d);
}

void BackendMoeModel::BackwardShared(int l, const void* const* wx, DType wdt, float* const* gx,
                                     bool acc) {
  if (!c_.shared_expert) return;
  const Block& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = int64_t{B_} * T_, d = c_.trunk.d_model, fs = c_.shared_ff();
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  const float* dy = gpt_->dres();
  const float* x = gpt_->ln2(l);
  const int x0 = slots_.w1;
  LinearBackwardWeight(dy, A.sha, wdt, gx[slots_.s2 - x0], N, d, fs, acc);
  LinearBackwardData(dy, wx[slots_.s2 - x0], wdt, dsh1_, N, d, fs, false);
  if (swiglu) {
    b_.SwigluBackward(A.sh1, A.sh3, dsh1_, dsh1_, dsh3_, N * fs);
  } else {
    b_.GeluBackwardInPlace(A.sh1, dsh1_, N * fs);
  }
  LinearBackwardWeight(dsh1_, x, wdt, gx[slots_.s1 - x0], N, fs, d, acc);
  LinearBackwardData(dsh1_, wx[slots_.s1 - x0], wdt, dln2_, N, fs, d, true);
  if (swiglu) {
    LinearBackwardWeight(dsh3_, x, wdt, gx[slots_.s3 - x0], N, fs, d, acc);
    LinearBackwardData(dsh3_, wx[slots_.s3 - x0], wdt, dln2_, N, fs, d, true);
  }
}

void BackendMoeModel::BackwardRouter(int l, const void* router, DType wdt, float* grad, bool acc) {
  const Block& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = int64_t{B_} * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  // ∂/∂logits through the renormalisation, softmax / σ and the aux loss; the GEMMs in fp32.
  b_.MoeRouterBackward(A.score, A.sel, A.gate, A.frac, dgate_, N, E, k,
                       {c_.gating == Gating::kSoftmax, c_.renormalize, c_.aux_loss_weight}, dz_);
  b_.Gemm(true, false, E, d, N, dz_, gpt_->ln2(l), grad, acc);
  b_.Gemm(false, false, N, d, E, dz_, RouterF32(router, wdt), dln2_, true);
}

}  // namespace sshsdp
