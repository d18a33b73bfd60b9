// Engine state: main weights initialized, loaded and consolidated at ZeRO-1, weight
// preparation G (cast / MXFP8 quantize into the retained Wᶻ³) with the outer all-gather, the
// finiteness check and the checkpoint fields (see engine.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>

#include "sshsdp/base/error.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/engine_internal.h"
#include "sshsdp/engine/mx_weights.h"
#include "sshsdp/kernels/elementwise.h"

namespace sshsdp {

void Engine::InitWeights(uint64_t seed) {
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    // Drawn on the host, then copied to the backend.
    std::vector<float> staged(g.z1.size(), 0.0f);
    float* main = staged.data();
    for (const Fragment& f : g.chain->Fragments(Shard::kZero1)) {
      const FragmentSpan s = SpanOf(g.pieces, f);
      if (s.length == 0) continue;  // dim-0 padding stays zero
      const UpdateParam& u = g.layout.update[s.update];
      UpdatePart part{u.name, u.shape, 0, u.kind, u.init};
      FillInit(part, seed, static_cast<int64_t>(s.begin), static_cast<int64_t>(s.length),
               main + s.shard_offset);
    }
    ZeroState(g);
    cfg_.backend->CopyIn(g.main_z1, staged.data(), staged.size() * 4);
  }
  step_ = 0;
  PrepareAndGatherWeights();
}

void Engine::LoadMainWeights(const std::map<std::string, std::vector<float>>& weights) {
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    for (const UpdateParam& u : g.layout.update) {
      auto it = weights.find(u.name);
      SSHSDP_CHECK(it != weights.end(), ConfigError, "weights for '{}' {} are missing", u.name,
                   ShapeString(u.shape));
      SSHSDP_CHECK(it->second.size() == NumElements(u.shape), ConfigError,
                   "weights for '{}' have {} elements, the model needs {} {}", u.name,
                   it->second.size(), NumElements(u.shape), ShapeString(u.shape));
    }
  }
  LoadMainWeights([&](const std::string& name, size_t begin, size_t count, float* out) {
    const std::vector<float>& src = weights.at(name);
    std::copy_n(src.data() + begin, count, out);
  });
}

void Engine::LoadMainWeights(const WeightReader& read) {
  std::vector<float> staged;
  std::exception_ptr failed;  // a read that threw on this rank
  try {
    for (auto& gp : groups_) {
      RuntimeGroup& g = *gp;
      for (const Fragment& f : g.chain->Fragments(Shard::kZero1)) {
        const FragmentSpan s = SpanOf(g.pieces, f);
        if (s.length == 0) continue;  // dim-0 padding
        staged.resize(s.length);
        read(g.layout.update[s.update].name, s.begin, s.length, staged.data());
        cfg_.backend->CopyIn(g.main_z1 + s.shard_offset, staged.data(), s.length * 4);
      }
      ZeroState(g);
    }
  } catch (...) {
    failed = std::current_exception();
  }
  // Each rank reads only its shards, so a bad value may be seen by some ranks only: all of them
  // learn of it here, before any weight is gathered, and every rank throws.
  float bad = failed ? 1.0f : 0.0f;
  world_.AllReduce(&bad, 1, DType::kF32);
  if (failed) std::rethrow_exception(failed);
  SSHSDP_CHECK(bad == 0.0f, ConfigError,
               "{} other rank(s) could not read their part of the initial weights (their error "
               "names the tensor); nothing was loaded",
               bad);
  step_ = 0;
  PrepareAndGatherWeights();
}

void Engine::ZeroState(RuntimeGroup& g) { cfg_.backend->Zero(g.state->data(), g.state->bytes()); }

void Engine::UploadZero1Mirrors() {
  // What a checkpoint load wrote into the mirrors (a device's; none on host memory).
  for (const Zero1Mirror& m : zero1_mirrors_)
    cfg_.backend->CopyIn(m.device, m.host.data(), m.host.size() * sizeof(float));
  zero1_mirrors_.clear();
}

void Engine::RestoreState(int64_t step) {
  step_ = step;
  PrepareAndGatherWeights();
}

void Engine::PrepareAndGatherWeights() {
  // Nothing of the last step may still read or write Wᶻ³ (a deferred all-gather of a group
  // never gathered since, say).
  comm_thread_->Drain();
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    g.outer_gather_pending = false;
    g.outer_gather_handle = {};
  }
  if (mx_) PrepareMx();
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    const size_t z1_off = g.z1.begin - g.z3.begin;
    if (g.sdt == DType::kBF16) {
      // G: cast the ZeRO-1 main weights straight into the ZeRO-1 slice of Wᶻ³.
      ScopedTimer t(&time_.cast);
      TraceSpan s(cfg_.tracer, "G (cast)", kTraceCompute, {{"group", g.layout.group}});
      cfg_.backend->CastF32ToBf16(g.main_z1, g.w_z3->data_as<bf16>() + z1_off,
                                  static_cast<int64_t>(g.z1.size()));
      counters_.weight_preps++;
    }
    // Outer all-gather, in place: this rank's slice already sits at its group position.
    // Overlapped: deferred to the group's first gather of the next forward (StartOuterGather);
    // groups stored as MXFP8 gather here, as their scales go through Tw before any forward
    // (with ② MXFP8 groups store fp32 and quantize per gather, so they are deferred too).
    if (up_replica_ag_->size() > 1) {
      SSHSDP_CHECK(z1_off == static_cast<size_t>(up_replica_ag_->rank()) * g.z1.size(), LayoutError,
                   "group {}: ZeRO-1 slice at offset {} does not match replica all-gather "
                   "position {}",
                   g.layout.group, z1_off, up_replica_ag_->rank());
      if (cfg_.overlap_outer && g.sdt != DType::kE4M3) {
        g.outer_gather_pending = true;
        continue;
      }
      ScopedTimer t(&time_.comm_wait);
      TraceSpan s(cfg_.tracer, "outer all-gather", kTraceCompute, {{"group", g.layout.group}});
      SyncBackend();  // G and the update have written Wᶻ¹ before the gather's stream reads it
      up_replica_ag_->AllGatherInPlace(g.w_z3->data(), g.z1.size(), g.sdt);
    }
    if (g.sdt == DType::kE4M3) {
      // S follows W: outer all-gather of its ZeRO-1 slice into Sᶻ³, then the ZeRO-3
      // all-gather into the full S (on the communication thread, which owns the ZeRO-3
      // communicator), and Tw relays it out into S′ — once per optimizer step (weight reuse).
      const int gi = g.layout.group;
      ScopedTimer t(&time_.comm_wait);
      Communicator* ag = mx_replica_ag_ ? mx_replica_ag_.get() : up_replica_ag_.get();
      if (ag->size() > 1) ag->AllGatherInPlace(mx_->s_z3(gi), mx_->s_z1_count(gi), DType::kUE8M0);
      Communicator* z3 = mx_zero3_ ? mx_zero3_.get() : rt_zero3_.get();
      const void* src = mx_->s_z3(gi);
      void* dst = mx_->s_full(gi);
      const size_t count = mx_->s_z3_count(gi);
      comm_thread_->Submit([=] { z3->AllGather(src, dst, count, DType::kUE8M0); }).Wait();
    }
  }
  for (auto& gp : groups_) {
    if (gp->sdt != DType::kE4M3) continue;
    ScopedTimer t(&time_.cast);
    mx_->Relayout(gp->layout.group);
    counters_.scale_relayouts++;
  }
  // No wait here: the next gather of Wᶻ³ waits for G and the update on its own thread
  // (SubmitComm's event).
}

void Engine::SyncBackend() {
  // The backend's ops may run behind the host (a CUDA stream), and a collective called on this
  // thread moves its memory on another stream. The communication thread's tasks wait for an
  // event instead (SubmitComm).
  counters_.backend_waits++;
  cfg_.backend->Synchronize();
}

void Engine::PrepareMx() {
  // G at ZeRO-1 on 32-row bands (split bands point to point through the update planner).
  std::vector<const float*> mains;
  std::vector<uint8_t*> codes;
  bool any = false;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    mains.push_back(g.main_z1);
    codes.push_back(g.w_z3->data_as<uint8_t>() + (g.z1.begin - g.z3.begin));
    any = any || g.sdt == DType::kE4M3;
  }
  if (!any) return;  // ②: quantized per gather instead
  {
    ScopedTimer t(&time_.cast);
    TraceSpan s(cfg_.tracer, "G (mxfp8)", kTraceCompute);
    mx_->Quantize(mains, codes);
  }
  for (auto& gp : groups_)
    if (gp->sdt == DType::kE4M3) counters_.weight_preps++;
  counters_.mx_split_bands = mx_->last_stats().split_bands;
  counters_.mx_p2p_bytes = mx_->last_stats().bytes_sent;
}

bool Engine::StateIsFinite() {
  // Σx² in double of finite floats cannot overflow, so it is finite exactly when every
  // element is.
  float bad = 0;
  for (auto& gp : groups_) {
    const RuntimeGroup& g = *gp;
    for (const Fragment& f : g.chain->Fragments(Shard::kZero1))
      if (!std::isfinite(
              cfg_.backend->SumSquares(g.main_z1 + f.shard_offset, static_cast<int64_t>(f.length))))
        bad = 1;
    // Optimizer state: every stored element (padding and unused elements stay zero).
    if (!std::isfinite(cfg_.backend->SumSquares(g.state->data_as<float>(),
                                                static_cast<int64_t>(g.state->bytes() / 4))))
      bad = 1;
  }
  world_.AllReduce(&bad, 1, DType::kF32);
  return bad == 0;
}

std::map<std::string, std::vector<float>> Engine::GatherMainWeights() {
  std::map<std::string, std::vector<float>> out;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    const size_t c = g.z1.size();
    std::vector<float> all(c * world_.size()), full(g.padded);
    // This rank's chunk to the host first (world_ moves host memory; a copy on the CPU).
    cfg_.backend->CopyOut(all.data() + static_cast<size_t>(world_.rank()) * c, g.main_z1, c * 4);
    world_.AllGatherInPlace(all.data(), c, DType::kF32);
    for (int j = 0; j < topo_.so(); ++j) {
      int owner = topo_.Zero1ChunkOwner(j, 0);
      std::memcpy(full.data() + j * c, all.data() + owner * c, c * 4);
    }
    for (size_t m = 0; m < g.layout.list.num_members(); ++m) {
      const TensorListMember& mem = g.layout.list.member(m);
      const MemberPiece& pc = g.pieces[m];
      const UpdateParam& u = g.layout.update[pc.update];
      std::vector<float>& dst = out[u.name];
      dst.resize(NumElements(u.shape));
      std::copy_n(full.begin() + mem.offset, pc.valid, dst.begin() + pc.offset);
    }
  }
  return out;
}

std::map<std::string, Engine::MxRuntimeWeight> Engine::GatherMxWeights() {
  std::map<std::string, MxRuntimeWeight> out;
  if (!mx_) return out;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    const int gi = g.layout.group;
    if (!mx_->is_mx(gi) || g.sdt != DType::kE4M3) continue;
    const size_t c = g.z1.size();
    std::vector<uint8_t> all(c * world_.size()), full(g.padded);
    const uint8_t* mine = g.w_z3->data_as<uint8_t>() + (g.z1.begin - g.z3.begin);
    cfg_.backend->CopyOut(all.data() + static_cast<size_t>(world_.rank()) * c, mine, c);
    world_.AllGatherInPlace(all.data(), c, DType::kE4M3);
    for (int j = 0; j < topo_.so(); ++j)
      std::memcpy(full.data() + j * c, all.data() + topo_.Zero1ChunkOwner(j, 0) * c, c);
    for (size_t r = 0; r < g.layout.runtime.size(); ++r) {
      const RuntimeParam& rp = g.layout.runtime[r];
      MxRuntimeWeight& w = out[rp.name];
      w.codes.assign(full.begin() + rp.offset, full.begin() + rp.offset + rp.numel);
      const uint8_t* s = mx_->host_scales(gi, static_cast<int>(r));
      w.scales.assign(s, s + mx_->scales_bytes(gi, static_cast<int>(r)));
    }
  }
  return out;
}

std::vector<Engine::Zero1Field> Engine::Zero1Fields(bool read_state) {
  // On a device: a host copy of each array (its stored elements), read after every queued op.
  // On host memory: the arrays themselves.
  zero1_mirrors_.clear();
  auto on_host = [&](const Zero1Array& a, size_t chunk) {
    if (!on_device_) return a;
    Zero1Mirror& m = zero1_mirrors_.emplace_back();
    m.device = a.data;
    m.host.resize(a.packed ? a.stored() : chunk);
    if (read_state) cfg_.backend->CopyOut(m.host.data(), a.data, m.host.size() * sizeof(float));
    Zero1Array h = a;
    h.data = m.host.data();
    return h;
  };
  std::vector<Zero1Field> out;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    const int gi = g.layout.group;
    out.push_back(
        {"main", gi, on_host(g.main_z1, g.z1.size()), g.z1, &g.layout, g.chain.get(), &g.pieces});
    for (const auto& [name, a] : g.opt_state)
      out.push_back({name, gi, on_host(a, g.z1.size()), g.z1, &g.layout, g.chain.get(), &g.pieces});
  }
  return out;
}

}  // namespace sshsdp
