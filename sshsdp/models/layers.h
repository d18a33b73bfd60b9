// Layer helpers shared by the reference models (dense GPT in gpt.cc, MoE GPT in moe*.cc): the
// runtime-parameter spec helpers, and the fp32 layer kernels — RMSNorm, GELU (tanh), SwiGLU,
// softmax cross-entropy — under their model-layer names (kernels/layer_kernels.h; the models
// run them as the CPU backend's ops).
//
//   RuntimeParamSpec s = layers::Single("lnf.g", {d}, UpdateKind::kVector, layers::kOnes);
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sshsdp/kernels/layer_kernels.h"
#include "sshsdp/kernels/mx_linear.h"
#include "sshsdp/params/model.h"

namespace sshsdp::layers {

inline bool IsFloatType(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// The kernel operand of a weight view (MX views carry their relaid-out scales).
inline kernels::WeightView View(const TensorRef& t) {
  return {t.data, t.dtype, t.scales, t.scale_layout};
}

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

// ---- Runtime-parameter spec helpers. ----
// A runtime parameter that is a single update part of the same name.
RuntimeParamSpec Single(std::string name, std::vector<int64_t> shape, UpdateKind kind,
                        InitSpec init);
inline InitSpec Normal(float std) { return InitSpec{InitSpec::Kind::kNormal, std}; }
inline constexpr InitSpec kOnes{InitSpec::Kind::kOnes, 0.0f};

}  // namespace sshsdp::layers
