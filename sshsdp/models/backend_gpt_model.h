// BackendGptModel: the dense GPT as a Model (params/model.h) whose kernels run on a device
// backend (device/backend.h) — the engine trains it like Gpt, handing it views of its flat
// buffers, and every layer op is the backend's (BackendGpt's per-group functions). With the
// CPU backend it gives Gpt's training run through the engine at every layout
// (engine_backend_gpt_test); it is the model side of the engine on a GPU (EngineConfig::backend:
// the engine's views are then that backend's memory).
//
// fp32 or bf16 runtime weights (every view of a group in one dtype; bf16 as Gpt runs it: see
// BackendGpt), fp32 gradients (ConfigError otherwise: --reduce fp32), the packed QKV layout
// (GptConfig::packed_qkv), no MXFP8.
//
//   std::unique_ptr<Backend> cpu = MakeBackend("cpu");
//   BackendGptModel model(*cpu, GptConfig::Preset("small"));
//   EngineConfig cfg;  cfg.weight_dtype = DType::kF32;
//   Engine engine(model, *world, cfg);                   // as with Gpt
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sshsdp/device/backend.h"
#include "sshsdp/models/backend_gpt.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {

class BackendGptModel final : public Model {
 public:
  // ConfigError unless c.packed_qkv.
  BackendGptModel(Backend& b, const GptConfig& c);

  int num_groups() const override { return spec_.num_groups(); }
  std::vector<RuntimeParamSpec> GroupParams(int g) const override { return spec_.GroupParams(g); }
  // Sizes the backend's activations for (B, T) when they change, and copies the batch in.
  void SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) override;
  void Forward(int g, const std::vector<TensorRef>& w) override;
  double Loss() const override;
  void Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                GradWrite mode) override;
  double FlopsPerToken() const override { return spec_.FlopsPerToken(); }
  int64_t ActivationBytes() const override { return gpt_ ? gpt_->activation_bytes() : 0; }

 private:
  // The fp32 pointers of group g's views (PlanError / ConfigError naming the view otherwise).
  // Weight views as pointers and their one dtype (fp32 or bf16); gradient views as fp32.
  std::vector<const void*> Weights(int g, const std::vector<TensorRef>& v, DType* dtype) const;
  std::vector<float*> Grads(int g, const std::vector<TensorRef>& v) const;

  Backend& b_;
  Gpt spec_;  // the runtime parameters and FLOPs (no activations: never given a batch)
  std::unique_ptr<BackendGpt> gpt_;
  int fwd_next_ = 0, bwd_next_ = -1;
  bool loss_valid_ = false;
};

}  // namespace sshsdp
