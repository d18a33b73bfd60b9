// The interface between a reference model and the training engine.
//
// A model is run layer by layer in "runtime groups" (group 0 = embedding, 1..L = blocks,
// L+1 = final norm + LM head for the GPT). For each group it declares its runtime
// parameters (what kernels consume) and, inside each, the update parts the optimizer sees
// (a head's Q matrix, a norm gain, an embedding table). The engine owns every byte of
// weights and gradients and hands the model views with their dtype; the model never sees a
// shard or a communicator. The model owns only its activations.
//
//   Gpt model(GptConfig::Preset("tiny"));
//   DenseParams p(model);  p.Init(/*seed=*/1);           // single-process fp32 copies
//   model.SetBatch(tokens, targets, B, T);
//   for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, p.Weights(g));
//   double loss = model.Loss();
//   for (int g = model.num_groups() - 1; g >= 0; --g)
//     model.Backward(g, p.Weights(g), p.Grads(g), GradWrite::kOverwrite);
//
// Contract for Backward: gradients are written ONLY into the given views. kOverwrite writes
// every element of every view (embedding rows of tokens that did not occur and position rows
// beyond T get explicit zeros), so a NaN-filled buffer comes out fully defined; kAccumulate
// adds. Gradients are those of the mean loss over the B·T tokens; the engine normalizes over
// microbatches and ranks explicitly after the last reduction (grad_scale = clip / (M · W),
// applied by the optimizer), so the model never sees a scale.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sshsdp/numerics/dtype.h"
#include "sshsdp/numerics/scale_layout.h"

namespace sshsdp {

class OpProfile;  // base/op_profile.h

// How the optimizer treats an update part.
enum class UpdateKind {
  kMatrix,     // 2-D weight: eligible for Muon
  kVector,     // norm gain (1-D): AdamW
  kEmbedding,  // embedding / LM-head table: AdamW by default
};

// How an update part is initialised. Values depend only on (seed, part name, element index),
// so every sharding of the same parameter produces the same weights (see FillInit).
struct InitSpec {
  enum class Kind { kZeros, kOnes, kNormal };
  Kind kind = Kind::kZeros;
  float std = 0.0f;  // kNormal only
  // kNormal: elements at or past this index are zero (the padded vocabulary rows of an
  // embedding / LM-head table: they never take probability mass, get zero gradients and stay
  // zero under AdamW). -1: every element is drawn.
  int64_t zero_from = -1;
};

// One update parameter viewed inside a runtime parameter: `shape` elements (row-major)
// starting `offset` elements into it.
struct UpdatePart {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  UpdateKind kind = UpdateKind::kMatrix;
  InitSpec init;
  // Optimizer hint for a kMatrix part: false keeps the matrix on AdamW even when Muon is on
  // (an MoE router: small, and routing is sensitive to it). The other kinds never use Muon
  // whatever this says; ask MuonEligible().
  bool muon_eligible = true;
  int64_t numel() const;
};

// Whether Muon may update this part: a matrix not marked muon_eligible = false.
inline bool MuonEligible(UpdateKind kind, bool muon_eligible) {
  return kind == UpdateKind::kMatrix && muon_eligible;
}
inline bool MuonEligible(const UpdatePart& p) { return MuonEligible(p.kind, p.muon_eligible); }

// One runtime parameter of a group. Its parts are contiguous, non-overlapping, in offset
// order and cover it exactly (checked by ValidateSpec), so update params are zero-copy views.
struct RuntimeParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<UpdatePart> parts;
  int64_t numel() const;
};

// Throws PlanError naming the parameter if the parts do not tile the runtime parameter.
void ValidateSpec(const RuntimeParamSpec& spec);

// The [rows, cols] view of a shape as an update sees it: [1, n] for vectors, [prod of
// leading dims, last] for rank >= 2.
void MatrixView(const std::vector<int64_t>& shape, int64_t* rows, int64_t* cols);

// A view of one weight or gradient buffer: data pointer and element type (fp32 or bf16; for
// an MXFP8 runtime weight, e4m3 codes of the whole packed [rows, cols] runtime parameter plus
// its UE8M0 scales relaid out by the engine's Tw into `scale_layout` for the per-row scale
// matrix [rows, ceil(cols/32)] — kernels/mx_linear.h reads them; vectors are [1, n]).
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kF32;
  const uint8_t* scales = nullptr;  // MX weights only
  ScaleLayout scale_layout = ScaleLayout::kRowMajor;
};

enum class GradWrite { kOverwrite, kAccumulate };

class Model {
 public:
  virtual ~Model() = default;

  virtual int num_groups() const = 0;
  // Runtime parameters of group g, in the order Forward/Backward take their views.
  virtual std::vector<RuntimeParamSpec> GroupParams(int g) const = 0;

  // Copies the microbatch (tokens and targets are B·T each, row-major [B, T]) and sizes the
  // activation arena. Throws ConfigError on out-of-range tokens or T > seq_len.
  virtual void SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) = 0;

  // Tied embeddings: one update parameter, in group 0, serves both ends. The last group's
  // Forward and Backward then take group 0's views after their own (weights, and gradients the
  // last group's Backward writes with its mode), and group 0's Backward is passed kAccumulate:
  // it adds to what the head wrote (the gradient is the sum). The engine keeps group 0's weights
  // gathered from its forward to its backward and its gradient from the head's backward to its
  // own. DenseParams::ModelWeights / ModelGrads assemble those views.
  virtual bool TiesFirstGroup() const { return false; }

  // Groups run forward in order 0..n-1 and backward in order n-1..0 (checked: PlanError).
  virtual void Forward(int g, const std::vector<TensorRef>& w) = 0;
  // Mean cross-entropy (nats) over the B·T tokens, valid after the last group's Forward.
  virtual double Loss() const = 0;
  // For an engine that reads a step's losses once: KeepLoss() after the last group's Forward
  // keeps that forward's Loss(); TakeLosses() returns the kept losses in order and forgets
  // them. A model whose loss lives on a device keeps them there, so the engine waits for the
  // device once per step instead of once per microbatch. The defaults read Loss() at once.
  virtual void KeepLoss() { kept_losses_.push_back(Loss()); }
  virtual std::vector<double> TakeLosses() { return std::exchange(kept_losses_, {}); }
  virtual void Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                        GradWrite mode) = 0;

  // Model FLOPs per token for forward + backward (no recomputation), for MFU.
  virtual double FlopsPerToken() const = 0;
  // Bytes of the activation arena for the current batch (framework-accounted memory).
  virtual int64_t ActivationBytes() const = 0;
  // Total number of parameters.
  int64_t NumParams() const;
  // Softmax of the last forward's logits, [B·T, ProbsStride()] row-major (padded vocabulary
  // columns are 0), valid after the last group's Forward: what `sshsdp generate` samples
  // from. nullptr when the model keeps none.
  virtual const float* Probs() const { return nullptr; }
  virtual int64_t ProbsStride() const { return 0; }
  // Whether Forward/Backward accept MXFP8 weight views (TensorRef with e4m3 codes + scales).
  // The engine refuses --weight-dtype mxfp8 for models that do not.
  virtual bool ConsumesMx() const { return false; }
  // With --weight-dtype mxfp8, whether group g's runtime weights are MXFP8 (the others stay
  // bf16). One flat buffer holds one dtype, so this is per group. Default: a group is MX when
  // it has update parts and none is an embedding / LM-head table (UpdateKind::kEmbedding) —
  // the dense GPT's blocks. The MoE GPT overrides it: only its expert groups (moe.h).
  virtual bool GroupConsumesMx(int g) const;
  // Whether Forward/Backward read MXFP8 scales relaid out in `layout` (the engine refuses the
  // others before any collective). Default: every layout.
  virtual bool ReadsScaleLayout(ScaleLayout layout) const {
    (void)layout;
    return true;
  }
  // Where Forward/Backward add their kernels' time by category (null: nowhere). For step
  // profiles (sshsdp bench --profile); a model that keeps no profile ignores it.
  virtual void SetOpProfile(OpProfile* profile) { (void)profile; }

 private:
  std::vector<double> kept_losses_;
};

// Writes count initial values of `part` (elements [begin, begin + count) of the part,
// row-major) to out. Deterministic in (seed, part.name, element index) only.
void FillInit(const UpdatePart& part, uint64_t seed, int64_t begin, int64_t count, float* out);

// Dense fp32 (or bf16) copies of all runtime weights and gradients of a model, one
// allocation per parameter: the single-process reference the engine is compared with.
class DenseParams {
 public:
  explicit DenseParams(const Model& model, DType weight_dtype = DType::kF32,
                       DType grad_dtype = DType::kF32);
  // Initialises every update part with FillInit (then rounds to weight_dtype).
  void Init(uint64_t seed);

  int num_groups() const { return static_cast<int>(specs_.size()); }
  const std::vector<RuntimeParamSpec>& specs(int g) const { return specs_[g]; }
  std::vector<TensorRef> Weights(int g);
  std::vector<TensorRef> Grads(int g);
  // The views Forward / Backward of group g take: Weights(g) / Grads(g), followed by group 0's
  // for the last group of a model that ties them (Model::TiesFirstGroup).
  std::vector<TensorRef> ModelWeights(int g);
  std::vector<TensorRef> ModelGrads(int g);
  // GradWrite::kAccumulate for group 0 of such a model (its gradient holds the head's), else
  // `mode`.
  GradWrite ModeOf(int g, GradWrite mode) const;

  // fp32 master copies (what the weights are rounded from) and their gradients as fp32.
  std::vector<float>& master(int g, int i) { return master_[g][i]; }
  std::vector<float> GradAsFloat(int g, int i) const;
  // Re-rounds the master copies into the runtime weights (after an update).
  void SyncWeights();

 private:
  // own, followed by group 0's views when g is the last group of a tied model.
  std::vector<TensorRef> WithTied(int g, std::vector<TensorRef> own,
                                  std::vector<TensorRef> (DenseParams::*views)(int));
  bool tied_ = false;
  DType weight_dtype_, grad_dtype_;
  std::vector<std::vector<RuntimeParamSpec>> specs_;
  std::vector<std::vector<std::vector<float>>> master_;
  std::vector<std::vector<std::vector<uint8_t>>> weights_, grads_;
};

}  // namespace sshsdp
