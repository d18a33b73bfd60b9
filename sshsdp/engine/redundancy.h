// Baselines as switches (docs/design.md, Baselines): each redundancy of the paper's Figure 2 is a
// switch of the one engine, so FSDP2-, Megatron-FSDP- and veScale-FSDP-style dataflows run in the
// same binary with the same kernels, communicator and model, and pay their extra work for real
// (counted copies, casts and adds that the step counters and timers see):
//
//   ① tw_every_use         pack multi-part runtime weights (torch.cat of Q/K/V heads) into a
//                          fresh packed tensor on every use, instead of retained packed shards
//   ② cast_every_gather    persistent ZeRO-3 shards stay fp32; every all-gather casts them to
//                          the runtime dtype in its copy-in (FSDP2's mixed precision), instead
//                          of weight reuse (cast once per step at ZeRO-1, shards retained)
//   ③ weight_copies        copy-in of the shard into an all-gather input buffer and copy-out
//                          of the gathered buffer into per-parameter tensors
//   ④ grad_copies          backward writes per-parameter gradient tensors that are then
//                          copied (padded, chunk-concatenated) into the reduce-scatter buffer
//   ⑤ separate_add         the reduce-scatter writes a temporary that a separate pass adds
//                          into G′ᶻ² (microbatches after the first), instead of accumulating
//                          in the reduce-scatter's final reduction
//   ⑥ structured_updates   how structured (matrix) updates are done: point-to-point units
//                          (sshsdp), whole matrices gathered on every rank (FSDP2's
//                          full_tensor: per Muon parameter an all-gather of u over the ZeRO-1
//                          group, reassembly of dim-0 pieces, Newton–Schulz on every unit on
//                          every rank, own shard kept — full_tensor_update.h; any layout), or
//                          refused (Megatron-FSDP)
//   ⑦ replicate_optimizer  optimizer state replicated across replica groups (so = sg, HSDP
//                          all-reduce) instead of outer ZeRO-1
//
// plus the shard layout of every flat buffer:
//   kFlat   the sshsdp tensor list: update parameters back to back, tail padding only;
//   kDim0   FSDP2: every update parameter sharded on dim 0 as torch.chunk would, each rank's
//           piece padded to rank 0's chunk size, the pieces ordered rank-major so each
//           ZeRO-3 chunk is contiguous and every parameter is split across chunks — the
//           gathered buffer is rank-interleaved, so ③ and ④ are required;
//   kAligned veScale-FSDP: a member that would straddle a ZeRO-1 chunk boundary starts at the
//           next boundary (ragged shards emulated by padding), so no update unit that fits
//           in a chunk is split. veScale-FSDP's model has no packed runtime layout (per-part
//           runtime parameters and GEMMs, GptConfig::packed_qkv = false), so its runtime
//           weights are views; a packed model's runtime parameter whose parts the padding
//           separated cannot be a view, so the engine packs it per use (weight_pack, even
//           with ① off) and scatters its gradient back (grad_unpack).
//
// Where the extra work runs (the communication thread stands for a side stream):
//   ② cast and ③ copy-in of a gather   communication thread, before the all-gather: FSDP2's
//                                       all-gather copy-in stream (foreach_all_gather runs the
//                                       param_dtype cast and the copy-in there), so a
//                                       prefetched layer's cast and copy overlap compute
//   ③ copy-out, ① pack                  main thread after the wait: FSDP2's copy-out and the
//                                       user's torch.cat run on the compute stream
//   ④ gradient copy-in (chunk-cat)      communication thread, before the reduce-scatter:
//                                       FSDP2's reduce-scatter stream (foreach_reduce)
//   ⑤ separate add                      communication thread, after the reduce-scatter: the
//                                       post-reduce accumulation into the sharded gradient
//                                       (FSDP2's post-reduce stream; Megatron-FSDP's and
//                                       veScale's accumulation also follow their reduce)
//   ⑥ full_tensor gathers / NS          main thread (the optimizer step)
// Their bytes and passes are counted when they are submitted (deterministic); their time is
// the communication thread's, so the main thread's TimeSplit sees them only where they are
// exposed (as comm_wait). Copies a collective makes inside itself (an out-of-place
// all-gather's own shard) are counted separately for every preset
// (StepCounters::collective_copy_bytes).
//
// Presets combining them live in presets.h.
//
//   EngineConfig cfg = ...;
//   cfg.redundancies.weight_copies = true;     // ③
//   cfg.shard_layout = ShardLayout::kDim0;
//   Engine engine(model, *world, cfg);         // same model, kernels and communicator
//   StepStats st = engine.Step(batch);
//   st.counters.copies.weight_copy_out;    // exact bytes, see the parity tests' formulas
//   st.time.copy;                          // seconds the main thread spent copying
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sshsdp/params/param_layout.h"

namespace sshsdp {

enum class StructuredUpdates {
  kUnits,        // sshsdp / veScale: a unit split across ranks is gathered by one rank (P2P)
  kFullTensor,   // FSDP2: every rank all-gathers whole matrices (full_tensor) ⑥
  kUnsupported,  // Megatron-FSDP: structured optimizers are refused
};

enum class ShardLayout { kFlat, kDim0, kAligned };
const char* ShardLayoutName(ShardLayout l);

struct Redundancies {
  bool tw_every_use = false;                                         // ①
  bool cast_every_gather = false;                                    // ②
  bool weight_copies = false;                                        // ③
  bool grad_copies = false;                                          // ④
  bool separate_add = false;                                         // ⑤
  StructuredUpdates structured_updates = StructuredUpdates::kUnits;  // ⑥
  bool replicate_optimizer = false;                                  // ⑦
  // "①②③④⑤⑥⑦"-style summary of the switches that are on ("none" when all are off).
  std::string ToString() const;
};

// Throws ConfigError when a structured (matrix) optimizer is asked for under a configuration
// that cannot run it (Megatron-FSDP: no structured updates), naming the parameter and preset.
void CheckStructuredUpdates(const Redundancies& r, const std::string& optimizer,
                            const std::string& first_param);

// MemberPiece (params/param_layout.h): which part of which update parameter a member holds.

struct EngineLayout {
  GroupLayout layout;               // layout.update: one entry per update parameter
  std::vector<MemberPiece> pieces;  // one per tensor-list member
  // Element ranges of the padded buffer no member's valid elements cover (padding rows,
  // alignment gaps, the tail): the first gradient write must zero them.
  std::vector<std::pair<size_t, size_t>> uncovered;
  // Per runtime parameter: whether its update parts form one contiguous run in update order
  // (so W′ and G′ can be views of the flat buffers).
  std::vector<bool> contiguous;
};

// Builds the flat buffer layout of one runtime group. kFlat is BuildGroupLayout with identity
// pieces. so is the ZeRO-1 degree, sw the ZeRO-3 degree (the dim-0 shard degree).
EngineLayout BuildEngineLayout(ShardLayout kind, int group,
                               const std::vector<RuntimeParamSpec>& specs, DType runtime_dtype,
                               int sw, int so);

// Bytes copied outside compute and collectives, by path (sum = StepCounters::bytes_copied).
struct CopyBytes {
  uint64_t weight_copy_in = 0;   // ③ shard → all-gather input
  uint64_t weight_copy_out = 0;  // ③ gathered buffer → per-parameter tensors
  uint64_t weight_pack = 0;      // ① per-parameter tensors → packed runtime tensor
  uint64_t grad_copy = 0;        // ④ per-parameter gradients → reduce-scatter buffer
  uint64_t grad_unpack = 0;      // packed runtime gradient → non-contiguous member views
  uint64_t update_copy = 0;      // structured update: ⑥ full_tensor reassembly of gathered
                                 // pieces into whole matrices (torch.cat), scratch copies of
                                 // state operands of split units
  uint64_t total() const {
    return weight_copy_in + weight_copy_out + weight_pack + grad_copy + grad_unpack + update_copy;
  }
};

// Seconds of one step on the main thread, by category (StepStats::time). `other` is the rest
// of the step (scheduling, allocation, batch loading).
struct TimeSplit {
  double compute = 0;    // model forward / backward kernels
  double comm_wait = 0;  // exposed waits for collectives (runtime and update phase)
  double copy = 0;       // CountedCopy
  double cast = 0;       // weight casts (G and ②)
  double add = 0;        // ⑤ separate accumulation passes
  double optimizer = 0;  // gradient norm and AdamW
  double other = 0;
};

// The one copy helper of the engine: every memcpy outside compute and collectives goes
// through it, so bytes_copied is exact and its time is accounted.
class CopyMeter {
 public:
  void Copy(void* dst, const void* src, size_t bytes, uint64_t CopyBytes::*path);
  // Counts a copy the communication thread makes (its time is that thread's, not the main
  // thread's TimeSplit).
  void Count(size_t bytes, uint64_t CopyBytes::*path) { bytes_.*path += bytes; }
  void Reset() { bytes_ = {}, seconds_ = 0; }
  const CopyBytes& bytes() const { return bytes_; }
  double seconds() const { return seconds_; }

 private:
  CopyBytes bytes_;
  double seconds_ = 0;
};

// Adds the wall time of its scope to *sink.
class ScopedTimer {
 public:
  explicit ScopedTimer(double* sink) : sink_(sink), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    *sink_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double* sink_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace sshsdp
