// The Llama family — Llama 2/3 and Qwen3 dense decoders — as transformers computes them, with
// a manual forward and backward over runtime-parameter views (params/model.h), every op on a
// Backend (the CPU backend by default). hf/ builds one from a Hugging Face config.json and
// maps its safetensors onto the update parameters, both ways.
//
// Per block: RMSNorm (eps = rms_norm_eps) → ONE packed QKV runtime parameter
// [(Hq + 2·Hkv)·dh, d] whose update parts are every Q head, then every K head, then every V
// head ([dh, d] each: per-head Muon sees each as its own matrix) → per-head QK-RMSNorm
// (Qwen3) → RoPE (rope_theta, transformers' rotate_half) → causal attention over Hq heads, K/V
// head h / (Hq / Hkv) serving query head h (kernels/rope.h), scale dh^-0.5 → o_proj
// [d, Hq·dh] → residual; RMSNorm → SwiGLU: down(silu(gate(x)) · up(x)) → residual. Final
// RMSNorm, LM head over the padded vocabulary, mean cross-entropy over the V real logits. No
// biases, no learned positions. dh is the config's, not d / Hq.
//
//   Llama model(LlamaConfig::Preset("qwen3-tiny"));    // its own CPU backend
//   model.GroupParams(1)[1].parts[0].name;              // "layers.0.self_attn.q_proj.h0"
//
// Runtime groups: 0 = {embed_tokens}; 1..L = block l-1 {input_layernorm, self_attn.qkv,
// [self_attn.q_norm, self_attn.k_norm,] self_attn.o_proj, post_attention_layernorm,
// mlp.gate_proj, mlp.up_proj, mlp.down_proj}; L+1 = {norm, lm_head}. Update-parameter names are
// transformers' without "model." and ".weight", heads split (".h<i>"). With tied embeddings
// the last group is {norm} and reads embed_tokens, group 0's (Model::TiesFirstGroup): one
// update parameter, whose gradient is the sum of both ends'.
//
// Weights fp32, bf16 (bf16 GEMMs, the fp32 inputs rounded by the product) or MXFP8 in the
// block groups; gradients fp32 or bf16. Attention in fp32, or on bf16 operands when every QKV
// weight is bf16 and bf16_attention is set (as the GPT, gpt.h). Activations live in one arena
// sized from (B, T, config).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/backend_buffer.h"
#include "sshsdp/models/group_order.h"
#include "sshsdp/models/loss_ring.h"
#include "sshsdp/models/trunk.h"
#include "sshsdp/params/model.h"

namespace sshsdp {

struct LlamaConfig {
  std::string model_type = "qwen3";  // "llama", "qwen3" or "qwen3_moe" (transformers')
  int vocab = 256;
  int vocab_multiple = 128;  // the tables' rows: vocab rounded up to this (as GptConfig)
  int seq_len = 256;         // positions the RoPE tables cover: the longest batch
  int d_model = 64;
  int n_layer = 2;
  int n_head = 4;     // query heads
  int n_kv_head = 2;  // divides n_head
  int head_dim = 16;  // even; need not be d_model / n_head
  int d_ff = 192;
  double rope_theta = 1e6;
  float norm_eps = 1e-6f;
  bool qk_norm = true;  // Qwen3's per-head RMSNorm of Q and K before RoPE
  bool tied = true;     // tie_word_embeddings: the LM head is the embedding table
  // The packed QKV as ONE update part "layers.N.self_attn.qkv" — the model an AdamW user writes,
  // what the baseline presets of `sshsdp bench` run (presets.h) — instead of one per head. Not
  // a transformers architecture: hf/ refuses it.
  bool fused_qkv = false;
  // Qwen3-MoE (n_expert > 0): the MLP of block l is a mixture of n_expert SwiGLU experts of
  // width d_expert, top_k per token from softmax(router), renormalised when norm_topk_prob,
  // unless l is in mlp_only_layers or (l + 1) is not a multiple of sparse_step (transformers'
  // decoder_sparse_step); the model is then an MoeGpt over this trunk (MoeConfigOf, moe.h).
  int n_expert = 0;
  int top_k = 0;
  int d_expert = 0;
  int sparse_step = 1;
  std::vector<int> mlp_only_layers;
  bool norm_topk_prob = true;
  // transformers adds router_aux_loss_coef times its load-balancing loss only with
  // output_router_logits; both are kept for the config's round trip.
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;
  bool bf16_attention = true;

  // "qwen3-tiny" (d=64, L=2, 4 Q / 2 KV heads of 16, ff 192), "qwen3-small" (d=128, L=4, 4 / 2
  // heads of 32, ff 384), both with tied embeddings as Qwen3's small models; "llama-tiny"
  // (d=64, L=2, 4 / 1 heads of 16, ff 176, no QK-norm, theta 500,000, eps 1e-5, untied);
  // "qwen3-moe-tiny" (qwen3-tiny untied, 8 experts of 64, top-2, every block); seq_len 256.
  // ConfigError naming the presets otherwise.
  static LlamaConfig Preset(std::string_view name);
  static bool IsPreset(std::string_view name);
  int padded_vocab() const {
    return (vocab + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
  }
  int64_t q_dim() const { return int64_t{n_head} * head_dim; }
  bool IsMoe() const { return n_expert > 0; }
  bool IsMoeLayer(int l) const;
  int64_t qkv_rows() const { return int64_t{n_head + 2 * n_kv_head} * head_dim; }
  // ConfigError naming the field unless every size is positive, n_kv_head divides n_head,
  // head_dim is even and at most 1,024, model_type is llama, qwen3 or qwen3_moe (with experts
  // exactly then).
  void Validate() const;
};

class Llama final : public Trunk {
 public:
  explicit Llama(const LlamaConfig& config);  // on its own CPU backend
  // On `backend` (not owned; outlives the model). ConfigError naming the feature when the
  // backend has no RoPE op (BackendFeature::kRope) or its attention is narrower than head_dim.
  Llama(const LlamaConfig& config, Backend& backend);
  // The trunk of an MoE model (Qwen3-MoE, moe.h): block l has the dense SwiGLU MLP iff mlp[l]
  // (empty: every block).
  Llama(const LlamaConfig& config, Backend& backend, std::vector<bool> mlp);
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  const LlamaConfig& config() const { return c_; }

  int num_groups() const override { return c_.n_layer + 2; }
  std::vector<RuntimeParamSpec> GroupParams(int g) const override;
  void SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) override;
  void Forward(int g, const std::vector<TensorRef>& w) override;
  double Loss() const override;
  void KeepLoss() override;
  std::vector<double> TakeLosses() override;
  void Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                GradWrite mode) override;
  // 6·N (the GEMM weights: blocks and LM head) plus attention 12·L·Hq·dh·T.
  double FlopsPerToken() const override;
  int64_t ActivationBytes() const override;
  bool TiesFirstGroup() const override { return c_.tied; }
  bool ConsumesMx() const override { return true; }
  bool ReadsScaleLayout(ScaleLayout layout) const override {
    return layout == ScaleLayout::kRowMajor || b_.Has(BackendFeature::kAnyScaleLayout);
  }
  void SetOpProfile(OpProfile* profile) override { profile_ = profile; }
  const float* Probs() const override { return b_.host_memory() ? acts_.probs : nullptr; }
  int64_t ProbsStride() const override { return c_.padded_vocab(); }

  // ---- The trunk's pieces (trunk.h). The attention half's views: input_layernorm,
  // self_attn.qkv, [q_norm, k_norm,] o_proj, post_attention_layernorm. ----
  void ForwardEmbedding(const std::vector<TensorRef>& w) override;
  void BackwardEmbedding(const std::vector<TensorRef>& grad, bool acc) override;
  void ForwardHead(const std::vector<TensorRef>& w) override;
  void BackwardHead(const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                    bool acc) override;
  void ForwardBlock(int l, const std::vector<TensorRef>& w) override;
  void BackwardBlock(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                     bool acc) override;
  void ForwardAttention(int l, const std::vector<TensorRef>& w) override;
  void BackwardAttention(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                         bool acc) override;
  float* Ln2(int l) const override;
  float* ResMid(int l) const override;
  float* BlockOut(int l) const override;
  float* DRes() const override { return acts_.dres; }
  float* DLn2() const override { return acts_.dtmp; }
  int AttentionViews() const override { return bv_.ln2 + 1; }
  int DenseBlockViews() const override { return bv_.count; }
  double AttentionWeights() const override;
  double DenseMlpWeights() const override { return 3.0 * c_.d_model * c_.d_ff; }
  double HeadWeights() const override {
    return static_cast<double>(c_.padded_vocab()) * c_.d_model;
  }
  double AttentionFlopsPerToken(double T) const override {
    return 12.0 * c_.n_layer * static_cast<double>(c_.q_dim()) * T;
  }

 private:
  // Pointers into the arena; per-layer tensors are stacked [L, ...].
  struct Acts {
    float* residual;  // [L+1, BT, d]
    float* ln1;       // [L, BT, d]
    float* ln1_rstd;  // [L, BT]
    float* raw;       // [L, BT, (Hq + 2·Hkv)·dh] the QKV projection
    float* qk_rstd;   // [L, BT, Hq + Hkv] (QK-norm)
    float* att;       // [L, BT, 3·Hq·dh] attention's input (kernels/rope.h)
    float* lse;       // [L, B, Hq, T]
    float* atty;      // [L, BT, Hq·dh]
    float* res_mid;   // [L, BT, d]
    float* ln2;       // [L, BT, d]
    float* ln2_rstd;  // [L, BT]
    float* h1;        // [blocks with an MLP, BT, ff] gate
    float* h3;        // [blocks with an MLP, BT, ff] up
    float* act;       // [blocks with an MLP, BT, ff] silu(gate)·up
    float* lnf;       // [BT, d]
    float* lnf_rstd;  // [BT]
    float* probs;     // [BT, Vp]
    float* losses;    // [BT]
    // Backward scratch, reused by every group.
    float* dres;     // [BT, d]
    float* dtmp;     // [BT, max(d, Hq·dh)]
    float* datt;     // [BT, 3·Hq·dh]
    float* draw;     // [BT, (Hq + 2·Hkv)·dh]
    float* dh1;      // [BT, ff]
    float* dh3;      // [BT, ff]
    float* dlogits;  // [BT, Vp]
  };
  // Indices of a block group's views.
  struct BlockViews {
    int ln1 = 0, qkv = 1, q_norm = -1, k_norm = -1, o = 2, ln2 = 3, gate = 4, up = 5, down = 6;
    int count = 7;
  };

  Llama(const LlamaConfig& config, std::unique_ptr<Backend> own);
  void Init(std::vector<bool> mlp);
  void SizeArena();
  void CheckViews(int g, const std::vector<TensorRef>& v, const char* what) const;
  // The gain view t ([n]) as fp32: itself, or converted into gain scratch `slot` (0..2).
  const float* Gain(const TensorRef& t, int n, int slot);
  bool Bf16Attention(const std::vector<TensorRef>& w) const;
  // A linear operand that two products read, rounded once when `w` is a plain bf16 weight: a
  // bf16 copy in round16_[slot] (0: gradients, 1: inputs; the products then round nothing),
  // else x itself (each product rounds what its weight needs).
  kernels::LinearInput Shared(const float* x, int64_t n, const TensorRef& w, int slot);
  kernels::RopeShape Shape() const;
  // Block l's dense MLP: Ln2(l) -> BlockOut(l); its backward leaves ∂/∂Ln2(l) in DLn2().
  void ForwardMlp(int l, const std::vector<TensorRef>& w);
  void BackwardMlp(int l, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                   bool acc);
  // dtmp = ∂/∂(the norm's output) → dres (+)= ∂/∂x, the gain's gradient into grad.
  void NormBackward(const float* x, const TensorRef& gain, const float* rstd, const TensorRef& grad,
                    bool acc, bool accumulate_dx);

  std::unique_ptr<Backend> own_;
  Backend& b_;
  LlamaConfig c_;
  BlockViews bv_;
  bool bf16_attention_ = false;  // c_.bf16_attention, where the backend has it
  std::vector<int> mlp_slot_;    // block l's slot in h1 / h3 / act, -1 without an MLP
  int mlp_blocks_ = 0;
  int B_ = 0, T_ = 0;
  BackendBuffer tokens_;      // [B·T] tokens, then [B·T] targets
  BackendBuffer rope_;        // cos [seq_len, dh/2], then sin
  BackendBuffer gains_;       // 3 slots of max(d, dh) floats (Gain)
  BackendBuffer dgains_;      // [d] RMSNorm's gain gradient, then 2·[dh] QK-norm's
  BackendBuffer scratch_;     // bf16 embedding gradients' fp32 sums; bf16 attention's scratch
  BackendBuffer round16_[2];  // Shared's bf16 copies, sized by the forward
  BackendBuffer arena_;
  Acts acts_{};
  LossRing losses_;
  OpProfile* profile_ = nullptr;
  GroupOrder order_{"Llama"};
  bool loss_ready_ = false;
};

}  // namespace sshsdp
