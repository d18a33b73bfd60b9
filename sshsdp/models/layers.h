// Layer building blocks shared by the reference models (dense GPT in gpt.cc, MoE GPT in
// moe*.cc): the fp32 layer kernels — RMSNorm, GELU (tanh), SwiGLU, softmax cross-entropy —
// re-exported from kernels/layer_kernels.h, row loads from fp32/bf16 tables, the embeddings
// and runtime-parameter spec helpers. Plain llm.c-style forward/backward functions over fp32
// activations, so both models compute bit-identical blocks.
//
//   layers::RmsNormForward(x, gain, y, rstd, rows, d);
//   RuntimeParamSpec s = layers::Single("lnf.g", {d}, UpdateKind::kVector, layers::kOnes);
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sshsdp/kernels/layer_kernels.h"
#include "sshsdp/params/model.h"

namespace sshsdp::layers {

inline bool IsFloatType(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// The fp32 layer kernels (kernels/layer_kernels.h), under their model-layer names.
using kernels::FastTanh;
using kernels::GeluBackwardInPlace;
using kernels::GeluForward;
using kernels::kGeluC;
using kernels::kRmsEps;
using kernels::RmsNormBackward;
using kernels::RmsNormForward;
using kernels::SoftmaxCrossEntropyBackward;
using kernels::SoftmaxCrossEntropyForward;
using kernels::SwigluBackward;
using kernels::SwigluForward;

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

// ---- Runtime-parameter spec helpers. ----
// A runtime parameter that is a single update part of the same name.
RuntimeParamSpec Single(std::string name, std::vector<int64_t> shape, UpdateKind kind,
                        InitSpec init);
inline InitSpec Normal(float std) { return InitSpec{InitSpec::Kind::kNormal, std}; }
inline constexpr InitSpec kOnes{InitSpec::Kind::kOnes, 0.0f};

}  // namespace sshsdp::layers
