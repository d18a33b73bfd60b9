// Reference dense GPT with a manual forward and backward, written against runtime-parameter
// views (model.h): it never sees shards, communicators or optimizer state. Every op runs on a
// Backend (backend/backend.h): the CPU backend by default, whose ops are the kernels/ functions
// (so the bits are theirs), or any backend the engine runs on. Activations live in that
// backend's memory.
//
// Pre-norm GPT over bytes by default: token embedding wte [Vp,d] (Vp = padded vocabulary) + learned
// positions wpe [seq_len,d]; per block RMSNorm → causal multi-head attention with ONE packed QKV
// runtime parameter [3d,d] (update parts: every head's Q, then every head's K, then every
// head's V, [d_head,d] each, so per-head Muon sees each head as its own matrix) → output
// projection [d,d] → residual; RMSNorm → fc1 [d_ff,d] → GELU (tanh) → fc2 [d,d_ff] →
// residual. Final RMSNorm, untied LM head [Vp,d], mean cross-entropy over the V real logits.
// No biases.
//
//   Gpt model(GptConfig::Preset("small"));            // its own CPU backend
//   Gpt on(GptConfig::Preset("small"), backend);      // or the engine's (EngineConfig::backend)
//   model.GroupParams(1)[1].parts[2].name;   // "blocks.0.attn.q.h2"
//
// Runtime groups: 0 = {wte, wpe}; 1..L = block l-1 {ln1.g, attn.qkv, attn.proj, ln2.g,
// mlp.fc1, mlp.fc2}; L+1 = {lnf.g, lm_head}.
//
// GptConfig::packed_qkv = false (veScale-FSDP's model, presets.h): no packed runtime layout.
// Each head's Q, K and V is its own runtime parameter [d_head, d] (3·H of them, one update
// part each, named as the packed parameter's parts: blocks.l.attn.{q,k,v}.h<i>), so a block
// group is {ln1.g, attn.q.h0 .. attn.q.h<H-1>, attn.k.h0 .., attn.v.h0 .., attn.proj, ln2.g,
// mlp.fc1, mlp.fc2}, and the QKV projection runs one GEMM per part, writing / reading its
// column slice of the [BT, 3d] activation (strided GEMMs), weight gradients straight into
// each part's view. Same function as the packed model (same update names, same FillInit
// values, so checkpoints and init weights interoperate; only fp32 summation order differs),
// different runtime groups. MXFP8 weights are refused in this mode (ConsumesMx() false). Weights
// may be fp32 or bf16 (GEMMs go through kernels/matmul; bf16 weights run bf16 GEMMs), gradients
// fp32 or bf16. Attention scores and softmax run in fp32 (GEMMs per head, softmax loops).
// Activations live in one arena (a flat allocation with a table of offsets, llm.c style) sized from
// (B, T, config). With a bf16 weight, the input of that linear layer (ln1, ln2, fch_gelu, lnf)
// is stored in bf16 in its slot by the kernel producing it, so no product rounds it again
// (gpt.cc, "bf16 linear inputs"); a Backward must see the weight dtypes its Forward saw.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/backend_buffer.h"
#include "sshsdp/models/group_order.h"
#include "sshsdp/models/loss_ring.h"
#include "sshsdp/models/trunk.h"
#include "sshsdp/params/model.h"

namespace sshsdp {

namespace kernels {
struct LinearInput;  // kernels/matmul.h
}  // namespace kernels

struct GptConfig {
  // Vocabulary: 256 (bytes, the built-in data's) or the tokenizer's (50,257 for GPT-2). The
  // embedding and LM-head tables have padded_vocab() rows, llm.c style (50,257 -> 50,304):
  // padded logits take no probability mass, padded rows start at zero, get zero gradients
  // and stay zero.
  int vocab = 256;
  int vocab_multiple = 128;  // padded_vocab() rounds vocab up to a multiple of this
  int seq_len = 64;
  int d_model = 64;
  int n_head = 4;
  int n_layer = 2;
  int d_ff = 0;  // 0 means 4 * d_model
  // true: one packed QKV runtime parameter [3d, d] per block; false: 3·H per-part runtime
  // parameters [d_head, d] and per-part GEMMs (see above).
  bool packed_qkv = true;
  // With packed_qkv: true declares the QKV runtime parameter as ONE update part "attn.qkv"
  // [3d, d] — the model as an AdamW user writes it (nn.Linear(d, 3d)), what the baseline
  // presets run under AdamW and per-matrix Muon (presets.h: PresetModel); false (default):
  // per-head parts, so per-head Muon sees each head.
  bool fused_qkv = false;
  // true: a block whose QKV weights are all bf16 runs attention on bf16 operands (Q, K, V,
  // P, dO, dS rounded; softmax and sums fp32 — kernels::CausalAttentionForwardBf16, what
  // torch.autocast's CPU attention computes); false: attention stays fp32 whatever the
  // weights (sshsdp's choice before bf16 attention existed; `--attention-dtype fp32`).
  bool bf16_attention = true;
  // The dtype MXFP8 block weights are dequantized to for their GEMMs (a run option, not the
  // architecture: --mx-gemm): fp32 (the dequantized weight times fp32 activations), or bf16 —
  // dequantized straight to bf16 (exact: an E4M3 code times a power of two has 4 significant
  // bits, unless it lies below bf16's normal range) and run as bf16 weights (bf16 products,
  // bf16-rounded inputs; row_major scales only), bit for bit bf16 weights holding those values.
  DType mx_gemm = DType::kF32;

  // "tiny" (d=64, L=2, H=4, T=64), "small" (d=128, L=4, H=4, T=128),
  // "base" (d=256, L=6, H=8, T=256). Throws ConfigError naming the presets otherwise.
  static GptConfig Preset(std::string_view name);
  int ff() const { return d_ff > 0 ? d_ff : 4 * d_model; }
  int padded_vocab() const {
    return (vocab + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
  }
  int head_dim() const { return d_model / n_head; }
  // Throws ConfigError on non-positive sizes or d_model not divisible by n_head.
  void Validate() const;
};

// ConfigError unless b's attention takes c's head width (the CUDA kernels: dh <= 256), naming
// the model and the fix. The models call it when they are built.
void CheckAttentionFits(const Backend& b, const GptConfig& c, const char* model);

class Gpt final : public Trunk {
 public:
  // On the model's own CPU backend.
  explicit Gpt(const GptConfig& config);
  // On `backend` (not owned; outlives the model). ConfigError naming the feature when the
  // config needs one the backend lacks (per-part QKV: a strided GEMM) or its attention does not
  // take the head width. bf16 attention runs where the backend has it (fp32 elsewhere).
  Gpt(const GptConfig& config, Backend& backend);
  // The trunk of a model that replaces some blocks' MLP (MoeGpt): block l has the dense MLP
  // iff mlp[l] (empty: every block). A block without one has no fc1/fc2 activations here; the
  // model built on this one computes its output from Ln2(l) with the pieces below.
  Gpt(const GptConfig& config, Backend& backend, std::vector<bool> mlp);
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const GptConfig& config() const { return c_; }

  int num_groups() const override { return c_.n_layer + 2; }
  std::vector<RuntimeParamSpec> GroupParams(int g) const override;
  void SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) override;
  void Forward(int g, const std::vector<TensorRef>& w) override;
  double Loss() const override;
  // On the backend, in a LossRing (loss_ring.h): one wait per step, not per microbatch.
  void KeepLoss() override;
  std::vector<double> TakeLosses() override;
  void Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                GradWrite mode) override;
  // 6·N (N = all GEMM weights: blocks and LM head; embedding lookups are free) plus
  // attention 12·L·d·T (PaLM's convention, T = the batch's sequence length).
  double FlopsPerToken() const override;
  int64_t ActivationBytes() const override;
  // Block groups accept MXFP8 weights (kernels/mx_linear.h); embedding and head groups do not
  // (the engine keeps groups with embedding tables in bf16).
  // Not with packed_qkv = false (per-part runtime weights).
  bool ConsumesMx() const override { return c_.packed_qkv; }
  // Every Tw layout where the backend dequantizes them all (the CPU) and mx_gemm is fp32,
  // row_major elsewhere.
  bool ReadsScaleLayout(ScaleLayout layout) const override {
    return layout == ScaleLayout::kRowMajor ||
           (b_.Has(BackendFeature::kAnyScaleLayout) && c_.mx_gemm == DType::kF32);
  }
  void SetOpProfile(OpProfile* profile) override { profile_ = profile; }

  // ---- The trunk's pieces (trunk.h), for a model built on this one (MoeGpt), which keeps
  // the group order itself: Forward(g) / Backward(g) are these for g = 0, a block, L+1. The
  // attention half's views: ln1.g, the QKV weight(s), attn.proj, ln2.g; Ln2 stored in fp32. ----
  void ForwardEmbedding(const std::vector<TensorRef>& w) override;
  void ForwardHead(const std::vector<TensorRef>& w) override;
  void BackwardHead(const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                    bool acc) override;
  void BackwardEmbedding(const std::vector<TensorRef>& grad, bool acc) override;
  void ForwardBlock(int l, const std::vector<TensorRef>& w) override;
  void BackwardBlock(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                     bool acc) override;
  void ForwardAttention(int l, const std::vector<TensorRef>& w) override;
  void BackwardAttention(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                         bool acc) override;
  float* Ln2(int l) const override;
  float* ResMid(int l) const override;
  float* BlockOut(int l) const override;  // the residual stream after block l
  float* DRes() const override { return acts_.dres; }
  float* DLn2() const override { return acts_.dtmp; }
  int AttentionViews() const override { return 3 + NumQkv(); }
  int DenseBlockViews() const override { return 5 + NumQkv(); }
  double AttentionWeights() const override { return 4.0 * c_.d_model * c_.d_model; }
  double DenseMlpWeights() const override { return 2.0 * c_.d_model * c_.ff(); }
  double HeadWeights() const override {
    return static_cast<double>(c_.padded_vocab()) * c_.d_model;
  }
  double AttentionFlopsPerToken(double T) const override {
    return 12.0 * c_.n_layer * c_.d_model * T;
  }

  // Logits' softmax of the last forward, [B*T, padded_vocab()] (padded columns 0); on a
  // backend with host memory only (null elsewhere).
  const float* Probs() const override { return b_.host_memory() ? acts_.probs : nullptr; }
  int64_t ProbsStride() const override { return c_.padded_vocab(); }

 private:
  // Pointers into the arena; per-layer tensors are stacked [L, ...].
  struct Acts {
    float* residual;  // [L+1, BT, d]: residual[0] = embeddings, residual[l+1] = block l out
    float* ln1;       // [L, BT, d]
    float* ln1_rstd;  // [L, BT]
    float* qkv;       // [L, BT, 3d]
    float* lse;       // [L, B, H, T] attention rows' log-sum-exp (kernels/attention.h)
    float* atty;      // [L, BT, d] attention output before the projection
    float* res_mid;   // [L, BT, d] residual after attention
    float* ln2;       // [L, BT, d]
    float* ln2_rstd;  // [L, BT]
    float* fch;       // [blocks with an MLP, BT, d_ff] fc1 output
    float* fch_gelu;  // [blocks with an MLP, BT, d_ff]
    float* lnf;       // [BT, d]
    float* lnf_rstd;  // [BT]
    float* probs;     // [BT, V]
    float* losses;    // [BT]
    // Backward scratch, reused by every group.
    float* dres;     // [BT, d] gradient of the residual stream flowing down
    float* dtmp;     // [BT, d]
    float* dqkv;     // [BT, 3d]
    float* dfch;     // [BT, d_ff]
    float* dlogits;  // [BT, V]
  };

  // Runtime parameters of the QKV projection in a block group: 1 packed, or 3·H parts.
  int NumQkv() const { return c_.packed_qkv ? 1 : 3 * c_.n_head; }
  void CheckViews(int g, const std::vector<TensorRef>& v, const char* what) const;
  // The QKV projection of block views w (w[1 .. NumQkv()]): qkv[BT, 3d] = ln1 · Wᵀ, and its
  // backward (dx overwritten with the data gradient, weight gradients into grad views).
  // ln1 is stored in bf16 when every QKV weight is bf16 (see gpt.cc's "bf16 linear
  // inputs"); some_bf16: at least one QKV weight is bf16.
  void QkvForward(kernels::LinearInput ln1, bool some_bf16, const std::vector<TensorRef>& w,
                  float* qkv);
  void QkvBackward(kernels::LinearInput ln1, bool some_bf16, const std::vector<TensorRef>& w,
                   const std::vector<TensorRef>& grad, float* dx, bool acc);
  // packed_qkv = false: the bf16 ln1 that the bf16 parts read — ln1 itself when stored in
  // bf16, a rounding into x_bf16_ when it is fp32 (some part is not bf16); ln1's fp32 data
  // unchanged when no part is bf16.
  const void* QkvInputBf16(kernels::LinearInput ln1, bool some_bf16);
  // Which linear inputs of group g are stored in bf16, from its weights' dtypes.
  struct Bf16Inputs {
    bool ln1 = false, ln2 = false, fch_gelu = false, lnf = false;
    bool attention = false;  // attention on bf16 operands (GptConfig::bf16_attention)
    bool some_qkv = false;   // a QKV part is bf16 (ln1 rounded for it, stored or not)
    bool any = false;        // some product of the group is bf16 (its gradients use DyBf16)
    uint8_t Bits() const {
      return static_cast<uint8_t>(ln1 | ln2 << 1 | fch_gelu << 2 | lnf << 3 | attention << 4);
    }
  };
  // mlp: a block group's views include the dense MLP's (fc1, fc2).
  Bf16Inputs InputsOf(int g, const std::vector<TensorRef>& w, bool mlp) const;
  Bf16Inputs RecordBf16Inputs(int g, const std::vector<TensorRef>& w, bool mlp);  // Forward
  Bf16Inputs CheckBf16Inputs(int g, const std::vector<TensorRef>& w,
                             bool mlp) const;  // Backward: as Forward's
  Gpt(const GptConfig& config, std::unique_ptr<Backend> own);
  void Init(std::vector<bool> mlp);  // what every constructor does once the backend is known
  // mx_gemm = bf16: block g's MXFP8 views dequantized to bf16 (into mx16_), the others as given;
  // w itself otherwise.
  const std::vector<TensorRef>& GemmViews(int g, const std::vector<TensorRef>& w);
  // n elements of the bf16 gradient scratch dy_bf16_ (grown as needed), holding src rounded
  // when src is given (a gradient both backward products of a bf16 linear read). Block
  // forwards with bf16 weights size it for their backward, so ActivationBytes counts it from
  // the first backward on.
  bf16* DyBf16(const float* src, int64_t n);
  // The halves of block l: attention up to ln2, and the dense MLP to the block's output; their
  // backwards (the MLP's leaves ∂/∂ln2 in DLn2()).
  void AttentionForward(int l, const std::vector<TensorRef>& w, const Bf16Inputs& in);
  void MlpForward(int l, const std::vector<TensorRef>& w, const Bf16Inputs& in);
  void MlpBackward(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                   const Bf16Inputs& in, bool acc);
  void AttentionBackward(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                         const Bf16Inputs& in, bool acc);
  // Gain as fp32 (converted into scratch for bf16).
  const float* Gain(const TensorRef& t);

  std::unique_ptr<Backend> own_;  // the one-argument constructor's CPU backend
  Backend& b_;
  GptConfig c_;
  bool bf16_attention_ = false;  // c_.bf16_attention, where the backend has it
  std::vector<int> mlp_slot_;    // block l's slot in fch / fch_gelu, -1 without an MLP
  int mlp_blocks_ = 0;
  int B_ = 0, T_ = 0;
  BackendBuffer tokens_;  // [B·T] tokens, then [B·T] targets
  LossRing losses_;       // Σ losses of the last forward, and the kept ones (KeepLoss)

  BackendBuffer arena_;
  Acts acts_{};
  BackendBuffer gain_scratch_, dgain_scratch_, table_scratch_;  // [d], [d], bf16 tables' sums
  OpProfile* profile_ = nullptr;                                // SetOpProfile
  // bf16 roundings of GEMM operands: ln1 for bf16 QKV parts beside fp32 ones (x_bf16_), a
  // gradient feeding a bf16 linear's two backward products (dy_bf16_, DyBf16).
  BackendBuffer x_bf16_, dy_bf16_;
  // The bf16 attention's scratch (Backend::AttentionBf16ScratchFloats), sized by the first
  // Forward that runs it.
  BackendBuffer att_bf16_scratch_;
  BackendBuffer mx16_;  // mx_gemm = bf16: one block's weights dequantized to bf16
  std::vector<TensorRef> mx16_views_;
  std::vector<uint8_t> bf16_inputs_;  // per group, Bf16Inputs::Bits() of its last Forward

  // Execution order guards: next forward group, whether a forward pass completed, next
  // backward group.
  GroupOrder order_{"GPT"};
  bool loss_ready_ = false;  // the head ran since the last SetBatch / embedding forward
};

}  // namespace sshsdp
