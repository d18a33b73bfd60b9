// The dense GPT of gpt.h (packed QKV, padded vocabulary, fp32 weights and activations) with
// its whole training step on ONE device backend (backend/backend.h): forward, backward,
// microbatch accumulation, global-norm clipping and AdamW, every tensor in backend memory —
// the single-device path of the GPU backend (issue 19), built only from the backend's ops so
// that the CPU backend trains it like Gpt (backend_gpt_test: same loss and gradients as Gpt,
// the same AdamW as update/adamw.h) and the CUDA backend runs the same program on a GPU
// (models_backend_gpt_check, scripts/gpu_check.sh). One flat allocation each for weights,
// gradients, AdamW's m and v, and activations, with a table of per-tensor offsets (llm.c).
//
//   std::unique_ptr<Backend> dev = MakeBackend("cuda");
//   BackendGpt gpt(*dev, GptConfig::Preset("small"), /*B=*/4, /*T=*/128);
//   gpt.LoadWeights(host_weights.data());          // gpt.tensors() order, fp32
//   double loss = gpt.TrainStep(tokens, targets, /*microbatches=*/4, adamw, /*clip=*/1.0f,
//                               /*step=*/1, &grad_norm);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {

// ConfigError unless b's attention takes c's head width (the CUDA kernels: dh <= 256), naming
// the model and the fix. The backend models call it when they are built.
void CheckAttentionFits(const Backend& b, const GptConfig& c, const char* model);

class BackendGpt {
 public:
  // A tensor of the flat weight buffer: Gpt's runtime parameter of that name and shape.
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0, size = 0;
    bool decay = true;  // AdamW weight decay (not on norm gains)
  };

  // Batches of B sequences of T <= c.seq_len tokens. ConfigError for bad sizes. Without
  // own_params only the activations are allocated: the per-group functions below then compute
  // on weights and gradients someone else holds (BackendGptModel: the engine's views), and
  // the whole-step functions refuse.
  // dense_mlp (empty: every block) marks the blocks whose dense MLP runs here (ForwardGroup /
  // BackwardGroup); the others — an MoE model's, which run only the attention halves below —
  // get no MLP activations.
  BackendGpt(Backend& b, const GptConfig& c, int B, int T, bool own_params = true,
             std::vector<bool> dense_mlp = {});
  ~BackendGpt();
  BackendGpt(const BackendGpt&) = delete;
  BackendGpt& operator=(const BackendGpt&) = delete;

  // wte, wpe, then per block ln1.g, attn.qkv, attn.proj, ln2.g, mlp.fc1, mlp.fc2, then lnf.g,
  // lm_head (Gpt's runtime parameters in group order).
  const std::vector<Tensor>& tensors() const { return tensors_; }
  int64_t num_params() const { return num_params_; }

  // Host fp32 arrays of num_params() floats in tensors() order. Loading zeroes m and v.
  void LoadWeights(const float* host);
  void ReadWeights(float* host);
  void ReadGrads(float* host);

  // Forward and backward of one batch (host tokens / targets [B, T], each < vocab): returns
  // the mean cross-entropy; gradients overwritten (accumulate = false) or added to.
  double ForwardBackward(const int32_t* tokens, const int32_t* targets, bool accumulate);

  // One optimizer step over `microbatches` batches ([microbatches, B, T] host arrays):
  // gradients summed, scaled by 1/microbatches, clipped to global norm `clip` (0: off) as the
  // engine clips (coefficient clip / (norm + 1e-6) when norm > clip), then AdamW at `step`
  // (>= 1). Returns the mean loss; *grad_norm (if given) gets the norm before clipping.
  double TrainStep(const int32_t* tokens, const int32_t* targets, int microbatches,
                   const AdamWConfig& adamw, float clip, int64_t step, double* grad_norm);

  // ---- Per runtime group (Gpt's groups: 0 embeddings, 1..L blocks, L+1 final norm + head),
  // on weight and gradient pointers in backend memory, in the group's tensors() order. ----
  int num_groups() const { return c_.n_layer + 2; }
  int GroupTensors(int g) const { return g == 0 || g == c_.n_layer + 1 ? 2 : 6; }
  // Copies a batch's host tokens and targets [B, T] in (ConfigError for one outside the
  // vocabulary).
  void SetTokens(const int32_t* tokens, const int32_t* targets);
  // Weights in w_dtype: fp32, or bf16 runtime weights as Gpt runs them — gains and embedding
  // tables widened to fp32 on the backend, each linear layer's product taken on the bf16
  // roundings of its fp32 operand (x forward, dy backward) and its bf16 weight, accumulated in
  // fp32 (Backend::GemmBf16; kernels/matmul.h's Linear* contracts). Gradients are fp32.
  // Forward of group g; the last one also computes the loss (loss()).
  void ForwardGroup(int g, const void* const* w, DType w_dtype);
  // Backward of group g (groups in reverse order after a whole forward): gradients
  // overwritten (acc = false) or added to.
  void BackwardGroup(int g, const void* const* w, DType w_dtype, float* const* grad, bool acc);
  // The last forward's mean loss (reads it back: waits for the backend).
  double loss() const;
  // Model::KeepLoss / TakeLosses: the last forward's loss sum is copied on the backend into a
  // slot of its own (no wait); TakeLosses reads the kept slots back with one copy. A ring of
  // kLossSlots: a full one is read back then (one wait per kLossSlots microbatches).
  void KeepLoss();
  std::vector<double> TakeLosses();
  static constexpr int kLossSlots = 64;

  // ---- Halves of block l, for a model whose blocks' MLPs differ (BackendMoeModel). The
  // attention half runs ln1.g, attn.qkv, attn.proj, ln2.g (w[0..3]) up to ln2(l) =
  // RMSNorm(res_mid(l)); its backward takes dln2 = ∂/∂ln2 with dres() holding ∂/∂(block
  // output) from the MLP's residual path on entry, and leaves ∂/∂(block input) there. ----
  void ForwardAttention(int l, const void* const* w, DType w_dtype);
  void BackwardAttention(int l, const void* const* w, DType w_dtype, float* const* grad, bool acc,
                         const float* dln2);
  const float* ln2(int l) const { return a_.ln2 + l * int64_t{B_} * T_ * c_.d_model; }
  const float* res_mid(int l) const { return a_.res_mid + l * int64_t{B_} * T_ * c_.d_model; }
  // Block l's output, the residual stream after it [B·T, d].
  float* block_output(int l) { return a_.residual + (l + 1) * int64_t{B_} * T_ * c_.d_model; }
  float* dres() { return a_.dres; }
  // Activations, and the bf16 path's scratch once a bf16 weight was seen.
  int64_t activation_bytes() const { return activation_bytes_; }
  int batch() const { return B_; }
  int seq_len() const { return T_; }

 private:
  void RequireParams(const char* what) const;  // ConfigError without own_params
  int FirstTensor(int g) const;
  int MlpIndex(int l) const;  // block l's MLP activations (PlanError without a dense MLP)
  void Forward();
  void Backward(bool acc);
  // Gain gradient: overwritten, or added through the scratch row.
  void GainGrad(const float* dy, const float* x, const float* g, const float* rstd, float* dx,
                float* dg, bool acc_dx, bool acc_dg);
  // w as fp32: itself, or its n bf16 values widened into dst.
  const float* Wide(const void* w, DType w_dtype, int64_t n, float* dst);
  // y[m,n] = x[m,k]·wᵀ, w [n,k]; and backward: dw[n,k] (=|+=) dyᵀ·x, dx[m,k] = dy·w.
  void Linear(const float* x, const void* w, DType w_dtype, float* y, int64_t m, int64_t n,
              int64_t k);
  void LinearBackward(const float* dy, const float* x, const void* w, DType w_dtype, float* dx,
                      float* dw, int64_t m, int64_t n, int64_t k, bool acc);
  void RequireBf16Scratch();  // allocates the bf16 path's scratch on its first use
  float* W(int i) { return weights_ + tensors_[i].offset; }
  float* G(int i) { return grads_ + tensors_[i].offset; }

  Backend& b_;
  GptConfig c_;
  int B_, T_;
  std::vector<Tensor> tensors_;
  int64_t num_params_ = 0;
  float *weights_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  float* acts_ = nullptr;       // every activation, one allocation
  std::vector<int> mlp_index_;  // per block: its slot in the MLP activations, -1 for none
  int64_t activation_bytes_ = 0;
  double* loss_sums_ = nullptr;    // [0]: the last forward's Σ losses; [1, 1 + kLossSlots): kept
  int kept_ = 0;                   // kept slots in use
  std::vector<double> read_back_;  // kept sums read back when the ring filled
  int32_t* tokens_ = nullptr;      // [B·T] tokens, then [B·T] targets
  // bf16 runtime weights only: the rounded operand of a product (x16_, dy16_) and widened
  // gains or embedding tables (wide_), one allocation.
  void* bf16_scratch_ = nullptr;
  bf16 *x16_ = nullptr, *dy16_ = nullptr;
  float* wide_ = nullptr;
  struct Acts {
    float *residual, *ln1, *ln1_rstd, *qkv, *lse, *atty, *res_mid, *ln2, *ln2_rstd, *fch, *fch_gelu,
        *lnf, *lnf_rstd, *probs, *losses, *dres, *dtmp, *dqkv, *dfch, *dlogits, *dgain;
  } a_{};
};

}  // namespace sshsdp
