// The dense GPT trunk of gpt.h (packed QKV, padded vocabulary, fp32 or bf16 weights, fp32
// activations) as per-group functions on weights and gradients someone else holds, every op the
// backend's: the trunk of the backend MoE model (BackendMoeModel runs its attention halves and
// dense blocks here, and its experts itself). The dense GPT itself is models/gpt.h on any
// backend; this trunk goes once the MoE model is written on gpt.h's blocks too (issue 42).
// Activations in one allocation with a table of offsets (llm.c).
//
//   BackendGpt trunk(backend, c.trunk, B, T, dense_mlp);
//   trunk.SetTokens(tokens, targets);
//   trunk.ForwardAttention(l, w, DType::kF32);   // ln1 .. ln2 of block l
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {

class BackendGpt {
 public:
  // Batches of B sequences of T <= c.seq_len tokens. ConfigError for bad sizes. dense_mlp
  // (empty: every block) marks the blocks whose dense MLP runs here (ForwardGroup /
  // BackwardGroup); the others — an MoE model's, which run only the attention halves below —
  // get no MLP activations.
  BackendGpt(Backend& b, const GptConfig& c, int B, int T, std::vector<bool> dense_mlp = {});
  ~BackendGpt();
  BackendGpt(const BackendGpt&) = delete;
  BackendGpt& operator=(const BackendGpt&) = delete;

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
  int MlpIndex(int l) const;  // block l's MLP activations (PlanError without a dense MLP)
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

  Backend& b_;
  GptConfig c_;
  int B_, T_;
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
