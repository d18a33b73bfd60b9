// BackendMoeModel: the MoE GPT of moe.h as a Model (params/model.h) whose kernels run on a device
// backend (backend/backend.h) — the engine trains it like MoeGpt, handing it views of its flat
// buffers, so per-expert Muon, the packed [E, out, in] expert weights and every layout run on a
// GPU as on the host. With the CPU backend it trains bit for bit as MoeGpt does
// (engine_backend_moe_test), because every op is the one MoeGpt runs: the trunk (embeddings,
// attention, dense blocks, head) is BackendGpt's, and an MoE block's MLP is
//
//   device:  ln2 (BackendGpt's attention half) → router logits z = ln2·W_rᵀ (fp32 GEMM) →
//            top-k, scores and gates per token (MoeTopK) → per expert, its assignments and
//            score sum (MoeExpertStats)
//   host:    those 2·E numbers copied out (the one wait: a grouped GEMM needs each expert's
//            row count on the host, as Megatron's dropless token counts) → f_e, offsets and the
//            aux loss (MoeBalance) → offsets and f_e copied in
//   device:  the stable counting sort (MoePermute) → xp = ln2[token] (GatherRows) → per
//            expert, GEMMs on its slice of the packed weights over its rows in MoeGpt's row
//            chunks → shared expert → out = Σ_j gate·yp[row] (MoeCombine) + res_mid
//
// and its backward mirrors it on the device with no wait (MoeCombineBackward, the experts,
// MoeRouterBackward through the renormalisation, softmax / σ and the aux loss, the router's
// GEMMs). Each step is kernels/moe_kernels.h's, which MoeGpt runs.
//
// fp32 or bf16 runtime weights (one dtype per group; the router multiplies in fp32, widened
// from bf16), fp32 gradients, fp32 attention (GptConfig::bf16_attention is not run on a
// backend), both group structures (MoeConfig::expert_group). MXFP8 experts (--weight-dtype
// mxfp8, which needs expert_group: only the expert groups are MX) as MoeGpt runs them: each
// packed weight's E4M3 codes, with scales relaid out row-major for the whole [E·out, in]
// operand (ScaleLayout::kRowMajor), are dequantized once per Forward / Backward into fp32
// scratch on the backend (Backend::MxDequantizeRows: Hopper has no MX GEMM), and the expert
// group then runs in fp32 — its data and weight-gradient GEMMs alike.
//
//   std::unique_ptr<Backend> cpu = MakeBackend("cpu");
//   BackendMoeModel model(*cpu, MoeConfig::Preset("moe-tiny"));
//   EngineConfig cfg;  cfg.backend = cpu.get();
//   Engine engine(model, *world, cfg);                   // as with MoeGpt
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/models/backend_gpt.h"
#include "sshsdp/models/backend_views.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

class BackendMoeModel final : public Model {
 public:
  // ConfigError for a config MoeGpt refuses.
  BackendMoeModel(Backend& b, const MoeConfig& c);
  ~BackendMoeModel() override;
  BackendMoeModel(const BackendMoeModel&) = delete;
  BackendMoeModel& operator=(const BackendMoeModel&) = delete;

  int num_groups() const override { return spec_.num_groups(); }
  std::vector<RuntimeParamSpec> GroupParams(int g) const override { return spec_.GroupParams(g); }
  // Sizes the backend's activations for (B, T) when they change, and copies the batch in.
  void SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) override;
  void Forward(int g, const std::vector<TensorRef>& w) override;
  // Mean cross-entropy plus the MoE blocks' auxiliary losses (MoeGpt::Loss).
  double Loss() const override;
  // The cross-entropies stay on the backend until TakeLosses (BackendGpt::KeepLoss); the
  // auxiliary losses are host values already (read with the expert counts).
  void KeepLoss() override;
  std::vector<double> TakeLosses() override;
  void Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                GradWrite mode) override;
  // MoeGpt's count at the batch's T (the spec, never given a batch, counts the preset's seq_len).
  double FlopsPerToken() const override {
    const GptConfig& c = c_.trunk;
    const int T = T_ > 0 ? T_ : c.seq_len;
    return spec_.FlopsPerToken() + 12.0 * c.n_layer * c.d_model * (T - c.seq_len);
  }
  // The trunk's activations and scratch plus the MoE blocks' (backend memory), and the host
  // copies of the routing.
  int64_t ActivationBytes() const override;
  // MXFP8 runtime weights for the expert groups only (MoeConfig::expert_group).
  bool ConsumesMx() const override { return c_.expert_group; }
  // MXFP8 weights are dequantized for the GEMMs from per-row scales (Backend::MxDequantizeRows).
  bool ReadsScaleLayout(ScaleLayout layout) const override {
    return layout == ScaleLayout::kRowMajor;
  }
  bool GroupConsumesMx(int g) const override { return spec_.GroupConsumesMx(g); }

  // The routing of MoE block l in the last forward, as MoeGpt::Routing / ExpertTokens.
  std::vector<int32_t> Routing(int l) const;
  std::vector<int64_t> ExpertTokens(int l) const;
  double AuxLoss() const;

 private:
  enum class Role { kEmbed, kDense, kMoe, kAttnRouter, kExperts, kHead };
  struct GroupRole {
    Role role = Role::kEmbed;
    int layer = -1;
  };
  // View indices of an MoE block (MoeGpt's order); -1 when absent.
  struct Slots {
    int router = 4, w1 = 5, w2 = 6, w3 = -1, s1 = -1, s2 = -1, s3 = -1, count = 7;
  };
  // An MoE block's device activations, and the host's copy of what the grouped GEMM needs
  // (each expert's rows) and of its aux loss.
  struct Block {
    float *score = nullptr, *gate = nullptr, *frac = nullptr, *xp = nullptr, *h1 = nullptr,
          *h3 = nullptr, *act = nullptr, *yp = nullptr, *sh1 = nullptr, *sh3 = nullptr,
          *sha = nullptr;
    int32_t *sel = nullptr, *offsets = nullptr, *row = nullptr, *token = nullptr;
    std::vector<int32_t> offsets_h;  // host: expert e's rows [offsets_h[e], offsets_h[e+1])
    double aux = 0.0;
  };

  void Allocate(int B, int T);
  void RequireBf16Scratch();         // allocates x16_ / dy16_ on the first bf16 product
  const Block& Routed(int l) const;  // PlanError unless block l is MoE and routed this batch

  // The MoE MLP of block l; wx: the router's view first when `router`, then the experts'.
  void ForwardRouter(int l, const void* router, DType wdt);
  void ForwardExperts(int l, const void* const* wx, DType wdt);
  // dln2_ = ∂/∂ln2 from the experts (overwritten) and ∂/∂gate into dgate_; weight gradients.
  void BackwardRouted(int l, const void* const* wx, DType wdt, float* const* gx, bool acc);
  void BackwardShared(int l, const void* const* wx, DType wdt, float* const* gx, bool acc);
  // dln2_ += the router's part; the router's gradient.
  void BackwardRouter(int l, const void* router, DType wdt, float* grad, bool acc);
  const float* RouterF32(const void* router, DType wdt);

  // MoeGpt's linear layers on the backend (kernels/matmul.h's contracts; bf16 weights: bf16
  // roundings of the fp32 operand), and the grouped GEMM's row chunks (MoeChunkRows).
  void Linear(const float* x, const void* w, DType wdt, float* y, int64_t m, int64_t n, int64_t k);
  void LinearBackwardData(const float* dy, const void* w, DType wdt, float* dx, int64_t m,
                          int64_t n, int64_t k, bool acc);
  void LinearBackwardWeight(const float* dy, const float* x, DType wdt, float* dw, int64_t m,
                            int64_t n, int64_t k, bool acc);
  void ExpertForward(const float* x, const void* w, DType wdt, float* y, int64_t rows, int64_t n,
                     int64_t k);
  void ExpertBackwardData(const float* dy, const void* w, DType wdt, float* dx, int64_t rows,
                          int64_t n, int64_t k, bool acc);
  void ExpertBackwardWeight(const float* dy, const float* x, DType wdt, float* dw, int64_t rows,
                            int64_t n, int64_t k, bool acc);

  Backend& b_;
  MoeConfig c_;
  MoeGpt spec_;  // the runtime parameters and FLOPs (never given a batch)
  Slots slots_;
  std::vector<GroupRole> roles_;
  std::unique_ptr<BackendGpt> gpt_;  // the trunk, on the engine's views
  int B_ = 0, T_ = 0;
  std::vector<Block> blocks_;  // per layer (unused for dense blocks)
  float* arena_ = nullptr;     // every MoE activation and scratch, one allocation
  int64_t arena_bytes_ = 0;
  int32_t* count_ = nullptr;  // E assignments per expert and their score sums (E doubles)
  double* psum_ = nullptr;
  std::vector<int32_t> count_h_;  // host
  std::vector<double> psum_h_;
  std::vector<float> frac_h_;
  float *dz_ = nullptr, *dgate_ = nullptr, *dyp_ = nullptr, *dh1_ = nullptr, *dh3_ = nullptr,
        *dxp_ = nullptr, *dln2_ = nullptr, *dsh1_ = nullptr, *dsh3_ = nullptr, *router32_ = nullptr;
  void* bf16_scratch_ = nullptr;  // x16_ and dy16_, once a bf16 weight was seen
  bf16 *x16_ = nullptr, *dy16_ = nullptr;
  int64_t bf16_bytes_ = 0;
  std::vector<char> routed_;  // per block: routed in this batch's forward
  MxScratch mx_;  // one expert group's dequantized MXFP8 weights (fp32; backend_views.h)
  int fwd_next_ = 0, bwd_next_ = -1;
  bool loss_valid_ = false;
  std::vector<double> taken_;     // kept cross-entropies of a trunk a new batch shape replaced
  std::vector<double> kept_aux_;  // the aux loss of each kept forward
};

}  // namespace sshsdp
