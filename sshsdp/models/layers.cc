// Shared layer code of the reference models (see layers.h): the runtime-parameter spec
// helpers. The fp32 layer kernels (RMSNorm, GELU, SwiGLU, cross-entropy) are
// kernels/layer_kernels.cc; the models run them as backend ops.
#include "sshsdp/models/layers.h"

#include <utility>

namespace sshsdp::layers {

RuntimeParamSpec Single(std::string name, std::vector<int64_t> shape, UpdateKind kind,
                        InitSpec init) {
  RuntimeParamSpec s{name, shape, {}};
  s.parts.push_back(UpdatePart{std::move(name), std::move(shape), 0, kind, init});
  return s;
}

}  // namespace sshsdp::layers
