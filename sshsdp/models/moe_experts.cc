// MoE experts: the grouped GEMM over the permuted rows (per-expert GEMMs on slices of the
// packed [E, out, in] runtime weights over each expert's contiguous rows, MXFP8 weights
// dequantized whole first), the ungated shared expert and the un-permutation that gathers
// every token's k weighted rows, forward and backward (see moe.h), as backend ops. Backward
// writes each expert's weight gradient straight into its slice of the packed gradient view
// (explicit zeros for an expert without tokens in overwrite mode, untouched in accumulate
// mode).
#include "sshsdp/kernels/moe_kernels.h"
#include "sshsdp/kernels/mx_linear.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {
namespace {

// ---- Grouped GEMM over experts. ----
// kernels/matmul caches one oneDNN primitive per exact shape (0.1–0.5 MB each, measured) and
// an expert's token count changes every step, so an expert's rows are multiplied in chunks
// of sizes from {2^i} ∪ {3·2^i} (greedy, largest first): a bounded set of about 2·log2(N·k)
// shapes per matrix, a few calls per expert, every row computed exactly once (no padding).
using kernels::MoeChunkRows;

// Expert e's [out, in] matrix inside a packed [E, out, in] view.
TensorRef Slice(const TensorRef& t, int64_t e, int64_t per_expert) {
  return TensorRef{static_cast<char*>(t.data) + e * per_expert * DTypeSize(t.dtype), t.dtype};
}
kernels::WeightView Operand(const TensorRef& t) { return {t.data, t.dtype}; }

}  // namespace

// y[rows, n] = x[rows, k] · wᵀ, w [n, k].
void MoeGpt::ExpertForward(const float* x, const TensorRef& w, float* y, int64_t rows, int64_t n,
                           int64_t k) {
  for (int64_t r = 0; r < rows;) {
    const int64_t c = MoeChunkRows(rows - r);
    b_.LinearForward(x + r * k, Operand(w), y + r * n, c, n, k);
    r += c;
  }
}

// dx[rows, k] (=|+=) dy[rows, n] · w.
void MoeGpt::ExpertBackwardData(const float* dy, const TensorRef& w, float* dx, int64_t rows,
                                int64_t n, int64_t k, bool acc) {
  for (int64_t r = 0; r < rows;) {
    const int64_t c = MoeChunkRows(rows - r);
    b_.LinearBackwardData(dy + r * n, Operand(w), dx + r * k, c, n, k, acc);
    r += c;
  }
}

// dw[n, k] (=|+=) dyᵀ · x summed over all rows: chunks after the first accumulate; a bf16
// dw that needs several chunks is summed in fp32 scratch and rounded once.
void MoeGpt::ExpertBackwardWeight(const float* dy, const float* x, DType compute, void* dw,
                                  DType dw_dtype, int64_t rows, int64_t n, int64_t k, bool acc) {
  if (MoeChunkRows(rows) == rows) {
    b_.LinearBackwardWeight(dy, x, compute, dw, dw_dtype, rows, n, k, acc);
    return;
  }
  const bool direct = dw_dtype == DType::kF32;
  void* dst = direct ? dw : wgrad_scratch_.Reserve<float>(n * k);
  bool chunk_acc = direct && acc;
  for (int64_t r = 0; r < rows;) {
    const int64_t c = MoeChunkRows(rows - r);
    b_.LinearBackwardWeight(dy + r * n, x + r * k, compute, dst, DType::kF32, c, n, k, chunk_acc);
    chunk_acc = true;
    r += c;
  }
  if (!direct) b_.WriteOrAccumulate(static_cast<float*>(dst), dw, dw_dtype, n * k, acc);
}

// The hidden activation of an expert MLP from its first projection(s).
void MoeGpt::ActivationForward(const float* h1, const float* h3, float* act, int64_t n) {
  if (c_.expert_mlp == ExpertMlp::kSwiGLU) {
    b_.SwigluForward(h1, h3, act, n);
  } else {
    b_.GeluForward(h1, act, n);
  }
}

// In place on dh1 (= ∂/∂act on entry): dh1 = ∂/∂h1, dh3 = ∂/∂h3 (SwiGLU only).
void MoeGpt::ActivationBackward(const float* h1, const float* h3, float* dh1, float* dh3,
                                int64_t n) {
  if (c_.expert_mlp == ExpertMlp::kSwiGLU) {
    b_.SwigluBackward(h1, h3, dh1, dh1, dh3, n);
  } else {
    b_.GeluBackwardInPlace(h1, dh1, n);
  }
}

TensorRef MoeGpt::ExpertView(const TensorRef& t, int64_t rows, int64_t cols, int slot) {
  if (!kernels::IsMxElement(t.dtype)) return t;
  float* out = mx_scratch_[static_cast<size_t>(slot - slots_.w1)]->Reserve<float>(rows * cols);
  b_.MxDequantizeOperand(static_cast<const uint8_t*>(t.data), t.dtype, t.scales, t.scale_layout,
                         rows, cols, out);
  return TensorRef{out, DType::kF32};
}

void MoeGpt::ForwardExperts(int l, const TensorRef* wx) {
  const BlockActs& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const int64_t f = c_.expert_ff(), fs = c_.shared_ff();
  const float* x = trunk_->Ln2(l);
  float* out = trunk_->BlockOut(l);
  auto view = [&](int slot, int64_t rows, int64_t cols) {
    return ExpertView(wx[slot - slots_.w1], rows, cols, slot);
  };

  // 5. Experts: GEMMs on each expert's slice of the packed weights over its rows (an MXFP8
  //    packed weight is dequantized whole first: its scales are laid out for [E·out, in]).
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  TensorRef w1, w2, w3;
  Op(OpCategory::kGemm, [&] {  // an MX weight is dequantized for the products
    w1 = view(slots_.w1, E * f, d);
    w2 = view(slots_.w2, E * d, f);
    if (swiglu) w3 = view(slots_.w3, E * f, d);
  });
  for (int e = 0; e < E; ++e) {
    const int64_t off = A.offsets_h[e], n = A.offsets_h[e + 1] - off;
    if (n == 0) continue;
    const float* xe = A.xp + off * d;
    Op(OpCategory::kGemm, [&] {
      ExpertForward(xe, Slice(w1, e, f * d), A.h1 + off * f, n, f, d);
      if (swiglu) ExpertForward(xe, Slice(w3, e, f * d), A.h3 + off * f, n, f, d);
    });
    Op(OpCategory::kActivation, [&] {
      ActivationForward(A.h1 + off * f, swiglu ? A.h3 + off * f : nullptr, A.act + off * f, n * f);
    });
    Op(OpCategory::kGemm,
       [&] { ExpertForward(A.act + off * f, Slice(w2, e, d * f), A.yp + off * d, n, d, f); });
  }

  // 6. Shared expert (ungated) or zeros, then un-permute: out[t] += Σ_j gate_j · yp[row].
  if (c_.shared_expert) {
    Op(OpCategory::kGemm, [&] {
      b_.LinearForward(x, Operand(view(slots_.s1, fs, d)), A.sh1, N, fs, d);
      if (swiglu) b_.LinearForward(x, Operand(view(slots_.s3, fs, d)), A.sh3, N, fs, d);
    });
    Op(OpCategory::kActivation, [&] { ActivationForward(A.sh1, A.sh3, A.sha, N * fs); });
    Op(OpCategory::kGemm,
       [&] { b_.LinearForward(A.sha, Operand(view(slots_.s2, d, fs)), out, N, d, fs); });
  }
  Op(OpCategory::kRouting, [&] {  // combination: out[t] (+)= Σ_j gate_j · yp[row]
    b_.MoeCombine(A.yp, A.row, A.gate, out, N, k, d, /*accumulate=*/c_.shared_expert);
  });
  Op(OpCategory::kElementwise, [&] { b_.Add(trunk_->ResMid(l), out, out, N * d); });
}

void MoeGpt::BackwardRouted(int l, const TensorRef* wx, const TensorRef* gx, bool acc,
                            const float* dy, float* dx) {
  const BlockActs& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model;
  const int E = c_.n_expert, k = c_.top_k;
  const int64_t f = c_.expert_ff();
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;

  // 1. Un-permutation backward: ∂/∂gate_j = ⟨dy_t, yp[row]⟩ and dyp[row] = gate_j · dy_t
  //    (a permuted copy of the output gradient, every row written once).
  Op(OpCategory::kRouting,
     [&] { b_.MoeCombineBackward(dy, A.yp, A.row, A.gate, dgate_, dyp_, N, k, d); });

  // 2. Experts: weight gradients straight into each expert's slice of the packed gradient
  //    views; dxp = ∂/∂(permuted input). No tokens: explicit zeros (overwrite) or nothing.
  //    MXFP8 weights: the data GEMMs use the dequantized weight, the weight-gradient GEMMs run
  //    in fp32 (the dequantized view's dtype; LinearComputeDType of an MX weight).
  const int x0 = slots_.w1;
  TensorRef w1, w2, w3;
  Op(OpCategory::kGemm, [&] {
    w1 = ExpertView(wx[slots_.w1 - x0], E * f, d, slots_.w1);
    w2 = ExpertView(wx[slots_.w2 - x0], E * d, f, slots_.w2);
    if (swiglu) w3 = ExpertView(wx[slots_.w3 - x0], E * f, d, slots_.w3);
  });
  const TensorRef &g1 = gx[slots_.w1 - x0], &g2 = gx[slots_.w2 - x0];
  const TensorRef g3 = swiglu ? gx[slots_.w3 - x0] : TensorRef{};
  for (int e = 0; e < E; ++e) {
    const int64_t off = A.offsets_h[e], n = A.offsets_h[e + 1] - off;
    if (n == 0) {
      if (!acc) {
        Op(OpCategory::kGemm, [&] {  // an expert without tokens: zero gradients
          const size_t bytes = static_cast<size_t>(f * d) * DTypeSize(g1.dtype);
          b_.Zero(Slice(g1, e, f * d).data, bytes);
          b_.Zero(Slice(g2, e, d * f).data, bytes);
          if (swiglu) b_.Zero(Slice(g3, e, f * d).data, bytes);
        });
      }
      continue;
    }
    const float* xe = A.xp + off * d;
    const float* dye = dyp_ + off * d;
    float* dh1 = dh1_ + off * f;
    float* dh3 = swiglu ? dh3_ + off * f : nullptr;
    float* dxe = dxp_ + off * d;
    Op(OpCategory::kGemm, [&] {
      ExpertBackwardWeight(dye, A.act + off * f, w2.dtype, Slice(g2, e, d * f).data, g2.dtype, n, d,
                           f, acc);
      ExpertBackwardData(dye, Slice(w2, e, d * f), dh1, n, d, f, false);
    });
    Op(OpCategory::kActivation, [&] {
      ActivationBackward(A.h1 + off * f, swiglu ? A.h3 + off * f : nullptr, dh1, dh3, n * f);
    });
    Op(OpCategory::kGemm, [&] {
      ExpertBackwardWeight(dh1, xe, w1.dtype, Slice(g1, e, f * d).data, g1.dtype, n, f, d, acc);
      ExpertBackwardData(dh1, Slice(w1, e, f * d), dxe, n, f, d, false);
      if (swiglu) {
        ExpertBackwardWeight(dh3, xe, w3.dtype, Slice(g3, e, f * d).data, g3.dtype, n, f, d, acc);
        ExpertBackwardData(dh3, Slice(w3, e, f * d), dxe, n, f, d, true);
      }
    });
  }

  // 3. Un-permute the input gradient: dx_t = Σ_j dxp[row(t, j)] (a gather: deterministic).
  Op(OpCategory::kRouting, [&] { b_.MoeUnpermuteSum(dxp_, A.row, dx, N, k, d); });
}

void MoeGpt::BackwardShared(int l, const TensorRef* wx, const TensorRef* gx, bool acc,
                            const float* dy, float* dx) {
  // 5. Shared expert: a dense MLP on x.
  if (!c_.shared_expert) return;
  const BlockActs& A = blocks_[static_cast<size_t>(l)];
  const int64_t N = static_cast<int64_t>(B_) * T_, d = c_.trunk.d_model, fs = c_.shared_ff();
  const bool swiglu = c_.expert_mlp == ExpertMlp::kSwiGLU;
  const float* x = trunk_->Ln2(l);
  const int x0 = slots_.w1;
  const TensorRef &gs1 = gx[slots_.s1 - x0], &gs2 = gx[slots_.s2 - x0];
  TensorRef s1;
  Op(OpCategory::kGemm, [&] {
    s1 = ExpertView(wx[slots_.s1 - x0], fs, d, slots_.s1);
    const TensorRef s2 = ExpertView(wx[slots_.s2 - x0], d, fs, slots_.s2);
    b_.LinearBackwardWeight(dy, A.sha, s2.dtype, gs2.data, gs2.dtype, N, d, fs, acc);
    b_.LinearBackwardData(dy, Operand(s2), dsh1_, N, d, fs, false);
  });
  Op(OpCategory::kActivation, [&] { ActivationBackward(A.sh1, A.sh3, dsh1_, dsh3_, N * fs); });
  OpScope gemm(profile_, OpCategory::kGemm);
  b_.LinearBackwardWeight(dsh1_, x, s1.dtype, gs1.data, gs1.dtype, N, fs, d, acc);
  b_.LinearBackwardData(dsh1_, Operand(s1), dx, N, fs, d, true);
  if (swiglu) {
    const TensorRef s3 = ExpertView(wx[slots_.s3 - x0], fs, d, slots_.s3);
    const TensorRef& gs3 = gx[slots_.s3 - x0];
    b_.LinearBackwardWeight(dsh3_, x, s3.dtype, gs3.data, gs3.dtype, N, fs, d, acc);
    b_.LinearBackwardData(dsh3_, Operand(s3), dx, N, fs, d, true);
  }
}

}  // namespace sshsdp
