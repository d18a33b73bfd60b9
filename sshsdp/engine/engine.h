// Engine: the sharded training step of docs/design.md, One step on real ranks — runtime parameters
// decoupled from update parameters, ZeRO-3 weight all-gather, ZeRO-2 gradient
// reduce-scatter with fused accumulation, outer ZeRO-1 reduce-scatter / all-gather, HSDP
// replicas, structured updates on ZeRO-1 shards (AdamW; Muon per head / matrix / expert with
// point-to-point units, or FSDP2-style full_tensor gathers with ⑥), weight preparation G and
// weight reuse.
//
// The engine is a library: a user hands it a Model (which declares runtime parameters and
// their update parts, and computes a layer from views) and a world Communicator; the engine
// owns every byte of weights, gradients and optimizer state, and the model never sees a
// shard or a communicator. EngineConfig::redundancies and ::shard_layout (redundancy.h,
// presets.h) switch on the Figure-2 redundancies of FSDP2 / Megatron-FSDP / veScale-FSDP in
// this same step, for baselines that share every kernel and collective.
//
//   auto world = MpiCommunicator::World(ranks_per_node);
//   Gpt model(GptConfig::Preset("tiny"));
//   EngineConfig cfg;  cfg.sw = 2; cfg.sg = 2; cfg.so = 4; cfg.microbatches = 4;
//   Engine engine(model, *world, cfg);
//   engine.InitWeights(/*seed=*/1);
//   for (int s = 0; s < steps; ++s) {
//     StepStats st = engine.Step([&](int mb, int32_t* tok, int32_t* tgt) { ...fill B*T... });
//   }
//
// Per step, on every rank (R = this rank's buffers of one runtime group = one layer):
//   microbatch m, forward g = 0..n-1: all-gather Wᶻ³ → W′ (next layer prefetched on the
//     communication thread); Model::Forward on views; release W′ (reshard_after_forward).
//   backward g = n-1..0: re-gather if released; Model::Backward writes straight into views of
//     G′ (overwrite mode: covers every element); reduce-scatter G′ in the ZeRO-2 group on the
//     communication thread, accumulating into the persistent fp32 G′ᶻ² (m > 0) — no
//     per-parameter gradient tensors, no send-buffer copy, no add pass. With sg = 1, G′ IS
//     G′ᶻ² and microbatches m > 0 accumulate in backward directly.
//   after the last microbatch: outer reduce-scatter G′ᶻ² → Gᶻ¹ in the replica group (a view
//     when so = sg), all-reduce across HSDP replicas (so < W) — with overlap_outer queued on
//     the communication thread per group as soon as its last gradient is in, while backward
//     goes on — gradient norm over shards,
//     the structured update with grad_scale = clip / (microbatches · W) (explicit SUM
//     normalization) — update/ programs on the ZeRO-1 fragments: AdamW everywhere, or Muon per
//     unit (head / matrix / expert) beside AdamW for vectors and embeddings, split units moved
//     point to point within the HSDP replica (StructuredUpdate) — G
//     (fp32 → runtime dtype, written into the ZeRO-1 slice of the retained Wᶻ³ buffer), and
//     the outer all-gather in place within Wᶻ³ (overlap_outer: deferred to each group's first
//     gather of the next forward, layer by layer) — retained across the next step's
//     microbatches.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/base/error.h"
#include "sshsdp/base/memory_account.h"
#include "sshsdp/base/trace.h"
#include "sshsdp/comm/comm_path.h"
#include "sshsdp/comm/comm_thread.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/comm/direct_device.h"
#include "sshsdp/engine/reduce_mode.h"
#include "sshsdp/engine/redundancy.h"
#include "sshsdp/layout/data_node.h"
#include "sshsdp/layout/shard_chain.h"
#include "sshsdp/layout/topology.h"
#include "sshsdp/numerics/scale_layout.h"
#include "sshsdp/params/model.h"
#include "sshsdp/params/param_layout.h"
#include "sshsdp/update/adamw.h"
#include "sshsdp/update/structured_update.h"

namespace sshsdp {

class RegisteredSlots;
class StagedCommunicator;
class MxWeights;
struct RuntimeGroup;  // engine_internal.h
class TransientPool;
class DataPath;

enum class NonFinitePolicy { kStop, kSkip };

// "stop" | "skip"; ConfigError otherwise.
NonFinitePolicy ParseNonFinitePolicy(const std::string& name);

struct EngineConfig {
  int sw = 1, sg = 1, so = 1;  // weight / gradient / optimizer shard degrees (sw | sg | so | W)
  int ranks_per_node = 0;      // 0: the whole world is one node
  int microbatches = 1;        // per optimizer step
  int batch_size = 1;          // samples per microbatch per rank
  int seq_len = 0;             // 0: the model's maximum
  // Runtime weights w / W′: fp32, bf16, or kE4M3 = MXFP8 (E4M3 elements + UE8M0 scales, 32x32
  // blocks; groups holding embedding / LM-head tables stay bf16 — mx_weights.h).
  DType weight_dtype = DType::kBF16;
  bool reshard_after_forward = true;  // release gathered weights after forward (FSDP2 default)
  bool prefetch = true;               // all-gather the next layer while this one computes
  // The outer phase on the communication thread, overlapping compute (paper §3.4): each
  // group's outer reduce-scatter and HSDP all-reduce start as soon as its last microbatch's
  // gradient is complete (during the rest of backward), and its outer all-gather of the
  // prepared weights is deferred to its first gather of the next forward (layer by layer).
  // Off: both run on this thread in the update phase. Same collectives, same bits either way.
  bool overlap_outer = true;
  AdamWConfig adamw;
  float clip_norm = 1.0f;  // global gradient-norm clipping; 0 disables
  // kAdamW: AdamW for every parameter. kMuon: Muon for matrices, one unit per `muon_unit`
  // (kHead: each update parameter — per head for QKV, per expert for stacked experts;
  // kMatrix: each runtime parameter's parts merged, e.g. QKV as one [3d, d] matrix), AdamW for
  // norm gains, embeddings, the LM head and matrices marked muon_eligible = false.
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  MuonConfig muon;
  UnitRule muon_unit = UnitRule::kHead;
  std::map<std::string, UnitRule> unit_overrides;  // by update- or runtime-parameter name
  // Baselines as switches (redundancy.h; presets.h sets them per framework): the Figure-2
  // redundancies to pay and the shard layout of the flat buffers. Defaults: sshsdp.
  Redundancies redundancies;
  ShardLayout shard_layout = ShardLayout::kFlat;
  // MXFP8 runtime weights: the layout Tw relays the scales of every packed runtime weight
  // into (scale_layout.h), for the kernels that consume them.
  ScaleLayout scale_layout = ScaleLayout::kCublasSwizzle;
  // Gradient reduction precision (reduce_mode.h, paper §4.3) and the seed of its stochastic
  // rounding (bf16sr). Checkpoint state: sr_seed and the optimizer step (Engine::SrState).
  ReduceMode reduce = ReduceMode::kFp32;
  uint64_t sr_seed = 0;
  // How the per-microbatch ZeRO-3 all-gather and ZeRO-2 reduce-scatter move bytes
  // (comm_path.h): ring collectives, or the direct (ZeroSM) path — gather buffers and G′ in
  // registered windows, one-sided transfers, inter-node-first all-gather, node-local reduction
  // before the inter-node exchange (direct_communicator.h). Needs ZeRO-3 and ZeRO-2 groups
  // spread evenly over nodes (LayoutError at construction otherwise); or NCCL, for the engine
  // on a device backend only (ConfigError otherwise).
  CommPath comm_path = CommPath::kCollective;
  // A step whose loss or gradient norm is not finite (both are already all-reduced, so every
  // rank sees the same): kStop throws NonFiniteError on every rank before the update is
  // applied; kSkip leaves weights, optimizer state and the step count as they were.
  NonFinitePolicy on_nonfinite = NonFinitePolicy::kStop;
  // Timeline spans of every step (base/trace.h: forward / backward per group, each runtime
  // collective on the communication thread with its bytes, waits, the update phase, G,
  // copies); not owned, null: none.
  Tracer* tracer = nullptr;
  // The backend the engine runs on (backend/backend.h; not owned). Null: the engine makes its
  // own CPU backend (MakeCpuBackend), the default. Every data-tree root and the transient
  // gather and gradient blocks live in its memory; G, fills, the gradient norm, the finiteness
  // check, AdamW and Muon (momentum, batched Newton–Schulz, weight update) run as its ops; a
  // model that computes on a backend must compute on this one (models/gpt.h).
  // On a device (Backend::host_memory false) the engine runs so far (ConfigError naming the
  // setting otherwise, at construction): fp32 reduction, the flat layout without the
  // baselines' redundancies, MXFP8 with row-major scales (mx_weights.h: G on the backend, S on
  // the host), checkpoints through host mirrors (Zero1Fields), every (sw, sg, so) layout; its
  // memory moves in the runtime ZeRO-3 / ZeRO-2 groups on the direct path over `direct_device`
  // (one node) or over NCCL (comm_path = nccl: NcclCommunicators, any node count; not needed
  // when sw = sg = 1), and in the outer groups over NCCL with comm_path = nccl, else staged
  // through host memory over MPI (StagedCommunicator). Host memory (the CPU backend) moves
  // over MPI in place.
  Backend* backend = nullptr;
  DirectDeviceMemory* direct_device = nullptr;
};

// Throws ConfigError naming the field unless the hyperparameters and sizes of `cfg` are
// usable (AdamW / Muon ranges, clip_norm finite and >= 0, microbatches and batch_size >= 1,
// seq_len >= 0). No communication: callers run it before any collective (the Engine
// constructor runs it too).
void ValidateEngineConfig(const EngineConfig& cfg);

// A step's loss or gradient norm was not finite (EngineConfig::on_nonfinite = kStop).
class NonFiniteError : public NumericsError {
 public:
  using NumericsError::NumericsError;
};

// Deterministic counters of one step (tests assert them exactly).
struct StepCounters {
  CommCounters runtime_comm;           // per-microbatch all-gathers and reduce-scatters
  CommCounters update_comm;            // outer RS / HSDP all-reduce / norm / update p2p, and the
                                       // outer AG of the weights this step used (the last
                                       // update's, with overlap_outer)
  uint64_t bytes_copied = 0;           // memcpy-style copies outside compute and collectives
  uint64_t collective_copy_bytes = 0;  // copies inside collectives (an out-of-place
                                       // all-gather's own shard into the gathered buffer;
                                       // CommCounters::local_copy_bytes), every preset alike
  CopyBytes copies;                    // the same bytes by path (weight copy-in/out, pack, ...)
  uint64_t add_passes = 0;             // separate gradient-accumulation passes (0: fused)
  uint64_t fused_accumulations = 0;    // microbatch gradients accumulated by the reduce-scatter's
                                       // last step (or by backward itself when sg = 1)
  uint64_t weight_preps = 0;           // G invocations (cast/quantize passes over ZeRO-1 shards;
                                       // with ② one more per all-gather, over ZeRO-3 shards)
  uint64_t gathers = 0;                // ZeRO-3 all-gathers issued
  uint64_t backend_events = 0;         // on a backend: hand-offs to the communication thread by
                                       // event (one per task that moves backend memory there)
  uint64_t backend_waits = 0;          // on a backend: the compute thread waiting for its
                                       // queued ops (a main-thread collective on another
                                       // stream); reads of a value (the loss) are not counted
  uint64_t outer_overlapped = 0;       // outer-phase tasks run on the communication thread
                                       // (EngineConfig::overlap_outer): per group one for its
                                       // outer reduce-scatter + HSDP all-reduce pair, and one
                                       // for its outer all-gather (the last update's, run in
                                       // this step's forward or an Evaluate before it)
  uint64_t scale_relayouts = 0;        // MXFP8 Tw: per-group scale relayouts into S′ (once per
                                       // step with weight reuse; per gather with ②)
  uint64_t mx_split_bands = 0;         // MXFP8 G: 32-row bands split across ZeRO-1 shards
  uint64_t mx_p2p_bytes = 0;           // MXFP8 G: point-to-point bytes this rank sent
  uint64_t staged_bytes = 0;           // device <-> host copies of the outer phase's groups
                                       // staged through host memory (the engine on a device
                                       // without NCCL; StagedCommunicator); what those groups
                                       // sent is in update_comm as on the host
  CommCounters update_p2p;             // structured update: fetch/return of split units (also in
                                       // update_comm)
  CommCounters update_full_tensor;     // ⑥ full_tensor: per-parameter all-gathers of Muon's u
                                       // over the ZeRO-1 group (also in update_comm)
  double update_exec_cost = 0;         // unit-stage work this rank ran (Newton–Schulz FLOPs; with
                                       // ⑥ full_tensor every Muon unit, on every rank)
};

struct StepStats {
  int64_t step = 0;
  double loss = 0;       // mean over all microbatches of all ranks
  double grad_norm = 0;  // before clipping, of the normalized gradient
  bool skipped = false;  // non-finite loss or norm under NonFinitePolicy::kSkip: not applied
  double seconds = 0;
  int64_t tokens = 0;  // tokens processed by all ranks
  StepCounters counters;
  TimeSplit time;  // this rank's main-thread seconds by category
};

// Fills tokens and targets (batch_size · seq_len each) of microbatch `mb` for this rank.
using BatchFn = std::function<void(int mb, int32_t* tokens, int32_t* targets)>;

class Engine {
 public:
  // Builds topology, layouts, shard chains, buffers and communicators. Throws ConfigError /
  // LayoutError (before any collective beyond the communicator splits) on an invalid layout
  // or world size.
  Engine(Model& model, Communicator& world, const EngineConfig& cfg);
  ~Engine();

  // Initializes main weights at ZeRO-1 (values depend only on seed, parameter name and
  // element index, so every layout starts identical), zeroes optimizer state, runs G and the
  // outer all-gather (with overlap_outer: defers it to the first forward). Collective.
  void InitWeights(uint64_t seed);

  // One optimizer step over cfg.microbatches microbatches. Collective.
  StepStats Step(const BatchFn& batch);

  // Validation: the mean loss of `batches` microbatches per rank (batch(i, ...) fills the
  // i-th), averaged over every rank's. Forward only, through the sharded weights gathered as
  // in training (prefetch included); no gradient, no reduce-scatter, no optimizer state or step
  // touched, so training after it is bit-identical to training without it. Collective (it
  // also runs the outer all-gathers deferred from the last update — overlap_outer — whose
  // counts go to the next Step's counters, as they would without the evaluation).
  double Evaluate(const BatchFn& batch, int batches);

  // Consolidated fp32 main weights of every update parameter, by name (collective; every
  // rank receives all). For tests, safetensors export and reports.
  std::map<std::string, std::vector<float>> GatherMainWeights();
  // Overwrites main weights from consolidated values (missing names: ConfigError), then
  // re-runs G and the outer all-gather (or defers it, as InitWeights). Collective.
  void LoadMainWeights(const std::map<std::string, std::vector<float>>& weights);
  // The same from a reader of elements [begin, begin + count) of an update parameter: each rank
  // asks only for what its ZeRO-1 shards hold (a large checkpoint read in pieces,
  // hf/hf_weights.h). A reader that throws on some ranks only makes every rank throw, agreed
  // over the world before any weight is gathered (its error on its rank, "other ranks could
  // not read" on the others).
  using WeightReader =
      std::function<void(const std::string& name, size_t begin, size_t count, float* out)>;
  void LoadMainWeights(const WeightReader& read);

  // The persistent ZeRO-1 state of every runtime group, for checkpoints: fp32 arrays over
  // this rank's ZeRO-1 chunk of the group's flat layout, one per field ("main", "m", "v";
  // element i of the chunk is element chunk.begin + i of the group buffer, stored at
  // data.At(i)). Which member tensor each element belongs to comes from `layout` and `chain`
  // (ShardChain::Fragments(kZero1)). Each optimizer keeps only its own fields (AdamW: m, v;
  // Muon: m, in the same element layout): a field some parameters lack is packed
  // (data.packed; At is nullptr where it is not stored — StateLayout). On a backend
  // (EngineConfig::backend) the arrays are host mirrors filled from the backend's memory by this
  // call: a checkpoint load writes them and UploadZero1Mirrors copies them back; a save reads
  // them and ReleaseZero1Mirrors frees them.
  struct Zero1Field {
    std::string field;
    int group = 0;
    Zero1Array data;
    Range chunk;
    const GroupLayout* layout = nullptr;
    const ShardChain* chain = nullptr;
    const std::vector<MemberPiece>* pieces = nullptr;  // member -> update parameter (SpanOf)
  };
  // read_state = false (a load, which overwrites every element): a backend's mirrors are
  // allocated but not filled.
  std::vector<Zero1Field> Zero1Fields(bool read_state = true);
  // How the optimizer-state fields of a group with this layout (its update parameters'
  // optimizers set) are stored over a ZeRO-1 chunk with these fragments: dense, or packed
  // runs (offsets from the field's start; data unset). A pure function of the layout, so a
  // checkpoint writer computes every rank's.
  static std::map<std::string, Zero1Array> StateLayout(const GroupLayout& layout,
                                                       const std::vector<MemberPiece>& pieces,
                                                       const std::vector<Fragment>& zero1);
  // After the ZeRO-1 state was overwritten (checkpoint load): sets the optimizer step and
  // re-runs G and the outer all-gather (or defers it, as InitWeights). Collective.
  void RestoreState(int64_t step);
  // On a backend: copies the host mirrors of the last Zero1Fields call into its memory (after a
  // checkpoint load wrote them; DeviceError if a copy fails), then frees them. Local.
  void UploadZero1Mirrors();
  // Frees the host mirrors of a backend's ZeRO-1 state (after a checkpoint save read them).
  void ReleaseZero1Mirrors() { zero1_mirrors_.clear(); }
  // Stochastic-rounding state of the bf16sr reduction, for checkpoints: every draw is a
  // function of (seed, step, stream, element), so saving {seed, step} and restoring the step
  // (RestoreState) with the same EngineConfig::sr_seed resumes the exact rounding.
  struct SrState {
    uint64_t seed = 0;
    int64_t step = 0;
  };
  SrState sr_state() const { return {cfg_.sr_seed, step_}; }

  // MXFP8 runtime weights (weight_dtype = kE4M3) of every MX runtime parameter, by name:
  // E4M3 codes [rows, cols] row-major (consolidated from the ZeRO-1 shards) and the scales
  // relaid out by Tw (EngineConfig::scale_layout). Collective; for tests and reports.
  struct MxRuntimeWeight {
    std::vector<uint8_t> codes, scales;
  };
  std::map<std::string, MxRuntimeWeight> GatherMxWeights();

  const Topology& topology() const { return topo_; }
  const EngineConfig& config() const { return cfg_; }
  const MemoryAccount& memory() const { return memory_; }
  int64_t step() const { return step_; }
  // Collective over the world: true when every rank's fp32 main weights and optimizer state
  // (its ZeRO-1 fragments) are finite. Checked before a checkpoint or weights file is written.
  bool StateIsFinite();
  // Learning rate of the next steps (schedules live in the caller).
  void SetLearningRate(float lr) { cfg_.adamw.lr = lr; }
  void SetMuonLearningRate(float lr) { cfg_.muon.lr = lr; }
  // The update phase: per-parameter optimizers, plans (units, execution ranks, messages),
  // statistics of the last step's update.
  const StructuredUpdate& structured_update() const { return *update_; }
  // Update parameters in model order (name, shape, kind).
  std::vector<UpdateParam> UpdateParams() const;

 private:
  void PrepareMx();  // MXFP8: G on bands, S gathers, Tw
  void BuildGroup(int g);
  void ZeroState(RuntimeGroup& g);  // optimizer state := 0 on the backend
  void SyncBackend();               // waits for the backend's queued ops
  // Queues `task` (a collective on `comm` for group g, traced as `name`) on the communication
  // thread. It first waits there for an event recorded now on the backend: whatever the compute
  // stream was asked to do before — a backward writing G′, a forward reading a slot about to
  // be regathered — has run before the task touches the memory (the compute thread goes on).
  CommHandle SubmitComm(const char* name, int g, Communicator* comm, std::function<void()> task);
  // A finalized root of `bytes` (at least 64) in the backend's memory, zeroed, accounted under
  // `category`.
  std::unique_ptr<DataNode> Buffer(const std::string& name, size_t bytes,
                                   const std::string& category);
  void StartGather(int g);
  void WaitGather(int g);
  void ReleaseGather(int g);
  void PrepareAndGatherWeights();  // G + outer all-gather (or its deferral)
  void StartOuterGather(int g);    // submit group g's deferred outer all-gather, if pending
  // Outer reduce-scatter + HSDP all-reduce of group g: OuterReduce runs them here;
  // SubmitOuterReduce queues them on the communication thread (overlap_outer).
  void OuterReduce(RuntimeGroup& g);
  void SubmitOuterReduce(int g);
  void SetUpDirectPath();           // comm_path = direct: direct communicators, registered slots
  void SetUpOuterGroupsOnDevice();  // the outer groups on a device: NCCL or staged
  uint64_t StagedBytes() const;     // device <-> host bytes of the staged outer groups so far
  void BuildUpdate();               // optimizers, units, plans of the structured update
  void AllocateState(RuntimeGroup& g);  // each optimizer's state fields (after BuildUpdate)
  // The model's activation bytes (ActivationBytes) accounted as "activations", when changed.
  void AccountActivations();
  void SetModelBatch(const int32_t* tokens, const int32_t* targets);  // + activation accounting
  void ForwardPass(bool release_all);  // every group's forward (Step and Evaluate)
  // Backward of group g in microbatch mb, and the submission of its reduce-scatter.
  void BackwardGroup(int g, int mb);
  void FinishReduceScatter(int g);  // wait, recycle G′ and the data path's buffers
  // A transient G′ block for group g's backward (none when it writes G′ᶻ² directly).
  void AttachGradBlock(RuntimeGroup& g);
  // After the last microbatch: outer reduce-scatter and HSDP all-reduce (with overlap_outer
  // only their completion: they ran behind backward), norm, F, G, outer all-gather (or its
  // deferral). Fills st (loss, norm, skipped).
  void UpdatePhase(double loss_sum, StepStats* st);

  // The CPU backend the engine made when EngineConfig::backend was null (destroyed last: every
  // member below may hold its memory).
  std::unique_ptr<Backend> own_backend_;
  Model& model_;
  Communicator& world_;
  EngineConfig cfg_;  // cfg_.backend is never null (own_backend_ when none was given)
  bool on_device_;    // !cfg_.backend->host_memory(): memory MPI cannot move in place
  Topology topo_;
  int rank_;
  MemoryAccount memory_;
  std::vector<std::unique_ptr<RuntimeGroup>> groups_;

  // Communicators: runtime ones used only by the comm thread; update ones by this thread,
  // except the outer ones (replica RS / AG, HSDP), which the comm thread runs while the
  // outer phase overlaps compute — never both threads at once: this thread waits for every
  // outer task before it uses them again.
  std::unique_ptr<Communicator> rt_dup_, rt_zero3_, rt_zero2_;
  std::unique_ptr<Communicator> up_replica_rs_, up_replica_ag_, up_hsdp_;
  std::vector<StagedCommunicator*> staged_;  // those of them staged through host memory
  uint64_t carried_staged_ = 0;              // staged by an Evaluate's outer all-gathers
  std::unique_ptr<CommThread> comm_thread_;
  std::unique_ptr<Communicator> up_p2p_;    // structured-update point to point (world duplicate)
  std::unique_ptr<Communicator> up_zero1_;  // ⑥ full_tensor: ZeRO-1 group, ordered by chunk
  // MXFP8 on a device or off the collective path: S (host memory, mx_weights.h) gathers over
  // MPI in the replica and ZeRO-3 groups of its own while W moves on the device, or in the
  // ZeRO-3 groups on the direct path (null otherwise: S uses up_replica_ag_ and rt_zero3_; on
  // the host's direct path the replica group is plain MPI, duplicated for symmetry).
  std::unique_ptr<Communicator> mx_replica_ag_, mx_zero3_;
  std::unique_ptr<StructuredUpdate> update_;
  std::string first_structured_;  // first update parameter on a structured (Muon) unit, or ""

  // Transient gather / gradient / copy buffers, reused by size (accounted as "transient").
  std::unique_ptr<TransientPool> pool_;
  // How W′ and G′ meet the model's tensors: sshsdp's views, or the baselines' copies.
  std::unique_ptr<DataPath> path_;
  // comm_path = direct: gather buffers (W′) and runtime gradients (G′) are slots of roots
  // registered with the ZeRO-3 / ZeRO-2 direct communicators, not transient blocks.
  std::unique_ptr<RegisteredSlots> gather_slots_, grad_slots_;

  StepCounters counters_;
  CopyMeter copy_meter_;
  TimeSplit time_;
  DType store_dtype_ = DType::kBF16;  // persistent ZeRO-3 weights (fp32 with ②)
  bool skip_gather_ = false;          // sw = 1 and nothing to cast or copy: W′ is Wᶻ³
  bool skip_rs_ = false;              // sg = 1 and direct fused accumulation: G′ is G′ᶻ²
  // Model::TiesFirstGroup: group 0's weights stay gathered from its forward to its backward,
  // its gradient from the last group's backward (which writes it first, into these views) to
  // its own.
  bool tied_ = false;
  std::vector<TensorRef> tied_grads_;
  DType grad_dtype_ = DType::kF32;  // G′: fp32, or bf16 in the bf16 reduce modes
  std::unique_ptr<MxWeights> mx_;   // MXFP8 runtime weights (weight_dtype = kE4M3)
  int64_t step_ = 0;
  // Deferred outer all-gathers run by an Evaluate between steps: counted into the next Step.
  CommCounters carried_update_comm_;
  uint64_t carried_outer_ = 0;
  int uncaught_at_construction_ = std::uncaught_exceptions();
  // Roots in the backend's memory, freed when the engine goes (also when its
  // constructor throws); destroyed before the members above, after ~Engine drained the
  // communication thread.
  struct BackendBlocks {
    Backend* backend = nullptr;
    std::vector<void*> blocks;
    ~BackendBlocks() {
      for (void* p : blocks) backend->Free(p);
    }
  } backend_blocks_;
  // Zero1Fields on a backend: each state array's host copy and where it lives on the backend.
  struct Zero1Mirror {
    float* device = nullptr;
    std::vector<float> host;
  };
  std::vector<Zero1Mirror> zero1_mirrors_;
  uint64_t activation_bytes_ = 0;
};

}  // namespace sshsdp
