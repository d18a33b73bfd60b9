// MxWeights: the MXFP8 runtime-weight machinery of the engine (paper §2.3, §3.1 EG1, §3.3;
// docs/design.md, One step, steps 4 and 5; docs/precision.md) — the G stage at ZeRO-1 on 32-row
// bands, the per-group scale tensor list S parallel to W, and the Tw scale relayout of every packed
// runtime weight.
//
// Which weights are MXFP8: the model decides per runtime group (Model::GroupConsumesMx; the
// engine passes the flags in). Default rule (GroupIsMx): a group is MX when none of its update
// parameters is an embedding / LM-head table (UpdateKind::kEmbedding): GPT blocks are MX, the
// embedding group and the final-norm + LM-head group stay bf16 (the paper keeps non-expert
// GEMMs in BF16 too; our default keeps the vocabulary GEMM and the lookup table precise). The
// MoE GPT (moe.h, MoeConfig::expert_group) makes only its expert groups MX — the packed
// [E, out, in] routed-expert weights (each expert its own update parameter, own 32x32 blocks)
// and the shared expert — and keeps the router, attention, norm gains and dense blocks bf16.
// Inside an MX group EVERY member is MXFP8, norm gains included (as [1, n] matrices, i.e.
// 1x32 blocks): one flat buffer holds one dtype (one Atom per group here), and splitting the
// gains into a bf16 atom is future work. Elements E4M3, scales UE8M0, 32x32 blocks per update
// parameter (each head of a packed QKV has its own blocks), scale rule MxScaleRule::kCeil (never
// saturates).
//
// S. Per group, a byte TensorList with one member per W member: its row-major block grid
// [ceil(rows/32), ceil(cols/32)]. S is sharded by the same topology (its own ShardChain,
// same chunk owners), its ZeRO-1 slice written by G, gathered with the weights — outer
// all-gather in the replica group into Sᶻ³, ZeRO-3 all-gather into the full S (once per
// optimizer step: the engine retains the result, weight reuse) — and relaid out by Tw.
//
// G (Quantize): units are 32-row bands of every MX member (MxWeightBand). They go through the
// update planner/executor (update_plan.h) as a program "mx_quantize": a unit stage reads the
// band's fp32 "main" whole (split bands are fetched to one execution rank point to point) and
// writes its E4M3 codes into a temporary "q" (returned to the owners of each fragment), then
// an elementwise stage stores each rank's own codes into its ZeRO-1 slice of Wᶻ³ (1 byte per
// element, local). The band's scales are sent by the execution rank to the owners of the
// band's S elements in one batched point-to-point exchange (the planner moves only
// element-indexed fields). The result is bit-identical to MxQuantizeWeight on the unsharded
// matrix, whatever the shard boundaries (mx_weights_test pins layouts whose bands straddle).
//
// Tw (Relayout): for every runtime parameter of an MX group, RelayoutPackedScales of its
// members' grids (operand kAsStored, the packed [Σ rows, cols] weight) into the selected
// ScaleLayout, into a persistent S′ buffer. The weight codes are not touched: W′ stays a
// view of the gathered buffer (zero copy); only scales move.
//
//   MxWeights mx(layouts, chains, topo, rank, ScaleLayout::kCublasSwizzle, *p2p, &memory, {}, cpu);
//   mx.Quantize(main_z1, codes_z1);          // G: ZeRO-1 main → codes + S ZeRO-1 slices
//   ... outer AG of codes and of mx.s_z3(g); ZeRO-3 AG of S into mx.s_full(g) ...
//   mx.Relayout(g);                          // Tw: S → S′
//   TensorRef{codes, DType::kE4M3, mx.scales(g, r), ScaleLayout::kCublasSwizzle};
//
// G runs on the backend (Backend::MxQuantizeWeight on each band), where main and the codes live.
// On a device (the engine on a GPU) the executor's temporaries and fetches are staged as the
// optimizer's are, and each band's scales come back to the host, where S lives:
// it is 1/1024 of the codes, so its exchange, its gathers (the engine's host communicators) and
// Tw stay host work, and only S′ is copied to the device after Tw (scales() then points there).
// ② (QuantizeFull) is host-only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/base/memory_account.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/layout/shard_chain.h"
#include "sshsdp/layout/topology.h"
#include "sshsdp/numerics/mx.h"
#include "sshsdp/numerics/scale_layout.h"
#include "sshsdp/params/param_layout.h"
#include "sshsdp/update/update_executor.h"

namespace sshsdp {

// Frees a backend allocation (MxWeights' device buffers).
struct BackendFree {
  Backend* b = nullptr;
  void operator()(uint8_t* p) const { b->Free(p); }
};

class MxWeights {
 public:
  // The default rule (Model::GroupConsumesMx): MXFP8 unless a member is an embedding /
  // LM-head table (or the group is empty).
  static bool GroupIsMx(const GroupLayout& layout);

  // layouts[g], chains[g]: every runtime group's layout and this rank's shard chain. p2p is
  // ordered like the world (a world duplicate). mx_groups[g]: whether group g is MX (the
  // model's Model::GroupConsumesMx; empty = GroupIsMx of every layout). Builds S, its chain
  // and buffers, the band units and the G plan (metadata only). Throws ConfigError when a
  // layout is not usable (e.g. kBlockRowMajor with parts whose rows are not multiples of 32).
  // A null p2p builds the plan only (engine/plan.h): sizes and messages, Quantize refuses.
  // backend: where main and the codes live, and what quantizes them (see above; not owned).
  MxWeights(const std::vector<const GroupLayout*>& layouts,
            const std::vector<const ShardChain*>& chains, const Topology& topo, int rank,
            ScaleLayout layout, Communicator* p2p, MemoryAccount* account,
            const std::vector<bool>& mx_groups, Backend& backend);
  ~MxWeights();

  bool is_mx(int g) const { return groups_[g].mx; }

  // G at ZeRO-1 for every MX group: main_z1[g] (fp32, this rank's ZeRO-1 chunk) → codes_z1[g]
  // (E4M3, same elements) and the ZeRO-1 slice of S inside s_z3(g). Collective over the
  // replica (point-to-point only between ranks sharing split bands).
  void Quantize(const std::vector<const float*>& main_z1, const std::vector<uint8_t*>& codes_z1);
  // ② "quantize every gather": quantize every member of group g from its FULL fp32 buffer
  // (gathered) into `codes` (full) and s_full(g). Local; bit-identical to Quantize. Host
  // memory only (PlanError on a device).
  void QuantizeFull(int g, const float* full_main, uint8_t* codes);
  // Tw: relayout s_full(g) into S′ of every runtime parameter of group g.
  void Relayout(int g);

  // S buffers of group g: its ZeRO-3 chunk (the ZeRO-1 slice lies inside it) and the full S.
  uint8_t* s_z3(int g) { return groups_[g].s_z3.data(); }
  size_t s_z3_count(int g) const { return groups_[g].z3.size(); }
  size_t s_z1_count(int g) const { return groups_[g].z1.size(); }
  uint8_t* s_full(int g) { return groups_[g].s_full.data(); }
  // Relaid-out scales (S′) of runtime parameter r of group g, for its [rows, cols] operand: in
  // the backend's memory (what the model reads), and their host copy (the same on host memory).
  const uint8_t* scales(int g, int r) const {
    return (on_device_ ? groups_[g].s_prime_dev.get() : groups_[g].s_prime.data()) +
           groups_[g].rt_offset[r];
  }
  const uint8_t* host_scales(int g, int r) const {
    return groups_[g].s_prime.data() + groups_[g].rt_offset[r];
  }
  size_t scales_bytes(int g, int r) const { return groups_[g].rt_bytes[r]; }
  // Bytes of all S buffers (Sᶻ³, full S, S′; on a device also its S′ and band-scale buffers
  // and the band scales' host copy) on this rank (for reports).
  size_t persistent_bytes() const { return Bytes(on_device_); }
  // Statistics of the last Quantize: bands executed here, split bands, point-to-point bytes
  // this rank sent (codes fetch/return + scales).
  struct Stats {
    uint64_t bands_executed = 0, split_bands = 0, bytes_sent = 0;
  };
  const Stats& last_stats() const { return stats_; }
  // Bytes of the G executor's update temporaries per Quantize.
  uint64_t temporary_bytes() const;
  // The G plan (band units, execution ranks, code fetches / returns), or null without bands.
  const UpdatePlan* plan() const { return plan_.get(); }
  // Every scale message of Quantize in this rank's replica: the band's execution rank sends
  // S elements [lo, hi) of group `group` to their ZeRO-1 owner (exec == owner: a local copy).
  struct ScaleMessage {
    int group = 0, exec = 0, owner = 0;
    size_t unit = 0, lo = 0, hi = 0;
  };
  std::vector<ScaleMessage> ScaleMessages() const;

 private:
  struct Group {
    bool mx = false;
    const GroupLayout* layout = nullptr;
    std::vector<int64_t> rows, cols;  // per member: matrix view
    TensorList s_list;
    std::unique_ptr<ShardChain> s_chain;
    Range z1, z3;
    size_t s_chunk = 0;  // ZeRO-1 chunk of S (elements = bytes)
    std::vector<uint8_t> s_z3, s_full, s_prime;
    std::vector<size_t> rt_offset, rt_bytes;
    // On a device: S′ there, and the scales of the bands G quantizes there (laid out as S),
    // with their host copy.
    std::unique_ptr<uint8_t, BackendFree> s_prime_dev, s_bands_dev;
    std::vector<uint8_t> s_bands;
  };
  size_t Bytes(bool on_device) const;
  void QuantizeBands(const StageBatch& b);
  std::vector<MxScaleGrid> Parts(int g, int r) const;
  size_t ScaleBandBegin(size_t unit) const;  // first S element of band unit `unit`

  std::vector<Group> groups_;
  const Topology& topo_;
  int rank_;
  int replica_;
  ScaleLayout layout_;
  Communicator* p2p_;  // null: plan only
  MemoryAccount* account_;
  Backend* backend_;  // never null
  bool on_device_;    // !backend_->host_memory()
  std::vector<const ShardChain*> chains_;
  std::shared_ptr<const UpdatePlan> plan_;
  std::unique_ptr<UpdateExecutor> exec_;
  // Per band unit: (group, member, band) and the scales computed here (exec rank).
  struct BandRef {
    int group = 0, member = 0;
    int64_t band = 0;
  };
  std::vector<BandRef> bands_;
  std::map<std::pair<int, size_t>, size_t> band_index_;  // (group, begin) → band unit
  std::vector<std::vector<uint8_t>> band_scales_;
  std::vector<uint8_t*> codes_z1_;  // valid during Quantize
  Stats stats_;
};

}  // namespace sshsdp
