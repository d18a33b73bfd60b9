// Layer kernels of the reference models on fp32 activations, as llm.c-style forward /
// backward pairs: RMSNorm, GELU (tanh), SwiGLU, softmax cross-entropy. The models use them as
// layers:: (models/layers.h); a device backend (backend/backend.h) offers them as the CPU
// reference its own kernels are checked against. Rows or elements go to the process's
// kernel threads (parallel.h), with the same bits at any thread count.
//
//   RmsNormForward(x, g, y, rstd, rows, d);
//   double sum = SoftmaxCrossEntropyForward(logits, targets, losses, rows, V, ld);
#pragma once

#include <cmath>
#include <cstdint>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp::kernels {

inline constexpr float kRmsEps = 1e-5f;

// ---- RMSNorm: y = x · rstd · g, rstd = 1/sqrt(mean(x²) + eps) (Hugging Face's order of
// operations: x·rstd first, then the gain). ----
void RmsNormForward(const float* x, const float* g, float* y, float* rstd, int64_t rows, int d,
                    float eps = kRmsEps);
// dx (+)= ∂/∂x, dg = Σ_rows dy·x·rstd (overwritten).
void RmsNormBackward(const float* dy, const float* x, const float* g, const float* rstd, float* dx,
                     float* dg, int64_t rows, int d, bool accumulate_dx);

// ---- GELU, tanh approximation. ----
inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/π)
// tanh(z) = 1 − 2/(e^{2z} + 1): one expf instead of libm's slower tanhf; saturates correctly
// (e^{2z} = inf gives 1, e^{2z} = 0 gives −1). Absolute error a few fp32 ulps of 1. The
// scalar reference the vectorised GELU below is tested against.
inline float FastTanh(float z) { return 1.0f - 2.0f / (std::exp(2.0f * z) + 1.0f); }
// GELU forward/backward run a branch-free polynomial e^x (range reduction by ln 2, degree-6
// polynomial, exponent built in the bits; |z| clamped to 10, where tanh is ±1 in fp32) that
// the compiler vectorises, built for AVX-512, AVX2 and the baseline ISA and picked at load
// time. Within 2e-7 absolute of FastTanh over the fp32 range (layers_test).
void GeluForward(const float* x, float* y, int64_t n);
// dx = dy · gelu'(x), in place on dy.
void GeluBackwardInPlace(const float* x, float* dy, int64_t n);

// ---- SwiGLU: a = silu(h1) ⊙ h3, silu(z) = z·σ(z). ----
void SwigluForward(const float* h1, const float* h3, float* a, int64_t n);
// From da: dh1 = da·h3·silu'(h1) and dh3 = da·silu(h1). da may alias dh1 or dh3 (each
// element is read before either output is written).
void SwigluBackward(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
                    int64_t n);

// ---- Softmax cross-entropy over [rows, ld] logits, the first V columns real. ----
// In place: logits become probabilities, losses[r] = lse − logit[target]; returns Σ losses.
// Columns V..ld-1 (a vocabulary padded to a GEMM-friendly width, gpt.h) take no probability
// mass: they become 0 and never enter the sum. One vectorised fp32 exp per logit (the same
// polynomial as GELU's), the log-sum-exp in double; within 1e-6 of a double-precision
// evaluation (layers_test).
double SoftmaxCrossEntropyForward(float* logits, const int32_t* targets, float* losses,
                                  int64_t rows, int64_t V, int64_t ld);
// dlogits = scale · (probs − onehot(target)) over [rows, ld], overwritten (padded columns 0).
void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits,
                                 int64_t rows, int64_t ld, float scale);

// ---- bf16 outputs, for the input of a linear layer with a bf16 weight (matmul.h's
// LinearInput). Each equals its fp32 kernel followed by CastToBf16 bit for bit (layers_test),
// in one pass: the fp32 values go through a small per-thread buffer, never a full-size fp32
// array. ----
void RmsNormForwardBf16(const float* x, const float* g, bf16* y, float* rstd, int64_t rows, int d,
                        float eps = kRmsEps);
void GeluForwardBf16(const float* x, bf16* y, int64_t n);
// dx = dy · gelu'(x) rounded to bf16 (dy is not modified).
void GeluBackwardBf16(const float* x, const float* dy, bf16* dx, int64_t n);
void SoftmaxCrossEntropyBackwardBf16(const float* probs, const int32_t* targets, bf16* dlogits,
                                     int64_t rows, int64_t ld, float scale);

// ---- Embeddings over fp32 tables: out[b·T + t] = wte[tokens[b·T + t]] + wpe[t]; a null wpe
// (dwpe) is a model without learned positions (the Llama family): the token rows alone. ----
// (models/layers.h's EmbeddingForward/Backward take fp32 or bf16 runtime views; these are
// their fp32 case, the device backends' reference.)
void EmbeddingForwardF32(const float* wte, const float* wpe, const int32_t* tokens, int B, int T,
                         int d, float* out);
// dwte [vocab, d], dwpe [≥ T, d] (=|+=) the scatter-add of dx [B·T, d], samples then positions
// in order (repeated tokens add up); without accumulate every row is overwritten (zeros for
// tokens that never occur).
void EmbeddingBackwardF32(const float* dx, const int32_t* tokens, int B, int T, int d, float* dwte,
                          int64_t vocab, float* dwpe, int64_t seq_len, bool accumulate);

}  // namespace sshsdp::kernels
