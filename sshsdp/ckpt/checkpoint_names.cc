// Tensor names and shapes: a model's update parameters, mismatch messages, and initial
// weights from safetensors checked against them (see checkpoint.h).
#include <algorithm>
#include <cmath>
#include <map>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/layout/tensor_list.h"

namespace sshsdp {

std::vector<TensorSpec> ModelTensors(const Model& model) {
  std::vector<TensorSpec> out;
  for (int g = 0; g < model.num_groups(); ++g)
    for (const RuntimeParamSpec& rp : model.GroupParams(g))
      for (const UpdatePart& p : rp.parts) out.push_back({p.name, p.shape});
  return out;
}

std::string DescribeTensorMismatch(const std::vector<TensorSpec>& want,
                                   const std::vector<TensorSpec>& have, const std::string& source,
                                   int max_listed) {
  std::map<std::string, const TensorSpec*> w, h;
  for (const auto& t : want) w[t.name] = &t;
  for (const auto& t : have) h[t.name] = &t;
  std::vector<std::string> lines;
  for (const auto& t : want) {
    auto it = h.find(t.name);
    if (it == h.end())
      lines.push_back(fmt::format("'{}' {} is missing in the file", t.name, ShapeString(t.shape)));
    else if (it->second->shape != t.shape)
      lines.push_back(fmt::format("'{}' has shape {} in the file, the model needs {}", t.name,
                                  ShapeString(it->second->shape), ShapeString(t.shape)));
  }
  for (const auto& t : have)
    if (!w.count(t.name))
      lines.push_back(fmt::format("'{}' {} in the file is not a parameter of this model", t.name,
                                  ShapeString(t.shape)));
  if (lines.empty()) return {};
  const size_t n = std::min<size_t>(lines.size(), static_cast<size_t>(std::max(max_listed, 1)));
  std::string s = fmt::format(
      "{}: does not match this model ({} parameters; the file has {}): {} mismatch{}, first {}:",
      source, want.size(), have.size(), lines.size(), lines.size() == 1 ? "" : "es", n);
  for (size_t i = 0; i < n; ++i) s += "\n  " + lines[i];
  return s;
}

std::map<std::string, std::vector<float>> ReadInitWeights(const std::string& path,
                                                          const std::vector<TensorSpec>& want) {
  auto tensors = ReadSafetensors(path);
  std::vector<TensorSpec> have;
  for (const auto& [name, t] : tensors) have.push_back({name, t.shape});
  const std::string mismatch = DescribeTensorMismatch(want, have, path);
  SSHSDP_CHECK(mismatch.empty(), ConfigError, "{}", mismatch);
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, t] : tensors) {
    // A NaN or Inf would train to a NaN loss from the first step: refuse it here.
    const auto bad =
        std::find_if(t.data.begin(), t.data.end(), [](float v) { return !std::isfinite(v); });
    SSHSDP_CHECK(bad == t.data.end(), ConfigError,
                 "{}: tensor '{}' holds a non-finite value ({} at element {}); initial weights "
                 "must be finite",
                 path, name, *bad, bad - t.data.begin());
    out[name] = std::move(t.data);
  }
  return out;
}

}  // namespace sshsdp
