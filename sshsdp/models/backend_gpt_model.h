// BackendGptModel: the dense GPT as a Model (params/model.h) whose kernels run on a device
// backend (backend/backend.h) — the engine trains it like Gpt, handing it views of its flat
// buffers, and every layer op is the backend's (BackendGpt's per-group functions). With the
// CPU backend it gives Gpt's training run through the engine at every layout
// (engine_backend_gpt_test); it is the model side of the engine on a GPU (EngineConfig::backend:
// the engine's views are then that backend's memory).
//
// fp32 or bf16 runtime weights (every view of a group in one dtype; bf16 as Gpt runs it: see
// BackendGpt), fp32 gradients (ConfigError otherwise: --reduce fp32), the packed QKV layout
// (GptConfig::packed_qkv). MXFP8 block weights (--weight-dtype mxfp8: E4M3 codes with S′ in
// ScaleLayout::kRowMajor) are dequantized into fp32 scratch on the backend before each use
// (Backend::MxDequantizeRows: what a GPU without an MX GEMM, Hopper, does), and the block then
// runs as with fp32 weights — the function Gpt computes with MXFP8 weights (kernels/mx_linear.h:
// dequantized weight, fp32 activations and products). The scratch holds one block's weights.
// With mx_gemm = kBF16 the weights are dequantized straight to bf16 (Backend::
// MxDequantizeRowsBf16, one pass; exact: an E4M3 code times a power of two has 4 significant
// bits, unless it lies below bf16's normal range) and the block runs as with bf16 weights
// (GemmBf16: tensor-core products on a GPU, bf16-rounded inputs) — the fast path on Hopper, equal
// bit for bit to bf16 weights holding the dequantized values.
//
//   std::unique_ptr<Backend> cpu = MakeBackend("cpu");
//   BackendGptModel model(*cpu, GptConfig::Preset("small"));
//   EngineConfig cfg;  cfg.weight_dtype = DType::kF32;
//   Engine engine(model, *world, cfg);                   // as with Gpt
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/models/backend_gpt.h"
#include "sshsdp/models/backend_views.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {

class BackendGptModel final : public Model {
 public:
  // ConfigError unless c.packed_qkv, and unless mx_gemm (the GEMM dtype of MXFP8 weights) is
  // fp32 or bf16.
  BackendGptModel(Backend& b, const GptConfig& c, DType mx_gemm = DType::kF32);
  ~BackendGptModel() override;
  BackendGptModel(const BackendGptModel&) = delete;
  BackendGptModel& operator=(const BackendGptModel&) = delete;

  int num_groups() const override { return spec_.num_groups(); }
  std::vector<RuntimeParamSpec> GroupParams(int g) const override { return spec_.GroupParams(g); }
  // Sizes the backend's activations for (B, T) when they change, and copies the batch in.
  void SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) override;
  void Forward(int g, const std::vector<TensorRef>& w) override;
  double Loss() const override;
  // The losses stay on the backend until TakeLosses (BackendGpt::KeepLoss).
  void KeepLoss() override;
  std::vector<double> TakeLosses() override;
  void Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                GradWrite mode) override;
  // Gpt's count at the batch's T (the spec, never given a batch, counts the preset's seq_len).
  double FlopsPerToken() const override {
    const GptConfig& c = spec_.config();
    const int T = gpt_ ? gpt_->seq_len() : c.seq_len;
    return spec_.FlopsPerToken() + 12.0 * c.n_layer * c.d_model * (T - c.seq_len);
  }
  int64_t ActivationBytes() const override {
    return (gpt_ ? gpt_->activation_bytes() : 0) + mx_.bytes();
  }
  bool ConsumesMx() const override { return true; }
  // MXFP8 weights are dequantized for the GEMMs from per-row scales (Backend::MxDequantizeRows).
  bool ReadsScaleLayout(ScaleLayout layout) const override {
    return layout == ScaleLayout::kRowMajor;
  }

 private:
  Backend& b_;
  Gpt spec_;  // the runtime parameters and FLOPs (no activations: never given a batch)
  std::unique_ptr<BackendGpt> gpt_;
  std::vector<double> taken_;  // kept losses read from a BackendGpt that a new batch shape replaced
  MxScratch mx_;               // one group's dequantized MXFP8 weights, in mx_gemm_
  DType mx_gemm_ = DType::kF32;
  int fwd_next_ = 0, bwd_next_ = -1;
  bool loss_valid_ = false;
};

}  // namespace sshsdp
