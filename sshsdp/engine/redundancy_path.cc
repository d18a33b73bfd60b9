// The baselines' data path (redundancy.h): ② cast and ③ copy-in of every gather, ③ copy-out
// and ① pack of the runtime weights, ④ per-parameter gradients and their chunk-cat into G′,
// ⑤ the separate add after the reduce-scatter — each where its framework runs it, each
// counted. A switch that is off falls back to sshsdp's stage (DataPath), so every mix of
// switches runs (see engine_internal.h).
#include <algorithm>
#include <cstring>

#include "sshsdp/engine/engine_internal.h"
#include "sshsdp/engine/mx_weights.h"
#include "sshsdp/kernels/elementwise.h"

namespace sshsdp {
namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

class RedundantPath : public DataPath {
 public:
  explicit RedundantPath(const DataPathContext& c)
      : DataPath(c),
        R_(c.cfg->redundancies),
        views_direct_(c.cfg->shard_layout == ShardLayout::kFlat && !R_.tw_every_use &&
                      !R_.weight_copies),
        grads_direct_(c.cfg->shard_layout == ShardLayout::kFlat && !R_.grad_copies) {}

  std::function<void()> GatherTask(RuntimeGroup& g, Communicator* zero3) override;
  void GatherArrived(RuntimeGroup& g) override;
  std::vector<TensorRef> Weights(RuntimeGroup& g) override;
  void ReleaseWeights(RuntimeGroup& g) override;
  std::vector<TensorRef> GradTargets(RuntimeGroup& g) override;
  std::function<void()> ReduceTask(RuntimeGroup& g, Communicator* zero2, bool accumulate,
                                   const ReduceScatterOptions& ro) override;
  void ReduceDone(RuntimeGroup& g) override;

 private:
  std::function<void()> FinishGrads(RuntimeGroup& g);  // ④'s copy-in / packed scatter
  void RecycleCastTmp(RuntimeGroup& g) {
    if (!g.cast_tmp) return;
    c_.pool->Recycle(g.cast_tmp);
    g.cast_tmp = nullptr;
  }

  const Redundancies& R_;
  const bool views_direct_;  // W′ views straight into the gathered buffer
  const bool grads_direct_;  // backward writes straight into G′ views
};

std::function<void()> RedundantPath::GatherTask(RuntimeGroup& g, Communicator* zero3) {
  const void* src = g.w_z3->data();
  void* dst = g.gather_block;
  const size_t count = g.z3.size();
  const DType dt = g.wdt;
  if (dt == DType::kE4M3 && g.sdt == DType::kF32) {
    // ② with MXFP8 (quantize on demand, FSDP2 / veScale style): gather the fp32 ZeRO-3 shards;
    // GatherArrived quantizes the whole layer and relays its scales out, on every gather.
    g.f32_block = c_.pool->Acquire(g.padded * 4);
    void* f32 = g.f32_block;
    return [=] { zero3->AllGather(src, f32, count, DType::kF32); };
  }
  if (g.sdt == dt && !R_.weight_copies) return DataPath::GatherTask(g, zero3);
  // This rank's slice of the gather buffer is written first (② cast, ③ copy-in), then
  // gathered in place — on the communication thread, which stands for the side stream FSDP2
  // runs its all-gather copy-in on, so a prefetched layer's cast and copy-in overlap the
  // current layer's compute. Counted here, deterministically.
  const size_t es = DTypeSize(dt);
  char* slice = static_cast<char*>(dst) + c_.zero3_position * count * es;
  const bool cast = g.sdt != dt;  // ②: fp32 ZeRO-3 shard cast on every gather
  void* tmp = nullptr;
  if (cast) {
    c_.counters->weight_preps++;
    if (R_.weight_copies) tmp = g.cast_tmp = c_.pool->Acquire(count * es);
  }
  if (!cast || tmp) c_.meter->Count(count * es, &CopyBytes::weight_copy_in);  // ③ copy-in
  Tracer* tr = c_.cfg->tracer;
  const int gi = g.layout.group;
  return [=] {
    {
      TraceSpan s(tr, cast ? (tmp ? "② cast + ③ copy-in" : "② cast") : "③ copy-in", kTraceComm,
                  {{"group", gi}});
      if (cast)
        kernels::CastToBf16(static_cast<const float*>(src), static_cast<bf16*>(tmp ? tmp : slice),
                            static_cast<int64_t>(count));
      if (tmp || !cast) std::memcpy(slice, tmp ? tmp : src, count * es);
    }
    zero3->AllGatherInPlace(dst, count, dt);
  };
}

void RedundantPath::GatherArrived(RuntimeGroup& g) {
  RecycleCastTmp(g);
  if (!g.f32_block) return;
  {  // ② with MXFP8: G and Tw on the gathered layer, every gather
    ScopedTimer t(&c_.time->cast);
    const int gi = g.layout.group;
    c_.mx->QuantizeFull(gi, static_cast<const float*>(g.f32_block),
                        static_cast<uint8_t*>(g.gather_block));
    c_.mx->Relayout(gi);
  }
  c_.counters->weight_preps++;
  c_.counters->scale_relayouts++;
  c_.pool->Recycle(g.f32_block);
  g.f32_block = nullptr;
}

std::vector<TensorRef> RedundantPath::Weights(RuntimeGroup& g) {
  if (views_direct_) return DataPath::Weights(g);
  if (!g.rt_views.empty()) return g.rt_views;  // already built for this gather
  const GroupLayout& L = g.layout;
  const DType dt = c_.cfg->weight_dtype;
  const size_t es = DTypeSize(dt);
  const char* base = static_cast<const char*>(g.w_full->data());
  // Element offsets in the transient block: ③ copy-out targets (per update parameter, or
  // straight into the runtime tensor when it needs no packing) and ① packed tensors.
  std::vector<size_t> upd(L.update.size(), kNone), rt(L.runtime.size(), kNone);
  std::vector<bool> pack(L.runtime.size(), false);
  size_t elems = 0;
  for (size_t r = 0; r < L.runtime.size(); ++r) {
    const RuntimeParam& rp = L.runtime[r];
    pack[r] = rp.num_members > 1 && (R_.tw_every_use || (!R_.weight_copies && !g.contiguous[r]));
    if (R_.weight_copies) {
      if (!pack[r]) rt[r] = elems;
      for (int u = rp.first_member; u < rp.first_member + rp.num_members; ++u)
        upd[u] = elems + g.part_offset[u];
      elems += rp.numel;
    }
    if (pack[r]) {
      rt[r] = elems;
      elems += rp.numel;
    }
  }
  TraceSpan span(c_.cfg->tracer, "③ copy-out / ① pack", kTraceCompute, {{"group", L.group}});
  g.rt_bytes = elems * es;
  g.rt_block = elems > 0 ? c_.pool->Acquire(g.rt_bytes) : nullptr;
  char* blk = static_cast<char*>(g.rt_block);
  if (R_.weight_copies) {  // ③ copy-out: gathered (rank-interleaved) buffer → tensors
    for (size_t m = 0; m < L.list.num_members(); ++m) {
      const MemberPiece& pc = g.pieces[m];
      c_.meter->Copy(blk + (upd[pc.update] + pc.offset) * es, base + L.list.member(m).offset * es,
                     pc.valid * es, &CopyBytes::weight_copy_out);
    }
  }
  for (size_t r = 0; r < L.runtime.size(); ++r) {  // ① Tw: torch.cat of the parts
    if (!pack[r]) continue;
    const RuntimeParam& rp = L.runtime[r];
    for (int u = rp.first_member; u < rp.first_member + rp.num_members; ++u) {
      const char* src = R_.weight_copies ? blk + upd[u] * es : base + L.list.member(u).offset * es;
      c_.meter->Copy(blk + (rt[r] + g.part_offset[u]) * es, src,
                     NumElements(L.update[u].shape) * es, &CopyBytes::weight_pack);
    }
  }
  for (size_t r = 0; r < L.runtime.size(); ++r) {
    const char* p = rt[r] != kNone ? blk + rt[r] * es
                                   : base + L.list.member(L.runtime[r].first_member).offset * es;
    g.rt_views.push_back(TensorRef{const_cast<char*>(p), dt});
  }
  return g.rt_views;
}

void RedundantPath::ReleaseWeights(RuntimeGroup& g) {
  RecycleCastTmp(g);  // a prefetched gather released before use
  if (g.f32_block) {  // ② with MXFP8, released before GatherArrived quantized it
    c_.pool->Recycle(g.f32_block);
    g.f32_block = nullptr;
  }
  g.rt_views.clear();
  if (g.rt_block) c_.pool->Recycle(g.rt_block);
  g.rt_block = nullptr;
}

std::vector<TensorRef> RedundantPath::GradTargets(RuntimeGroup& g) {
  if (grads_direct_) return DataPath::GradTargets(g);
  const GroupLayout& L = g.layout;
  g.pg_offsets.assign(L.runtime.size(), kNone);
  size_t elems = 0;
  for (size_t r = 0; r < L.runtime.size(); ++r) {
    if (R_.grad_copies || !g.contiguous[r]) {
      g.pg_offsets[r] = elems;
      elems += L.runtime[r].numel;
    }
  }
  g.pg_bytes = elems * 4;
  g.pg_block = elems > 0 ? c_.pool->Acquire(g.pg_bytes) : nullptr;
  float* gp = static_cast<float*>(g.grad_block);
  float* pg = static_cast<float*>(g.pg_block);
  std::vector<TensorRef> out;
  for (size_t r = 0; r < L.runtime.size(); ++r) {
    float* p = g.pg_offsets[r] != kNone ? pg + g.pg_offsets[r]
                                        : gp + L.list.member(L.runtime[r].first_member).offset;
    out.push_back(TensorRef{p, DType::kF32});
  }
  return out;
}

std::function<void()> RedundantPath::FinishGrads(RuntimeGroup& g) {
  const GroupLayout& L = g.layout;
  float* gp = static_cast<float*>(g.grad_block);
  const float* pg = static_cast<const float*>(g.pg_block);
  if (R_.grad_copies) {
    // ④: per-parameter gradients → reduce-scatter buffer (FSDP2's padded chunk-cat), on the
    // communication thread before the reduce-scatter (FSDP2 runs it on its reduce-scatter
    // stream); counted here. pg_block is recycled once the reduce-scatter is done.
    struct Piece {
      size_t dst, src, n;
    };
    std::vector<Piece> pieces;
    for (size_t m = 0; m < L.list.num_members(); ++m) {
      const MemberPiece& pc = g.pieces[m];
      const UpdateParam& u = L.update[pc.update];
      pieces.push_back({L.list.member(m).offset,
                        g.pg_offsets[u.runtime] + g.part_offset[pc.update] + pc.offset, pc.valid});
      c_.meter->Count(pc.valid * 4, &CopyBytes::grad_copy);
    }
    return [gp, pg, pieces = std::move(pieces), uncovered = g.uncovered, tr = c_.cfg->tracer,
            gi = L.group] {
      TraceSpan s(tr, "④ gradient copy-in", kTraceComm, {{"group", gi}});
      for (const auto& [a, b] : uncovered) std::fill(gp + a, gp + b, 0.0f);  // padding, gaps
      for (const Piece& p : pieces) std::memcpy(gp + p.dst, pg + p.src, p.n * 4);
    };
  }
  for (const auto& [a, b] : g.uncovered) std::fill(gp + a, gp + b, 0.0f);  // padding, gaps
  // Packed gradients of runtime parameters whose parts are not contiguous → member views.
  for (size_t r = 0; r < L.runtime.size(); ++r) {
    if (g.pg_offsets[r] == kNone) continue;
    const RuntimeParam& rp = L.runtime[r];
    for (int u = rp.first_member; u < rp.first_member + rp.num_members; ++u)
      c_.meter->Copy(gp + L.list.member(u).offset, pg + g.pg_offsets[r] + g.part_offset[u],
                     NumElements(L.update[u].shape) * 4, &CopyBytes::grad_unpack);
  }
  if (g.pg_block) c_.pool->Recycle(g.pg_block);
  g.pg_block = nullptr;
  return {};
}

std::function<void()> RedundantPath::ReduceTask(RuntimeGroup& g, Communicator* zero2,
                                                bool accumulate, const ReduceScatterOptions& ro) {
  std::function<void()> copy_in;  // ④ on the communication thread
  if (!grads_direct_) copy_in = FinishGrads(g);
  if (!(accumulate && R_.separate_add)) {
    std::function<void()> rs = DataPath::ReduceTask(g, zero2, accumulate, ro);
    if (!copy_in) return rs;
    return [copy_in = std::move(copy_in), rs = std::move(rs)] {
      copy_in();
      rs();
    };
  }
  // ⑤: reduce into a temporary, then a separate pass adds it into G′ᶻ² — after the
  // reduce-scatter, on its (side-stream) thread.
  c_.counters->add_passes++;
  const size_t count = g.z2.size();
  g.rs_tmp = c_.pool->Acquire(count * 4);
  const void* src = g.grad_block;
  float* tmp = static_cast<float*>(g.rs_tmp);
  float* into = g.g_z2->data_as<float>();
  const DType gdt = c_.grad_dtype;
  Tracer* tr = c_.cfg->tracer;
  const int gi = g.layout.group;
  return [=, copy_in = std::move(copy_in)] {
    if (copy_in) copy_in();
    zero2->ReduceScatterPartials(src, gdt, tmp, DType::kF32, count, false, ro);
    TraceSpan s(tr, "⑤ separate add", kTraceComm, {{"group", gi}});
    kernels::Add(into, tmp, into, static_cast<int64_t>(count));
  };
}

void RedundantPath::ReduceDone(RuntimeGroup& g) {
  if (g.pg_block) {  // ④'s per-parameter gradients, copied in by the communication thread
    c_.pool->Recycle(g.pg_block);
    g.pg_block = nullptr;
  }
  if (g.rs_tmp) {  // ⑤'s temporary, added by the communication thread
    c_.pool->Recycle(g.rs_tmp);
    g.rs_tmp = nullptr;
  }
}

}  // namespace

std::unique_ptr<DataPath> MakeRedundantPath(const DataPathContext& c) {
  return std::make_unique<RedundantPath>(c);
}

}  // namespace sshsdp
