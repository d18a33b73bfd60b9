// Engine internals shared by its sources (not installed): the buffers of one runtime group,
// the transient-buffer pool, and the data paths between the flat buffers and the model's
// tensors — sshsdp's own path (views, no copies) and the baselines' (redundancy.h) behind one
// interface, so Engine::Step has one schedule and no per-baseline branches.
//
//   TransientPool pool(&memory);
//   std::unique_ptr<DataPath> path = MakeDataPath(ctx);   // ViewPath or the baselines'
//   comm_thread.Submit(path->GatherTask(g, zero3));       // fill W′ (② cast, ③ copy-in)
//   path->GatherArrived(g);                               // after the wait
//   model.Forward(gi, path->Weights(g));                  // views, or ③ copy-out / ① pack
//   model.Backward(gi, w, path->GradTargets(g), mode);    // views of G′, or ④ tensors
//   comm_thread.Submit(path->ReduceTask(g, zero2, acc, ro));  // ④ copy-in, RS, ⑤ add
//   path->ReduceDone(g);                                  // after its wait
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sshsdp/base/memory_account.h"
#include "sshsdp/comm/comm_thread.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/layout/data_node.h"
#include "sshsdp/layout/shard_chain.h"
#include "sshsdp/update/update_executor.h"

namespace sshsdp {

// The buffers of one runtime group (one layer) on this rank.
struct RuntimeGroup {
  GroupLayout layout;
  DType wdt = DType::kBF16;   // runtime weight dtype of this group (kE4M3: MXFP8)
  DType sdt = DType::kBF16;   // persistent ZeRO-3 weight dtype (fp32 with ②)
  void* f32_block = nullptr;  // ② with MXFP8: the gathered fp32 weights, quantized on arrival
  std::unique_ptr<ShardChain> chain;
  Range z3, z2, z1;
  size_t padded = 0;

  // Persistent shards.
  std::unique_ptr<DataNode> w_z3;      // runtime dtype, ZeRO-3 chunk; its ZeRO-1 slice is w_z1
  std::unique_ptr<DataNode> main_own;  // fp32 main weights when w is not fp32
  float* main_z1 = nullptr;            // fp32 ZeRO-1 main weights (a view of w_z3 if fp32)
  std::unique_ptr<DataNode> g_z2;      // fp32 ZeRO-2 accumulated gradient G′ᶻ²
  std::unique_ptr<DataNode> g_z1_own;  // fp32 ZeRO-1 main gradient when so > sg
  float* g_z1 = nullptr;               // (a view of g_z2 when so == sg)
  // Optimizer state over the ZeRO-1 chunk in one allocation, by field: a field every
  // parameter's optimizer keeps is dense (m); one only some keep is packed over their
  // fragments (AdamW's v beside Muon parameters) — each optimizer pays only for its own state.
  std::unique_ptr<DataNode> state;
  std::map<std::string, Zero1Array> opt_state;

  // Full-buffer views: W′ (gathered runtime weights) and G′ (runtime gradients).
  std::unique_ptr<DataNode> w_full;
  std::unique_ptr<DataNode> g_full;
  void* gather_block = nullptr;
  bool gather_started = false;
  CommHandle gather_handle;
  void* grad_block = nullptr;
  CommHandle rs_handle;
  // The outer phase on the communication thread (EngineConfig::overlap_outer): the outer
  // all-gather of Wᶻ³ waiting for this group's next gather, and the submitted outer
  // collectives (default handles are ready).
  bool outer_gather_pending = false;
  CommHandle outer_gather_handle;
  bool outer_reduce_submitted = false;
  CommHandle outer_rs_handle, outer_ar_handle;

  // Baseline layouts and redundancy paths (redundancy.h). pieces[m]: which update parameter
  // elements member m holds; part_offset[u]: element offset of update parameter u inside its
  // runtime parameter.
  std::vector<MemberPiece> pieces;
  std::vector<std::pair<size_t, size_t>> uncovered;
  std::vector<bool> contiguous;
  std::vector<size_t> part_offset;
  void* rt_block = nullptr;  // per-parameter (③) and packed (①) runtime weights of one gather
  size_t rt_bytes = 0;
  std::vector<TensorRef> rt_views;
  void* pg_block = nullptr;  // per-parameter gradients (④) / packed gradients
  size_t pg_bytes = 0;
  std::vector<size_t> pg_offsets;
  void* rs_tmp = nullptr;    // ⑤ reduce-scatter result before the separate add
  void* cast_tmp = nullptr;  // ② + ③: the cast shard before its copy-in (comm thread)

  // Tensor views of the children of a full-buffer root (W′ or G′), in runtime order.
  std::vector<TensorRef> Views(const DataNode& root, DType dt) const;
};

// ⑦: optimizer state replicated across replica groups = no outer ZeRO-1 (the effective so is
// sg); the Topology of a run is built with it.
int EffectiveSo(const EngineConfig& cfg);

// The checks of a configuration against a model that need no communication (dtypes, reduce
// mode, shard layout; ConfigError naming the setting), and the modes they imply.
struct EngineModes {
  DType grad_dtype = DType::kF32;    // G′: fp32, or bf16 in the bf16 reduce modes
  DType store_dtype = DType::kBF16;  // persistent ZeRO-3 weights (fp32 with ②)
  bool skip_gather = false;          // sw = 1 and nothing to cast or copy: W′ is Wᶻ³
  bool skip_rs = false;              // sg = 1 and direct fused accumulation: G′ is G′ᶻ²
};
EngineModes CheckEngineSetup(const Model& model, const EngineConfig& cfg, const Topology& topo);

// The geometry of runtime group `gi` on `rank` — layout, member pieces, shard chain, local
// ranges, dtypes — without any buffer: Engine::BuildGroup allocates for it, and the plan
// (plan.h) sizes from it, so the two cannot disagree.
std::unique_ptr<RuntimeGroup> PlanRuntimeGroup(const Model& model, int gi, const EngineConfig& cfg,
                                               const Topology& topo, int rank);

// Bytes of a group's persistent buffers before the 64-byte minimum of BufferBytes, and which
// are views of another instead (fp32 main weights inside Wᶻ³, Gᶻ¹ = G′ᶻ² when so = sg).
struct GroupBufferSizes {
  size_t w_z3 = 0, main_z1 = 0, g_z2 = 0, g_z1 = 0;
  bool main_is_view = false, g_z1_is_view = false;
};
GroupBufferSizes BufferSizes(const RuntimeGroup& g, const Topology& topo);
// What a data-tree root of `bytes` allocates (and accounts): at least 64 bytes.
inline size_t BufferBytes(size_t bytes) { return bytes < 64 ? 64 : bytes; }
// Elements of a group's optimizer-state allocation: dense fields cover the ZeRO-1 chunk
// (`z1` elements), packed ones their stored runs.
size_t StateElements(const std::map<std::string, Zero1Array>& fields, size_t z1);
// The MXFP8 machinery of these groups on `rank` (its MX groups: wdt = kE4M3). A null p2p
// builds the plan only (plan.h); `memory` may be null (nothing accounted); `backend`: where
// main and the codes live, and what quantizes them.
class MxWeights;
std::unique_ptr<MxWeights> MakeMxWeights(const std::vector<std::unique_ptr<RuntimeGroup>>& groups,
                                         const Topology& topo, int rank, ScaleLayout scale_layout,
                                         Communicator* p2p, MemoryAccount* memory,
                                         Backend& backend);
// The update's options of an engine configuration, and a group as the update sees it.
UpdateOptions UpdateOptionsOf(const EngineConfig& cfg);
UpdateGroupView UpdateViewOf(const RuntimeGroup& g);

// Transient gather / gradient / copy buffers, reused by size (best fit), accounted as
// "transient": the pool holds as many blocks as are live at once, not one per size. A dry
// pool (plan.h) hands out distinct placeholder addresses and allocates nothing, so a replay
// of the schedule accounts exactly what the engine's pool would.
class TransientPool {
 public:
  // Blocks in `backend`'s memory.
  TransientPool(MemoryAccount* memory, Backend& backend) : memory_(memory), backend_(&backend) {}
  // A dry pool: placeholder addresses, nothing allocated (plan.h).
  explicit TransientPool(MemoryAccount* memory) : memory_(memory), dry_(true) {}
  ~TransientPool();
  TransientPool(const TransientPool&) = delete;
  TransientPool& operator=(const TransientPool&) = delete;
  void* Acquire(size_t bytes);
  void Recycle(void* p);  // Error unless p came from Acquire

 private:
  MemoryAccount* memory_;
  bool dry_ = false;
  Backend* backend_ = nullptr;
  std::multimap<size_t, void*> free_;
  std::vector<std::pair<void*, size_t>> all_;
};

// What the data paths read and count (the engine's own members; counters and timers are
// reset by the engine every step).
struct DataPathContext {
  const EngineConfig* cfg = nullptr;
  int zero3_position = 0;  // this rank's slice of a gathered buffer
  DType grad_dtype = DType::kF32;
  TransientPool* pool = nullptr;
  CopyMeter* meter = nullptr;
  StepCounters* counters = nullptr;
  TimeSplit* time = nullptr;
  MxWeights* mx = nullptr;     // MXFP8 runtime weights, or null
  Backend* backend = nullptr;  // EngineConfig::backend (never null)
};

// The engine-on-a-device checks of a configuration (EngineConfig::backend without host
// memory), ConfigError naming the setting; on host memory only --comm-path nccl is refused.
void CheckBackendSetup(const EngineConfig& cfg, const Topology& topo);

// sshsdp's own data path: W′ and G′ are views of the flat buffers; the reduce-scatter
// accumulates into G′ᶻ² in its last reduction step. Each method is one stage of a group's
// schedule; the baselines' path (redundancy_path.cc) overrides them with their copies.
class DataPath {
 public:
  explicit DataPath(const DataPathContext& c) : c_(c) {}
  virtual ~DataPath() = default;

  // Weights. The communication-thread task that fills g.gather_block with W′ from Wᶻ³.
  virtual std::function<void()> GatherTask(RuntimeGroup& g, Communicator* zero3);
  // After the gather's wait, on the main thread.
  virtual void GatherArrived(RuntimeGroup& /*g*/) {}
  // The runtime weight tensors the model computes with (+ S′ for MXFP8 groups).
  virtual std::vector<TensorRef> Weights(RuntimeGroup& g);
  // When the layer is released (its gather, if any, has completed).
  virtual void ReleaseWeights(RuntimeGroup& /*g*/) {}

  // Gradients. The tensors backward writes (g.grad_block is G′'s storage, or null when G′
  // is G′ᶻ² itself).
  virtual std::vector<TensorRef> GradTargets(RuntimeGroup& g);
  // The communication-thread task that reduce-scatters G′ into G′ᶻ² (accumulate: add to it).
  virtual std::function<void()> ReduceTask(RuntimeGroup& g, Communicator* zero2, bool accumulate,
                                           const ReduceScatterOptions& ro);
  // After the reduce-scatter's wait.
  virtual void ReduceDone(RuntimeGroup& /*g*/) {}

 protected:
  DataPathContext c_;
};

// sshsdp's path when no redundancy of the data path (①–⑤) is on and the layout is flat;
// the baselines' path (MakeRedundantPath, redundancy_path.cc) otherwise.
std::unique_ptr<DataPath> MakeDataPath(const DataPathContext& c);
std::unique_ptr<DataPath> MakeRedundantPath(const DataPathContext& c);

}  // namespace sshsdp
