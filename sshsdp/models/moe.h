// Reference Mixture-of-Experts model with a manual forward and backward, written against
// runtime-parameter views (model.h) over a trunk (trunk.h) on the same backend: the dense GPT
// (gpt.h; the moe-* presets) or the Llama family (llama.h; Qwen3-MoE, MoeConfig::llama). The
// trunk computes the embeddings, every block's pre-norm causal attention over one packed QKV
// parameter, the dense blocks' MLPs, the final RMSNorm and the LM head. In the blocks selected by
// `moe_every` / `moe_layers` the MLP is a mixture of experts, computed here with backend ops
// (backend/backend.h: the CPU backend's are kernels/moe_kernels.h's) in the backend's memory:
//
//   x = RMSNorm(h);  z = x·W_rᵀ (router logits, fp32)  →  top-k experts per token by logit
//   (ties: lower expert index first)  →  gate weights from softmax(z) or σ(z), optionally
//   renormalised over the k chosen  →  y = Σ_j gate_j · Expert_{e_j}(x) [+ SharedExpert(x)]
//   Expert(x) = W2·(silu(W1·x) ⊙ W3·x)   (SwiGLU)   or   W2·gelu(W1·x)   (GELU)
//
// plus the Switch-Transformer load-balancing loss per MoE block,
//   aux = α · E · Σ_e f_e · P_e,   f_e = (assignments to e) / (N·k)  (a constant),
//   P_e = mean over the N tokens of q_e,  q = softmax(z) (softmax gating) or σ(z)/Σσ(z)
//   (sigmoid gating: normalised so Σ_e P_e = 1 as in the softmax case),
// which equals α when routing is perfectly balanced. Loss() = mean cross-entropy + Σ aux;
// Backward differentiates exactly that. Top-k selection and f_e are
// piecewise constant (no gradient), as in every MoE implementation.
//
// Runtime layout (what the engine shards and the kernels consume). Group 0 = {wte, wpe},
// group L+1 = {lnf.g, lm_head}, group l+1 = block l (without expert_group, see below):
//   dense block: ln1.g, attn.qkv, attn.proj, ln2.g, mlp.fc1 [d_ff,d], mlp.fc2 [d,d_ff]
//   MoE block:   ln1.g, attn.qkv, attn.proj, ln2.g,
//                moe.router [E,d]          one update part, kMatrix with muon_eligible=false
//                moe.w1 [E,f,d]            ALL experts packed in one runtime parameter,
//                moe.w2 [E,d,f]            stacked [E, out, in]; update parts
//                moe.w3 [E,f,d] (SwiGLU)   "blocks.l.moe.w1.e3" = expert 3's [f,d] matrix
//                [moe.shared.w1 [fs,d], moe.shared.w2 [d,fs], moe.shared.w3 [fs,d]]
// so expert-wise Muon updates one expert's matrix as one unit. The router is a 2-D matrix
// (kMatrix: weight decay like every matrix) that the optimizer keeps on AdamW by default
// (UpdatePart::muon_eligible = false): it is small and routing is sensitive to it.
//
// Grouped GEMM: the N·k (token, expert) assignments are permuted into one buffer grouped by
// expert (counting sort: experts in index order, tokens in index order inside each expert —
// deterministic), each expert runs its MLP as plain GEMMs on its slice of the packed weight
// over its contiguous rows (no call for an expert without tokens; rows go in chunks from a
// bounded set of sizes so the GEMM primitive cache stays small), and the outputs are
// un-permuted with a per-token gather of its k rows (scatter-add expressed as a gather:
// deterministic, no races). Backward mirrors it and writes each expert's weight gradient
// straight into its slice of the packed runtime-gradient view; an expert with no tokens gets
// explicit zeros there in kOverwrite mode and is left untouched in kAccumulate mode.
// Weights fp32 or bf16 (bf16 expert GEMMs; the router always multiplies in fp32). One wait
// per MoE block's forward: the E per-expert counts and score sums are read back to the host
// (a grouped GEMM needs each expert's row count there, as Megatron's dropless token counts),
// which computes f_e, the offsets and the aux loss (kernels::MoeBalance) and copies them in.
//
// MXFP8 (engine --weight-dtype mxfp8) needs MoeConfig::expert_group: every MoE block then
// runs as two runtime groups, g = its attention + router {ln1.g, attn.qkv, attn.proj, ln2.g,
// moe.router} and g+1 = its experts {moe.w1, moe.w2, [moe.w3], [moe.shared.*]}, and only the
// expert groups are MX (GroupConsumesMx): E4M3 codes of each packed [E, out, in] weight with
// every expert's own 32x32 blocks, scales relaid out by Tw for the WHOLE packed [E·out, in]
// operand (a cuBLAS-swizzle tile spans 128 rows, i.e. several experts), so the grouped GEMM
// dequantizes the whole packed weight once per Forward/Backward call into fp32 scratch and
// slices experts from it (kernels::MxDequantizeOperand — what an MX GPU GEMM computes); the
// data GEMMs use it, the weight-gradient GEMMs run in fp32 (LinearComputeDType). The router
// (routing decisions), attention, norm gains, dense blocks, embeddings and LM head stay bf16.
// Forward: the attention group computes ln2, router, top-k, gates, aux loss and the permuted
// input; the expert group the experts, shared expert, un-permutation and residual. Backward:
// the expert group leaves ∂/∂ln2 of the experts and ∂/∂gate in scratch, the attention group
// adds the router's part and runs the rest. Without expert_group ConsumesMx() is false and
// the engine refuses mxfp8 (one flat buffer holds one dtype: the router would be FP8 too).
//
//   MoeGpt model(MoeConfig::Preset("moe-tiny"));
//   DenseParams p(model);  p.Init(1);
//   model.SetBatch(tokens, targets, B, T);
//   for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, p.Weights(g));
//   double loss = model.Loss();                          // cross-entropy + aux
//   for (int g = model.num_groups() - 1; g >= 0; --g)
//     model.Backward(g, p.Weights(g), p.Grads(g), GradWrite::kOverwrite);
//   model.GroupParams(1)[5].parts[3].name;               // "blocks.0.moe.w1.e3"
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/backend_buffer.h"
#include "sshsdp/base/op_profile.h"
#include "sshsdp/kernels/moe_kernels.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/llama.h"
#include "sshsdp/params/model.h"

namespace sshsdp {

enum class Gating { kSoftmax, kSigmoid };
enum class ExpertMlp { kSwiGLU, kGelu };
const char* GatingName(Gating g);
const char* ExpertMlpName(ExpertMlp m);
// "softmax" | "sigmoid", "swiglu" | "gelu"; ConfigError otherwise.
Gating ParseGating(std::string_view s);
ExpertMlp ParseExpertMlp(std::string_view s);

struct MoeConfig {
  GptConfig trunk;  // vocab, seq_len, d_model, n_head, n_layer; trunk.d_ff = dense blocks' MLP
  // Set: the trunk is this Llama-family model (Qwen3-MoE: RoPE, GQA, QK-norm, SwiGLU dense
  // blocks), `trunk` its summary (vocab, seq_len, d_model, n_layer, d_ff); the MoE parameters
  // take transformers' names (layers.N.mlp.gate, layers.N.mlp.experts.E.gate_proj / up_proj /
  // down_proj).
  std::optional<LlamaConfig> llama;
  int n_expert = 4;
  int top_k = 2;
  int d_expert = 0;  // hidden width of each expert; 0 means 2 * d_model
  // Block l is an MoE block iff it is listed in moe_layers, or (moe_layers empty)
  // l % moe_every == moe_every - 1: 1 = every block, 2 = blocks 1, 3, 5, ...
  int moe_every = 1;
  std::vector<int> moe_layers;
  Gating gating = Gating::kSoftmax;
  bool renormalize = true;  // divide the k gate weights by their sum
  ExpertMlp expert_mlp = ExpertMlp::kSwiGLU;
  bool shared_expert = false;  // an always-on expert added to every token's output
  int d_shared = 0;            // its hidden width; 0 means d_expert
  float aux_loss_weight = 0.01f;
  // The load-balancing loss's form. false: per block, α·E·Σ_e f_e·P_e summed over the MoE
  // blocks, f_e = the block's share of the N·k assignments (the Switch Transformer). true:
  // transformers' load_balancing_loss_func (Qwen3-MoE with output_router_logits): counts and
  // probabilities pooled over the L MoE blocks, α·E·Σ_e C_e·S_e / (L·N)², C_e = assignments to
  // e and S_e = summed probabilities of e over every block's N tokens.
  bool aux_pooled = false;
  // Run each MoE block as TWO runtime groups: block l's attention + router (ln1.g, attn.qkv,
  // attn.proj, ln2.g, moe.router) and then its experts (moe.w1, moe.w2, [moe.w3], [shared
  // expert]). Required for MXFP8 runtime weights (the expert group is MX, the attention +
  // router group stays bf16: one flat buffer holds one dtype); off by default so the group
  // structure (and checkpoints, "group<g>.*") of existing runs is unchanged. The numerics are
  // the same either way except for the summation order of ∂/∂ln2 (router and shared expert
  // terms are added in the other order).
  bool expert_group = false;

  // "moe-tiny":  d=64,  L=2, H=4, T=64,  E=4, k=2, f=128, SwiGLU, softmax, every block
  //              (a step runs in milliseconds);
  // "moe-small": d=128, L=4, H=4, T=128, E=8, k=2, f=256, SwiGLU, softmax, every block
  //              (the MoE bench workload: trains in minutes on 2 cores).
  // Throws ConfigError naming the presets otherwise.
  static MoeConfig Preset(std::string_view name);
  int expert_ff() const { return d_expert > 0 ? d_expert : 2 * trunk.d_model; }
  int shared_ff() const { return d_shared > 0 ? d_shared : expert_ff(); }
  bool IsMoeLayer(int l) const;
  // Throws ConfigError on bad sizes, top_k outside [1, n_expert], moe_layers out of range.
  void Validate() const;
};

// Qwen3-MoE: the MoE model of a Llama-family config with experts (LlamaConfig::IsMoe) —
// softmax gating, top_k, renormalised when norm_topk_prob, SwiGLU experts of d_expert, the MoE
// blocks LlamaConfig::IsMoeLayer names, and transformers' pooled load-balancing loss
// (aux_pooled) weighted router_aux_loss_coef when output_router_logits, none otherwise.
MoeConfig MoeConfigOf(const LlamaConfig& c);

// The model of a Llama-family config: Llama, or MoeGpt over it for qwen3_moe (expert_group:
// the experts in runtime groups of their own, for MXFP8); on `backend` (null: its own CPU one).
std::unique_ptr<Model> MakeLlamaFamilyModel(const LlamaConfig& c, Backend* backend = nullptr,
                                            bool expert_group = false);

class MoeGpt final : public Model {
 public:
  // On the model's own CPU backend.
  explicit MoeGpt(const MoeConfig& config);
  // On `backend` (not owned; outlives the model), as Gpt.
  MoeGpt(const MoeConfig& config, Backend& backend);
  MoeGpt(const MoeGpt&) = delete;
  MoeGpt& operator=(const MoeGpt&) = delete;

  const MoeConfig& config() const { return c_; }

  int num_groups() const override { return static_cast<int>(roles_.size()); }
  std::vector<RuntimeParamSpec> GroupParams(int g) const override;
  void SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) override;
  void Forward(int g, const std::vector<TensorRef>& w) override;
  // Mean cross-entropy plus the auxiliary losses of all MoE blocks.
  double Loss() const override;
  // The cross-entropies stay on the backend until TakeLosses (Gpt::KeepLoss); the auxiliary
  // losses are host values already (computed with the expert counts).
  void KeepLoss() override;
  std::vector<double> TakeLosses() override;
  const float* Probs() const override { return trunk_->Probs(); }
  bool TiesFirstGroup() const override { return trunk_->TiesFirstGroup(); }
  int64_t ProbsStride() const override { return c_.trunk.padded_vocab(); }
  void Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                GradWrite mode) override;
  // 6·N_active + 12·L·d·T, N_active = GEMM weights one token uses: attention, dense MLPs,
  // per MoE block the router (E·d), top_k experts' matrices (ACTIVE experts only, not E) and
  // the shared expert, and the LM head.
  double FlopsPerToken() const override;
  int64_t ActivationBytes() const override;
  // Kernel time by category (base/op_profile.h): the experts' and shared expert's products
  // count as GEMMs, their activations as activations, the router's gating, auxiliary loss,
  // permutation and combination as routing.
  void SetOpProfile(OpProfile* profile) override {
    profile_ = profile;
    trunk_->SetOpProfile(profile);
  }
  // MXFP8 expert weights: only with expert_group (see MoeConfig), and then only the expert
  // groups are MX (GroupConsumesMx); the router, attention, norm gains, dense blocks,
  // embeddings and LM head stay bf16.
  bool ConsumesMx() const override { return c_.expert_group; }
  bool GroupConsumesMx(int g) const override;
  // The experts dequantize their whole packed weights for the GEMMs: every Tw layout where the
  // backend reads them all (the CPU), row_major elsewhere.
  bool ReadsScaleLayout(ScaleLayout layout) const override {
    return layout == ScaleLayout::kRowMajor || b_.Has(BackendFeature::kAnyScaleLayout);
  }
  // The runtime group holding block l's experts (== its only group without expert_group).
  int ExpertGroup(int l) const;

  double CrossEntropy() const;  // mean over the B·T tokens
  double AuxLoss() const;       // Σ over MoE blocks of α·E·Σ_e f_e·P_e
  // Routing of MoE block l in the last forward: expert of every (token, slot) [B·T, top_k],
  // best first, and tokens per expert [E]. PlanError for a dense block or before forward.
  std::vector<int32_t> Routing(int l) const;
  std::vector<int64_t> ExpertTokens(int l) const;

 private:
  // An MoE block's activations in the backend's arena (null when unused), and the host's
  // copy of what the grouped GEMM needs (each expert's rows) and of its aux loss.
  struct BlockActs {
    float *score, *gate, *frac;            // [N, E] softmax/σ scores, [N, k] gates, [E] f_e
    float *xp, *h1, *h3, *act, *yp;        // permuted rows: input [Nk, d], hidden [Nk, f] ×3, out
    float *sh1, *sh3, *sha;                // shared expert hidden [N, fs] ×3
    int32_t *sel, *offsets, *row, *token;  // [N, k], [E+1], (t,j) → row [N·k], row → t [N·k]
    std::vector<int32_t> offsets_h;        // host: expert e's rows [offsets_h[e], offsets_h[e+1])
    double aux = 0.0;
    bool routed = false;  // routed in this batch's forward
  };
  // Indices of an MoE block's runtime parameters (GroupParams order): the trunk's attention
  // half's, then these; -1 when absent.
  struct MoeSlots {
    int router = 4, w1 = 5, w2 = 6, w3 = -1, s1 = -1, s2 = -1, s3 = -1, count = 7;
  };

  // What a runtime group is: the embedding, a dense block, an MoE block (one group), an MoE
  // block's attention + router group or its expert group (expert_group), the head.
  enum class Role { kEmbed, kDense, kMoe, kAttnRouter, kExperts, kHead };
  struct GroupRole {
    Role role = Role::kEmbed;
    int layer = -1;
  };
  MoeGpt(const MoeConfig& config, std::unique_ptr<Backend> own);
  // MoE block l's runtime parameters as one list (slots_ order).
  std::vector<RuntimeParamSpec> MoeBlockParams(int l) const;
  void CheckViews(int g, const std::vector<TensorRef>& v, const char* what) const;
  size_t NumViews(int g) const;
  void Allocate(int B, int T);  // the MoE blocks' arena for a batch shape
  // Block l's activations after its forward (PlanError for a dense block or before).
  const BlockActs& Routed(int l) const;
  // Router of block l on ln2: scores, top-k, gates, aux loss, permutation and permuted input.
  // aux_pooled: block l's counts and probability sums into pool_count_ / pool_psum_.
  void PoolRouterStats(int l);
  int NumMoeLayers() const;  // blocks with an MoE MLP
  void ForwardRouter(int l, const TensorRef& router);
  // Block l's output = res_mid + MoE(ln2) from the routing above; wx = the expert views (moe.w1
  // first, slots_ order).
  void ForwardExperts(int l, const TensorRef* wx);
  // Routed experts: dx = ∂/∂ln2 (overwritten) from dy = ∂/∂(MoE output), ∂/∂gate into dgate_;
  // weight gradients into the expert gradient views gx (moe.w1 first).
  void BackwardRouted(int l, const TensorRef* wx, const TensorRef* gx, bool acc, const float* dy,
                      float* dx);
  // Shared expert (if any): dx += its ∂/∂ln2.
  void BackwardShared(int l, const TensorRef* wx, const TensorRef* gx, bool acc, const float* dy,
                      float* dx);
  // Router from dgate_ and the aux loss: dx += ∂/∂ln2 through the router, router gradient.
  void BackwardRouter(int l, const TensorRef& router, const TensorRef& grad, bool acc, float* dx);
  // An expert weight view ready for the grouped GEMM: fp32 / bf16 pass through; an MXFP8 view
  // (E4M3 codes of the whole packed [rows, cols] runtime weight, scales relaid out by Tw for
  // that whole operand) is dequantized once into scratch `slot` and returned as fp32.
  TensorRef ExpertView(const TensorRef& t, int64_t rows, int64_t cols, int slot);
  // The router weight as fp32: the view itself, or widened from bf16 into scratch.
  const float* RouterF32(const TensorRef& t);
  kernels::MoeRouterOptions RouterOptions() const;
  // The grouped GEMM's products over an expert's rows, in chunks (moe_experts.cc).
  void ExpertForward(const float* x, const TensorRef& w, float* y, int64_t rows, int64_t n,
                     int64_t k);
  void ExpertBackwardData(const float* dy, const TensorRef& w, float* dx, int64_t rows, int64_t n,
                          int64_t k, bool acc);
  void ExpertBackwardWeight(const float* dy, const float* x, DType compute, void* dw,
                            DType dw_dtype, int64_t rows, int64_t n, int64_t k, bool acc);
  void ActivationForward(const float* h1, const float* h3, float* act, int64_t n);
  void ActivationBackward(const float* h1, const float* h3, float* dh1, float* dh3, int64_t n);
  // f() timed in category c of the profile (SetOpProfile), when there is one.
  template <typename F>
  void Op(OpCategory c, F&& f) {
    OpScope s(profile_, c);
    f();
  }

  std::unique_ptr<Backend> own_;  // the one-argument constructor's CPU backend
  Backend& b_;
  MoeConfig c_;
  // Embeddings, attention, dense blocks, head: the dense GPT's, or the Llama family's
  // (MoeConfig::llama), on b_.
  std::unique_ptr<Trunk> trunk_;
  MoeSlots slots_;
  std::vector<GroupRole> roles_;
  std::vector<int> first_group_;  // first runtime group of block l
  int B_ = 0, T_ = 0;

  BackendBuffer arena_;  // every MoE block's activations and the MoE backward's scratch
  std::vector<BlockActs> blocks_;
  int32_t* count_ = nullptr;  // [E] assignments per expert, and their score sums [E] doubles
  double* psum_ = nullptr;
  std::vector<int32_t> count_h_;  // host copies
  std::vector<double> psum_h_;
  std::vector<float> frac_h_;
  std::vector<double> pool_count_, pool_psum_;  // aux_pooled: C_e and S_e over the MoE blocks
  float *dgate_ = nullptr, *dyp_ = nullptr, *dh1_ = nullptr, *dh3_ = nullptr, *dxp_ = nullptr,
        *dz_ = nullptr, *dsh1_ = nullptr, *dsh3_ = nullptr, *router32_ = nullptr;
  BackendBuffer wgrad_scratch_;  // a bf16 expert gradient summed over row chunks in fp32
  std::vector<std::unique_ptr<BackendBuffer>> mx_scratch_;  // dequantized MX expert weights
  OpProfile* profile_ = nullptr;
  std::vector<double> kept_aux_;  // the aux loss of each kept forward (KeepLoss)

  GroupOrder order_{"MoE GPT"};
};

}  // namespace sshsdp
