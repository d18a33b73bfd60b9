// Layer building blocks shared by the reference models (dense GPT in gpt.cc, MoE GPT in
// moe*.cc): RMSNorm, GELU (tanh), SiLU, row loads from fp32/bf16 tables and runtime-parameter spec
// helpers. Plain llm.c-style forward/backward functions over fp32 activations; factored out of
// gpt.cc unchanged so both models compute bit-identical blocks.
//
//   layers::RmsNormForward(x, gain, y, rstd, rows, d);
//   RuntimeParamSpec s = layers::Single("lnf.g", {d}, UpdateKind::kVector, layers::kOnes);
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sshsdp/params/model.h"

namespace sshsdp::layers {

inline constexpr float kRmsEps = 1e-5f;

inline bool IsFloatType(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// ---- RMSNorm: y = x · rstd · g, rstd = 1/sqrt(mean(x²) + eps). ----
void RmsNormForward(const float* x, const float* g, float* y, float* rstd, int64_t rows, int d);
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

// Row `row` of a [rows, d] fp32/bf16 table as fp32.
void LoadRow(const TensorRef& t, int64_t row, int d, float* out);

// ---- Embeddings: out[b·T + t] = wte[tokens[b·T + t]] + wpe[t], out [B·T, d]. ----
void EmbeddingForward(const TensorRef& wte, const TensorRef& wpe, const int32_t* tokens, int B,
                      int T, int d, float* out);
// Scatter-adds dx [B·T, d] into the wte [vocab, d] and wpe [seq_len, d] gradient views.
// Overwrite mode gives rows that never occur explicit zeros; a bf16 view is summed in the
// fp32 `scratch` and rounded once per element.
void EmbeddingBackward(const float* dx, const int32_t* tokens, int B, int T, int d,
                       const TensorRef& dwte, int64_t vocab, const TensorRef& dwpe, int64_t seq_len,
                       bool accumulate, std::vector<float>& scratch);

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

// ---- Runtime-parameter spec helpers. ----
// A runtime parameter that is a single update part of the same name.
RuntimeParamSpec Single(std::string name, std::vector<int64_t> shape, UpdateKind kind,
                        InitSpec init);
inline InitSpec Normal(float std) { return InitSpec{InitSpec::Kind::kNormal, std}; }
inline constexpr InitSpec kOnes{InitSpec::Kind::kOnes, 0.0f};

}  // namespace sshsdp::layers
