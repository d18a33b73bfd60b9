// Engine: buffers, schedule and update of one sharded training step (see engine.h).
#include "sshsdp/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/elementwise.h"

namespace sshsdp {

struct Engine::RuntimeGroup {
  GroupLayout layout;
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
  std::unique_ptr<DataNode> state;     // AdamW m, v over the ZeRO-1 chunk
  float* m = nullptr;
  float* v = nullptr;

  // Full-buffer views: W′ (gathered runtime weights) and G′ (runtime gradients).
  std::unique_ptr<DataNode> w_full;
  std::unique_ptr<DataNode> g_full;
  void* gather_block = nullptr;
  bool gather_started = false;
  CommHandle gather_handle;
  void* grad_block = nullptr;
  CommHandle rs_handle;

  std::vector<TensorRef> Views(const DataNode& root, DType dt) const {
    std::vector<TensorRef> out;
    for (const auto& c : root.children()) out.push_back(TensorRef{c->data(), dt});
    return out;
  }
};

namespace {

std::unique_ptr<DataNode> FullViews(const std::string& name, const GroupLayout& L, DType dt) {
  auto root = std::make_unique<DataNode>(name, L.list.padded_numel() * DTypeSize(dt));
  for (const RuntimeParam& rp : L.runtime)
    root->AddChild(rp.name, dt, rp.shape, rp.offset * DTypeSize(dt));
  root->Finalize();
  return root;
}

std::unique_ptr<DataNode> Buffer(const std::string& name, size_t bytes, MemoryAccount* acct,
                                 const std::string& category) {
  auto root = std::make_unique<DataNode>(name, std::max<size_t>(bytes, 64));
  root->Finalize();
  root->Allocate(acct, category);
  return root;
}

CommCounters Delta(const CommCounters& after, const CommCounters& before) {
  CommCounters d;
  d.intra_node_bytes = after.intra_node_bytes - before.intra_node_bytes;
  d.inter_node_bytes = after.inter_node_bytes - before.inter_node_bytes;
  d.calls = after.calls - before.calls;
  return d;
}

}  // namespace

Engine::Engine(Model& model, Communicator& world, const EngineConfig& cfg)
    : model_(model),
      world_(world),
      cfg_(cfg),
      topo_(world.size(), cfg.ranks_per_node > 0 ? cfg.ranks_per_node : world.size(), cfg.sw,
            cfg.sg, cfg.so),
      rank_(world.rank()) {
  SSHSDP_CHECK(cfg.weight_dtype == DType::kF32 || cfg.weight_dtype == DType::kBF16, ConfigError,
               "runtime weight dtype must be fp32 or bf16, got {}", DTypeName(cfg.weight_dtype));
  SSHSDP_CHECK(cfg.microbatches >= 1, ConfigError, "microbatches must be >= 1, got {}",
               cfg.microbatches);
  SSHSDP_CHECK(cfg.batch_size >= 1, ConfigError, "batch size must be >= 1, got {}", cfg.batch_size);
  SSHSDP_CHECK(model.num_groups() >= 1, ConfigError, "model has no runtime groups");
  for (int g = 0; g < model.num_groups(); ++g) BuildGroup(g);

  // Communicators (collective over the world, in the same order on every rank). The
  // runtime ones belong to the communication thread only.
  auto split = [&](Communicator& parent, sshsdp::Group grp) {
    return parent.Split(topo_.GroupColor(grp, rank_), topo_.GroupPosition(grp, rank_));
  };
  rt_dup_ = world_.Duplicate();
  rt_zero3_ = split(*rt_dup_, sshsdp::Group::kZero3);
  rt_zero2_ = split(*rt_dup_, sshsdp::Group::kZero2);
  up_replica_rs_ = split(world_, sshsdp::Group::kReplicaRS);
  up_replica_ag_ = split(world_, sshsdp::Group::kReplicaAG);
  up_hsdp_ = split(world_, sshsdp::Group::kHsdp);
  comm_thread_ = std::make_unique<CommThread>("runtime");
}

Engine::~Engine() {
  if (comm_thread_) {
    try {
      comm_thread_->Drain();
    } catch (...) {
    }
  }
  comm_thread_.reset();
  for (auto& g : groups_) {
    g->w_full->Release();
    g->g_full->Release();
  }
  for (auto& [p, bytes] : all_blocks_) {
    std::free(p);
    memory_.Free("transient", bytes);
  }
}

void Engine::BuildGroup(int gi) {
  auto g = std::make_unique<RuntimeGroup>();
  g->layout = BuildGroupLayout(gi, model_.GroupParams(gi), cfg_.weight_dtype,
                               static_cast<size_t>(topo_.so()));
  g->chain = std::make_unique<ShardChain>(g->layout.list, topo_, rank_);
  g->z3 = g->chain->LocalRange(Shard::kZero3);
  g->z2 = g->chain->LocalRange(Shard::kZero2);
  g->z1 = g->chain->LocalRange(Shard::kZero1);
  g->padded = g->layout.list.padded_numel();
  const size_t ws = DTypeSize(cfg_.weight_dtype);
  const std::string p = "group" + std::to_string(gi);

  g->w_z3 = Buffer(p + ".w_z3", g->z3.size() * ws, &memory_, "weights");
  if (cfg_.weight_dtype == DType::kF32) {
    // Zero copy: fp32 runtime weights ARE the main weights; the ZeRO-1 slice of Wᶻ³ holds them.
    g->main_z1 = g->w_z3->data_as<float>() + (g->z1.begin - g->z3.begin);
  } else {
    g->main_own = Buffer(p + ".main_z1", g->z1.size() * 4, &memory_, "main_weights");
    g->main_z1 = g->main_own->data_as<float>();
  }
  g->g_z2 = Buffer(p + ".g_z2", g->z2.size() * 4, &memory_, "gradients");
  if (topo_.so() == topo_.sg()) {
    g->g_z1 = g->g_z2->data_as<float>();  // same shard: a view
  } else {
    g->g_z1_own = Buffer(p + ".g_z1", g->z1.size() * 4, &memory_, "gradients");
    g->g_z1 = g->g_z1_own->data_as<float>();
  }
  g->state = Buffer(p + ".adamw", g->z1.size() * 8, &memory_, "optimizer_state");
  g->m = g->state->data_as<float>();
  g->v = g->m + g->z1.size();

  g->w_full = FullViews(p + ".w_full", g->layout, cfg_.weight_dtype);
  g->g_full = FullViews(p + ".g_full", g->layout, DType::kF32);
  if (topo_.sw() == 1) g->w_full->AttachExternal(g->w_z3->data(), g->w_z3->bytes());
  if (topo_.sg() == 1) g->g_full->AttachExternal(g->g_z2->data(), g->g_z2->bytes());
  groups_.push_back(std::move(g));
}

void* Engine::Acquire(size_t bytes) {
  auto it = free_blocks_.find(bytes);
  if (it != free_blocks_.end()) {
    void* p = it->second;
    free_blocks_.erase(it);
    return p;
  }
  void* p = std::aligned_alloc(
      DataNode::kRootAlignment,
      (bytes + DataNode::kRootAlignment - 1) / DataNode::kRootAlignment * DataNode::kRootAlignment);
  SSHSDP_CHECK(p != nullptr, Error, "out of memory allocating a {}-byte transient buffer", bytes);
  all_blocks_.emplace_back(p, bytes);
  memory_.Allocate("transient", bytes);
  return p;
}

void Engine::Recycle(void* p, size_t bytes) { free_blocks_.emplace(bytes, p); }

void Engine::StartGather(int gi) {
  RuntimeGroup& g = *groups_[gi];
  if (topo_.sw() == 1 || g.gather_started) return;
  const size_t bytes = g.padded * DTypeSize(cfg_.weight_dtype);
  g.gather_block = Acquire(bytes);
  g.w_full->AttachExternal(g.gather_block, bytes);
  g.gather_started = true;
  counters_.gathers++;
  const void* src = g.w_z3->data();
  void* dst = g.gather_block;
  const size_t count = g.z3.size();
  const DType dt = cfg_.weight_dtype;
  Communicator* comm = rt_zero3_.get();
  g.gather_handle = comm_thread_->Submit([=] { comm->AllGather(src, dst, count, dt); });
}

void Engine::WaitGather(int gi) {
  RuntimeGroup& g = *groups_[gi];
  if (topo_.sw() == 1) return;
  StartGather(gi);
  g.gather_handle.Wait();
}

void Engine::ReleaseGather(int gi) {
  RuntimeGroup& g = *groups_[gi];
  if (topo_.sw() == 1 || !g.gather_started) return;
  g.gather_handle.Wait();
  g.w_full->Release();
  Recycle(g.gather_block, g.padded * DTypeSize(cfg_.weight_dtype));
  g.gather_block = nullptr;
  g.gather_started = false;
}

void Engine::PrepareAndGatherWeights() {
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    const size_t z1_off = g.z1.begin - g.z3.begin;
    if (cfg_.weight_dtype == DType::kBF16) {
      // G: cast the ZeRO-1 main weights straight into the ZeRO-1 slice of Wᶻ³.
      FloatToBf16(g.main_z1, g.w_z3->data_as<bf16>() + z1_off, g.z1.size());
      counters_.weight_preps++;
    }
    // Outer all-gather, in place: this rank's slice already sits at its group position.
    if (up_replica_ag_->size() > 1) {
      SSHSDP_CHECK(z1_off == static_cast<size_t>(up_replica_ag_->rank()) * g.z1.size(), LayoutError,
                   "group {}: ZeRO-1 slice at offset {} does not match replica all-gather "
                   "position {}",
                   g.layout.group, z1_off, up_replica_ag_->rank());
      up_replica_ag_->AllGatherInPlace(g.w_z3->data(), g.z1.size(), cfg_.weight_dtype);
    }
  }
}

void Engine::InitWeights(uint64_t seed) {
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    std::memset(g.main_z1, 0, g.z1.size() * 4);
    for (const Fragment& f : g.chain->Fragments(Shard::kZero1)) {
      const UpdateParam& u = g.layout.update[f.member];
      UpdatePart part{u.name, u.shape, 0, u.kind, u.init};
      FillInit(part, seed, static_cast<int64_t>(f.tensor_begin), static_cast<int64_t>(f.length),
               g.main_z1 + f.shard_offset);
    }
    std::memset(g.m, 0, g.z1.size() * 8);
  }
  step_ = 0;
  PrepareAndGatherWeights();
}

StepStats Engine::Step(const BatchFn& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = static_cast<int>(groups_.size());
  const int M = cfg_.microbatches;
  const int B = cfg_.batch_size;
  const int T = cfg_.seq_len;
  SSHSDP_CHECK(T > 0, ConfigError, "sequence length must be set (EngineConfig::seq_len)");
  counters_ = {};
  const CommCounters rt0 = rt_zero3_->counters(), rt1 = rt_zero2_->counters();
  CommCounters up0;
  for (Communicator* c : {up_replica_rs_.get(), up_replica_ag_.get(), up_hsdp_.get(), &world_})
    up0 += c->counters();

  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  double loss_sum = 0;
  for (int mb = 0; mb < M; ++mb) {
    batch(mb, tokens.data(), targets.data());
    model_.SetBatch(tokens.data(), targets.data(), B, T);
    if (activation_bytes_ != static_cast<uint64_t>(model_.ActivationBytes())) {
      // The model owns its activation arena; account it with the rest of the rank's memory.
      memory_.Free("activations", activation_bytes_);
      activation_bytes_ = static_cast<uint64_t>(model_.ActivationBytes());
      memory_.Allocate("activations", activation_bytes_);
    }
    // Forward, layer by layer, prefetching the next layer's weights.
    for (int g = 0; g < n; ++g) {
      StartGather(g);
      if (cfg_.prefetch && g + 1 < n) StartGather(g + 1);
      WaitGather(g);
      model_.Forward(g, groups_[g]->Views(*groups_[g]->w_full, cfg_.weight_dtype));
      if (cfg_.reshard_after_forward && g + 1 < n) ReleaseGather(g);
    }
    loss_sum += model_.Loss();
    // Backward in reverse; gradients go straight into G′ views, then reduce-scatter.
    for (int g = n - 1; g >= 0; --g) {
      RuntimeGroup& G = *groups_[g];
      StartGather(g);
      if (cfg_.prefetch && g > 0) StartGather(g - 1);
      WaitGather(g);
      GradWrite mode = GradWrite::kOverwrite;
      if (topo_.sg() == 1) {
        if (mb > 0) {
          mode = GradWrite::kAccumulate;  // G′ is G′ᶻ²: accumulate in backward
          counters_.fused_accumulations++;
        }
      } else {
        const size_t bytes = G.padded * 4;
        G.grad_block = Acquire(bytes);
        G.g_full->AttachExternal(G.grad_block, bytes);
        const size_t used = G.layout.list.numel();
        std::memset(static_cast<float*>(G.grad_block) + used, 0, (G.padded - used) * 4);
      }
      model_.Backward(g, G.Views(*G.w_full, cfg_.weight_dtype), G.Views(*G.g_full, DType::kF32),
                      mode);
      if (topo_.sg() > 1) {
        G.g_full->Release();
        const void* src = G.grad_block;
        void* dst = G.g_z2->data();
        const size_t count = G.z2.size();
        const bool acc = mb > 0;
        if (acc) counters_.fused_accumulations++;
        Communicator* comm = rt_zero2_.get();
        G.rs_handle = comm_thread_->Submit(
            [=] { comm->ReduceScatter(src, DType::kF32, dst, DType::kF32, count, acc); });
      }
      ReleaseGather(g);
      if (g + 1 < n && groups_[g + 1]->grad_block) {
        RuntimeGroup& P = *groups_[g + 1];
        P.rs_handle.Wait();
        Recycle(P.grad_block, P.padded * 4);
        P.grad_block = nullptr;
      }
    }
    for (auto& gp : groups_) {
      if (gp->grad_block) {
        gp->rs_handle.Wait();
        Recycle(gp->grad_block, gp->padded * 4);
        gp->grad_block = nullptr;
      }
    }
  }
  comm_thread_->Drain();

  // Update phase: outer reduce-scatter, HSDP all-reduce, norm, AdamW, G, outer all-gather.
  const bool count_norm = topo_.Coord(rank_).d == 0;
  double sumsq = 0;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    if (up_replica_rs_->size() > 1)
      up_replica_rs_->ReduceScatter(g.g_z2->data(), DType::kF32, g.g_z1, DType::kF32, g.z1.size(),
                                    false);
    if (up_hsdp_->size() > 1) up_hsdp_->AllReduce(g.g_z1, g.z1.size(), DType::kF32);
    if (count_norm)
      for (const Fragment& f : g.chain->Fragments(Shard::kZero1))
        sumsq += kernels::SumSquares(g.g_z1 + f.shard_offset, static_cast<int64_t>(f.length));
  }
  float red[2] = {static_cast<float>(loss_sum), static_cast<float>(sumsq)};
  world_.AllReduce(red, 2, DType::kF32);
  const double norm_scale = 1.0 / (static_cast<double>(M) * world_.size());
  const double grad_norm = std::sqrt(static_cast<double>(red[1])) * norm_scale;
  double clip = 1.0;
  if (cfg_.clip_norm > 0 && grad_norm > cfg_.clip_norm) clip = cfg_.clip_norm / (grad_norm + 1e-6);
  const float grad_scale = static_cast<float>(clip * norm_scale);

  ++step_;
  std::vector<AdamWSpan> spans;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    for (const Fragment& f : g.chain->Fragments(Shard::kZero1)) {
      const UpdateParam& u = g.layout.update[f.member];
      float wd = u.kind == UpdateKind::kVector ? 0.0f : cfg_.adamw.weight_decay;
      spans.push_back({g.main_z1 + f.shard_offset, g.g_z1 + f.shard_offset, g.m + f.shard_offset,
                       g.v + f.shard_offset, static_cast<int64_t>(f.length), wd});
    }
  }
  AdamWStep(spans, cfg_.adamw, step_, grad_scale);
  PrepareAndGatherWeights();

  StepStats st;
  st.step = step_;
  st.loss = red[0] / (static_cast<double>(M) * world_.size());
  st.grad_norm = grad_norm;
  st.tokens = static_cast<int64_t>(M) * B * T * world_.size();
  st.counters = counters_;
  st.counters.runtime_comm = Delta(rt_zero3_->counters(), rt0);
  st.counters.runtime_comm += Delta(rt_zero2_->counters(), rt1);
  CommCounters up1;
  for (Communicator* c : {up_replica_rs_.get(), up_replica_ag_.get(), up_hsdp_.get(), &world_})
    up1 += c->counters();
  st.counters.update_comm = Delta(up1, up0);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

std::map<std::string, std::vector<float>> Engine::GatherMainWeights() {
  std::map<std::string, std::vector<float>> out;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    const size_t c = g.z1.size();
    std::vector<float> all(c * world_.size()), full(g.padded);
    world_.AllGather(g.main_z1, all.data(), c, DType::kF32);
    for (int j = 0; j < topo_.so(); ++j) {
      int owner = topo_.Zero1ChunkOwner(j, 0);
      std::memcpy(full.data() + j * c, all.data() + owner * c, c * 4);
    }
    for (size_t m = 0; m < g.layout.list.num_members(); ++m) {
      const TensorListMember& mem = g.layout.list.member(m);
      out[mem.name].assign(full.begin() + mem.offset, full.begin() + mem.end());
    }
  }
  return out;
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
    for (const Fragment& f : g.chain->Fragments(Shard::kZero1)) {
      const std::vector<float>& src = weights.at(g.layout.update[f.member].name);
      std::memcpy(g.main_z1 + f.shard_offset, src.data() + f.tensor_begin, f.length * 4);
    }
    std::memset(g.m, 0, g.z1.size() * 8);
  }
  step_ = 0;
  PrepareAndGatherWeights();
}

std::vector<Engine::Zero1Field> Engine::Zero1Fields() {
  std::vector<Zero1Field> out;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    const int gi = g.layout.group;
    out.push_back({"main", gi, g.main_z1, g.z1, &g.layout, g.chain.get()});
    out.push_back({"m", gi, g.m, g.z1, &g.layout, g.chain.get()});
    out.push_back({"v", gi, g.v, g.z1, &g.layout, g.chain.get()});
  }
  return out;
}

void Engine::RestoreState(int64_t step) {
  step_ = step;
  PrepareAndGatherWeights();
}

std::vector<UpdateParam> Engine::UpdateParams() const {
  std::vector<UpdateParam> out;
  for (const auto& g : groups_)
    for (const UpdateParam& u : g->layout.update) out.push_back(u);
  return out;
}

std::map<std::string, uint64_t> Engine::AnalyticMemory() const {
  std::map<std::string, uint64_t> a;
  const size_t ws = DTypeSize(cfg_.weight_dtype);
  size_t max_full = 0;
  for (const auto& g : groups_) {
    a["weights"] += std::max<size_t>(g->z3.size() * ws, 64);
    if (cfg_.weight_dtype != DType::kF32)
      a["main_weights"] += std::max<size_t>(g->z1.size() * 4, 64);
    a["gradients"] += std::max<size_t>(g->z2.size() * 4, 64);
    if (topo_.so() != topo_.sg()) a["gradients"] += std::max<size_t>(g->z1.size() * 4, 64);
    a["optimizer_state"] += std::max<size_t>(g->z1.size() * 8, 64);
    max_full = std::max(max_full, g->padded);
  }
  // At most two gathered layers and two gradient buffers live at once (prefetch depth 1).
  uint64_t transient = 0;
  if (topo_.sw() > 1) transient += 2 * max_full * ws;
  if (topo_.sg() > 1) transient += 2 * max_full * 4;
  a["transient(max)"] = transient;
  return a;
}

}  // namespace sshsdp
