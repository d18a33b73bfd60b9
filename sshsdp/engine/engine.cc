// Engine: buffers, schedule and update of one sharded training step (see engine.h).
#include "sshsdp/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/direct_communicator.h"
#include "sshsdp/engine/mx_weights.h"
#include "sshsdp/kernels/elementwise.h"

namespace sshsdp {

struct Engine::RuntimeGroup {
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

// ⑦: optimizer state replicated across replica groups = no outer ZeRO-1 (so = sg).
int EffectiveSo(const EngineConfig& c) { return c.redundancies.replicate_optimizer ? c.sg : c.so; }

}  // namespace

NonFinitePolicy ParseNonFinitePolicy(const std::string& name) {
  if (name == "stop") return NonFinitePolicy::kStop;
  SSHSDP_CHECK(name == "skip", ConfigError, "--on-nonfinite must be stop or skip, got '{}'", name);
  return NonFinitePolicy::kSkip;
}

void ValidateEngineConfig(const EngineConfig& cfg) {
  ValidateAdamW(cfg.adamw);
  ValidateMuon(cfg.muon);
  SSHSDP_CHECK(std::isfinite(cfg.clip_norm) && cfg.clip_norm >= 0, ConfigError,
               "gradient clipping norm (--clip) must be a finite number >= 0 (0: off), got {}",
               cfg.clip_norm);
  SSHSDP_CHECK(cfg.microbatches >= 1, ConfigError,
               "microbatches (--microbatches) must be >= 1, "
               "got {}",
               cfg.microbatches);
  SSHSDP_CHECK(cfg.batch_size >= 1, ConfigError,
               "samples per microbatch (--batch-size) must be >= 1, got {}", cfg.batch_size);
  SSHSDP_CHECK(cfg.seq_len >= 0, ConfigError, "sequence length (--seq-len) must be >= 0, got {}",
               cfg.seq_len);
}

Engine::Engine(Model& model, Communicator& world, const EngineConfig& cfg)
    : model_(model),
      world_(world),
      cfg_(cfg),
      topo_(world.size(), cfg.ranks_per_node > 0 ? cfg.ranks_per_node : world.size(), cfg.sw,
            cfg.sg, EffectiveSo(cfg)),
      rank_(world.rank()) {
  ValidateEngineConfig(cfg);
  SSHSDP_CHECK(cfg.weight_dtype == DType::kF32 || cfg.weight_dtype == DType::kBF16 ||
                   cfg.weight_dtype == DType::kE4M3,
               ConfigError, "runtime weight dtype must be fp32, bf16 or mxfp8 (e4m3), got {}",
               DTypeName(cfg.weight_dtype));
  if (cfg.weight_dtype == DType::kE4M3) {
    SSHSDP_CHECK(model.ConsumesMx(), ConfigError,
                 "weight dtype mxfp8: this model does not consume MXFP8 weight views (an MoE "
                 "model does only with its experts in their own runtime groups: "
                 "MoeConfig::expert_group)");
    bool any_mx = false;
    for (int g = 0; g < model.num_groups() && !any_mx; ++g) any_mx = model.GroupConsumesMx(g);
    SSHSDP_CHECK(any_mx, ConfigError,
                 "weight dtype mxfp8: no runtime group of this model consumes MXFP8 weights");
    SSHSDP_CHECK(cfg.shard_layout == ShardLayout::kFlat && !cfg.redundancies.weight_copies &&
                     !cfg.redundancies.tw_every_use && cfg.comm_path == CommPath::kCollective,
                 ConfigError,
                 "weight dtype mxfp8 runs on the flat shard layout without ③/① copies and on the "
                 "collective comm path (of the baselines only ② quantize-every-gather), got {}",
                 cfg.redundancies.ToString());
  }
  grad_dtype_ = GradDType(cfg.reduce);
  SSHSDP_CHECK(grad_dtype_ == DType::kF32 ||
                   (cfg.shard_layout == ShardLayout::kFlat && !cfg.redundancies.grad_copies),
               ConfigError,
               "reduce mode {} writes bf16 gradients straight into G′: it needs the flat shard "
               "layout without ④ gradient copies",
               ReduceModeName(cfg.reduce));
  SSHSDP_CHECK(cfg.microbatches >= 1, ConfigError, "microbatches must be >= 1, got {}",
               cfg.microbatches);
  SSHSDP_CHECK(cfg.batch_size >= 1, ConfigError, "batch size must be >= 1, got {}", cfg.batch_size);
  SSHSDP_CHECK(model.num_groups() >= 1, ConfigError, "model has no runtime groups");
  cfg_.so = topo_.so();
  const Redundancies& R = cfg_.redundancies;
  SSHSDP_CHECK(cfg_.shard_layout != ShardLayout::kDim0 || (R.weight_copies && R.grad_copies),
               ConfigError,
               "the dim-0 shard layout interleaves parameters by rank in the gathered buffer: "
               "it needs weight copy-out (③) and gradient copies (④) on, got {}",
               R.ToString());
  store_dtype_ = R.cast_every_gather ? DType::kF32 : cfg_.weight_dtype;
  views_direct_ = cfg_.shard_layout == ShardLayout::kFlat && !R.tw_every_use && !R.weight_copies;
  grads_direct_ = cfg_.shard_layout == ShardLayout::kFlat && !R.grad_copies;
  skip_gather_ = topo_.sw() == 1 && store_dtype_ == cfg_.weight_dtype && !R.weight_copies;
  skip_rs_ = topo_.sg() == 1 && grads_direct_ && !R.separate_add && grad_dtype_ == DType::kF32;
  if (cfg_.comm_path == CommPath::kDirect) {
    // Plan-time checks of the direct path, before any collective.
    SSHSDP_CHECK(dynamic_cast<MpiCommunicator*>(&world) != nullptr, ConfigError,
                 "comm_path=direct runs on MPI windows: pass an MpiCommunicator world");
    for (sshsdp::Group grp : {sshsdp::Group::kZero3, sshsdp::Group::kZero2}) {
      DirectCommunicator::CheckGeometry(topo_.GroupMembers(grp, rank_),
                                        topo_.GroupPosition(grp, rank_), topo_.ranks_per_node(),
                                        fmt::format("comm_path=direct, {} group of rank {} ({})",
                                                    GroupName(grp), rank_, topo_.ToString()));
    }
  }
  for (int g = 0; g < model.num_groups(); ++g) BuildGroup(g);
  // ⑥ before any communicator exists: Megatron-FSDP refuses structured updates.
  {
    const UnitPolicy policy{cfg_.optimizer == OptimizerKind::kMuon, cfg_.muon_unit,
                            cfg_.unit_overrides};
    for (auto& gp : groups_)
      for (const RuntimeParam& rp : gp->layout.runtime)
        for (int u = rp.first_member;
             u < rp.first_member + rp.num_members && first_structured_.empty(); ++u)
          if (RuleFor(gp->layout.update[u], rp, policy) != UnitRule::kAdamW)
            first_structured_ = gp->layout.update[u].name;
    if (!first_structured_.empty())
      CheckStructuredUpdates(cfg_.redundancies, "muon", first_structured_);
  }

  // Communicators (collective over the world, in the same order on every rank). The
  // runtime ones belong to the communication thread only.
  auto split = [&](Communicator& parent, sshsdp::Group grp) {
    return parent.Split(topo_.GroupColor(grp, rank_), topo_.GroupPosition(grp, rank_));
  };
  rt_dup_ = world_.Duplicate();
  rt_zero3_ = split(*rt_dup_, sshsdp::Group::kZero3);
  rt_zero2_ = split(*rt_dup_, sshsdp::Group::kZero2);
  if (cfg_.comm_path == CommPath::kDirect) SetUpDirectPath();
  up_replica_rs_ = split(world_, sshsdp::Group::kReplicaRS);
  up_replica_ag_ = split(world_, sshsdp::Group::kReplicaAG);
  up_hsdp_ = split(world_, sshsdp::Group::kHsdp);
  comm_thread_ = std::make_unique<CommThread>("runtime");
  up_p2p_ = world_.Duplicate();
  BuildUpdate();
  if (cfg_.weight_dtype == DType::kE4M3) {
    std::vector<const GroupLayout*> layouts;
    std::vector<const ShardChain*> chains;
    std::vector<bool> mx_groups;
    for (auto& gp : groups_) {
      layouts.push_back(&gp->layout);
      chains.push_back(gp->chain.get());
      mx_groups.push_back(gp->wdt == DType::kE4M3);
    }
    mx_ = std::make_unique<MxWeights>(layouts, chains, topo_, rank_, cfg_.scale_layout, *up_p2p_,
                                      &memory_, mx_groups);
  }
}

void Engine::BuildUpdate() {
  // Which optimizer and unit every update parameter gets, and the plans (metadata only: every
  // rank computes the same plan of its replica without communicating).
  UpdateOptions o;
  o.optimizer = cfg_.optimizer;
  o.adamw = cfg_.adamw;
  o.muon = cfg_.muon;
  o.muon_unit = cfg_.muon_unit;
  o.overrides = cfg_.unit_overrides;
  // ⑥ (Megatron-FSDP's refusal was checked in the constructor): FSDP2's full_tensor path
  // gathers whole matrices on every rank of the ZeRO-1 group (FullTensorMuon), on any shard
  // layout; sshsdp / veScale move split units point to point.
  o.full_tensor = cfg_.redundancies.structured_updates == StructuredUpdates::kFullTensor;
  if (o.full_tensor && !first_structured_.empty()) {
    // The ZeRO-1 group of this rank's replica, ordered by chunk (collective over the world;
    // the condition is the same on every rank).
    up_zero1_ = world_.Split(topo_.Coord(rank_).d, topo_.ChunkIndex(Shard::kZero1, rank_));
  }
  std::vector<UpdateGroupView> views;
  for (auto& gp : groups_) {
    UpdateGroupView v{&gp->layout, gp->chain.get(), gp->pieces};
    bool identity = gp->pieces.size() == gp->layout.update.size();
    for (size_t m = 0; m < gp->pieces.size(); ++m) {
      const MemberPiece& pc = gp->pieces[m];
      identity = identity && pc.update == static_cast<int>(m) && pc.offset == 0 &&
                 pc.valid == gp->layout.list.member(m).numel;
    }
    if (identity) v.pieces.clear();
    views.push_back(std::move(v));
  }
  update_ =
      std::make_unique<StructuredUpdate>(views, o, rank_, *up_p2p_, &memory_, up_zero1_.get());
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t u = 0; u < groups_[g]->layout.update.size(); ++u)
      groups_[g]->layout.update[u].optimizer = update_->optimizers()[g][u];
}

void Engine::SetUpDirectPath() {
  // The comm thread's ZeRO-3 / ZeRO-2 groups become direct communicators (their own windows);
  // the buffers their collectives touch are slots of registered roots, as many as the
  // schedule keeps live at once: two gathered layers (this one and the prefetched one) or all
  // of them without reshard_after_forward; two gradient buffers (this layer's and the one
  // whose reduce-scatter is still running).
  auto to_direct = [](std::unique_ptr<Communicator>& c) {
    auto* mpi = dynamic_cast<MpiCommunicator*>(c.get());
    SSHSDP_CHECK(mpi != nullptr, ConfigError, "comm_path=direct: {} is not an MPI group",
                 c->name());
    c.release();
    auto d = DirectCommunicator::Create(std::unique_ptr<MpiCommunicator>(mpi));
    DirectCommunicator* raw = d.get();
    c = std::move(d);
    return raw;
  };
  DirectCommunicator* z3 = to_direct(rt_zero3_);
  DirectCommunicator* z2 = to_direct(rt_zero2_);
  const int n = static_cast<int>(groups_.size());
  size_t max_padded = 0, max_z2 = 0;
  for (const auto& g : groups_) {
    max_padded = std::max(max_padded, g->padded);
    max_z2 = std::max(max_z2, g->z2.size());
  }
  if (!skip_gather_) {
    gather_slots_ = std::make_unique<RegisteredSlots>(
        *z3, "zero3.gather", max_padded * DTypeSize(cfg_.weight_dtype),
        cfg_.reshard_after_forward ? std::min(2, n) : n);
  }
  if (!skip_rs_) {
    grad_slots_ =
        std::make_unique<RegisteredSlots>(*z2, "zero2.grad", max_padded * 4, std::min(2, n));
    z2->ReserveReduceScatter(max_z2);  // fp32 partials: room for bf16 ones too
  }
  memory_.Allocate("registered", z3->registered_bytes() + z2->registered_bytes());
}

Engine::~Engine() {
  // During exception unwinding on this rank the peers may never join what the comm thread
  // runs: no unbounded drain then (CommThread's destructor waits a short grace and abandons
  // the task), so the error reaches RunMpiMain's abort promptly.
  if (comm_thread_ && std::uncaught_exceptions() == uncaught_at_construction_) {
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
  {
    EngineLayout E = BuildEngineLayout(cfg_.shard_layout, gi, model_.GroupParams(gi),
                                       cfg_.weight_dtype, topo_.sw(), topo_.so());
    g->layout = std::move(E.layout);
    g->pieces = std::move(E.pieces);
    g->uncovered = std::move(E.uncovered);
    g->contiguous = std::move(E.contiguous);
    g->part_offset.assign(g->layout.update.size(), 0);
    for (const RuntimeParam& rp : g->layout.runtime) {
      size_t off = 0;
      for (int i = rp.first_member; i < rp.first_member + rp.num_members; ++i) {
        g->part_offset[i] = off;
        off += NumElements(g->layout.update[i].shape);
      }
    }
  }
  g->chain = std::make_unique<ShardChain>(g->layout.list, topo_, rank_);
  g->z3 = g->chain->LocalRange(Shard::kZero3);
  g->z2 = g->chain->LocalRange(Shard::kZero2);
  g->z1 = g->chain->LocalRange(Shard::kZero1);
  g->padded = g->layout.list.padded_numel();
  g->wdt = cfg_.weight_dtype;
  if (g->wdt == DType::kE4M3 && !model_.GroupConsumesMx(gi)) g->wdt = DType::kBF16;
  g->sdt = cfg_.redundancies.cast_every_gather ? DType::kF32 : g->wdt;
  const size_t ws = DTypeSize(g->sdt);
  const std::string p = "group" + std::to_string(gi);

  g->w_z3 = Buffer(p + ".w_z3", g->z3.size() * ws, &memory_, "weights");
  if (g->sdt == DType::kF32) {
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

  if (cfg_.shard_layout == ShardLayout::kFlat) {
    g->w_full = FullViews(p + ".w_full", g->layout, g->wdt);
    g->g_full = FullViews(p + ".g_full", g->layout, grad_dtype_);
  } else {  // runtime parameters are not views of the buffer: bare roots
    g->w_full = std::make_unique<DataNode>(p + ".w_full", g->padded * DTypeSize(cfg_.weight_dtype));
    g->w_full->Finalize();
    g->g_full = std::make_unique<DataNode>(p + ".g_full", g->padded * 4);
    g->g_full->Finalize();
  }
  if (skip_gather_) g->w_full->AttachExternal(g->w_z3->data(), g->w_z3->bytes());
  if (skip_rs_) g->g_full->AttachExternal(g->g_z2->data(), g->g_z2->bytes());
  groups_.push_back(std::move(g));
}

void* Engine::Acquire(size_t bytes) {
  // Best fit: the smallest free block that holds `bytes` (blocks of the largest layer serve
  // every smaller one, so the pool holds as many blocks as are live at once, not one per size).
  auto it = free_blocks_.lower_bound(bytes);
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

void Engine::Recycle(void* p, size_t /*bytes*/) {
  for (const auto& [q, capacity] : all_blocks_) {
    if (q == p) {
      free_blocks_.emplace(capacity, p);
      return;
    }
  }
  throw Error("Engine::Recycle: block was not acquired from the pool");
}

void Engine::StartGather(int gi) {
  RuntimeGroup& g = *groups_[gi];
  if (skip_gather_ || g.gather_started) return;
  const size_t bytes = g.padded * DTypeSize(g.wdt);
  g.gather_block = gather_slots_ ? gather_slots_->Acquire() : Acquire(bytes);
  g.w_full->AttachExternal(g.gather_block, bytes);
  g.gather_started = true;
  counters_.gathers++;
  const void* src = g.w_z3->data();
  void* dst = g.gather_block;
  const size_t count = g.z3.size();
  const DType dt = g.wdt;
  Communicator* comm = rt_zero3_.get();
  if (dt == DType::kE4M3 && g.sdt == DType::kF32) {
    // ② with MXFP8 (quantize on demand, FSDP2 / veScale style): gather the fp32 ZeRO-3 shards;
    // WaitGather quantizes the whole layer and relays its scales out, on every gather.
    g.f32_block = Acquire(g.padded * 4);
    void* f32 = g.f32_block;
    g.gather_handle = comm_thread_->Submit([=] { comm->AllGather(src, f32, count, DType::kF32); });
    return;
  }
  if (g.sdt == dt && !cfg_.redundancies.weight_copies) {
    g.gather_handle = comm_thread_->Submit([=] { comm->AllGather(src, dst, count, dt); });
    return;
  }
  // Baselines: this rank's slice of the gather buffer is written first (② cast, ③ copy-in),
  // then gathered in place — on the communication thread, which stands for the side stream
  // FSDP2 runs its all-gather copy-in on (redundancy.h), so a prefetched layer's cast and
  // copy-in overlap the current layer's compute. Counted here, deterministically.
  const size_t es = DTypeSize(dt);
  char* slice = static_cast<char*>(dst) + topo_.GroupPosition(Group::kZero3, rank_) * count * es;
  const bool cast = g.sdt != dt;  // ②: fp32 ZeRO-3 shard cast on every gather
  void* tmp = nullptr;
  if (cast) {
    counters_.weight_preps++;
    if (cfg_.redundancies.weight_copies) tmp = g.cast_tmp = Acquire(count * es);
  }
  if (!cast || tmp) copy_meter_.Count(count * es, &CopyBytes::weight_copy_in);  // ③ copy-in
  g.gather_handle = comm_thread_->Submit([=] {
    if (cast)
      FloatToBf16(static_cast<const float*>(src), static_cast<bf16*>(tmp ? tmp : slice), count);
    if (tmp || !cast) std::memcpy(slice, tmp ? tmp : src, count * es);
    comm->AllGatherInPlace(dst, count, dt);
  });
}

void Engine::WaitGather(int gi) {
  RuntimeGroup& g = *groups_[gi];
  if (skip_gather_) return;
  StartGather(gi);
  {
    ScopedTimer t(&time_.comm_wait);
    g.gather_handle.Wait();
  }
  if (g.cast_tmp) {
    Recycle(g.cast_tmp, g.z3.size() * DTypeSize(g.wdt));
    g.cast_tmp = nullptr;
  }
  if (g.f32_block) {  // ② with MXFP8: G and Tw on the gathered layer, every gather
    {
      ScopedTimer t(&time_.cast);
      mx_->QuantizeFull(gi, static_cast<const float*>(g.f32_block),
                        static_cast<uint8_t*>(g.gather_block));
      mx_->Relayout(gi);
    }
    counters_.weight_preps++;
    counters_.scale_relayouts++;
    Recycle(g.f32_block, g.padded * 4);
    g.f32_block = nullptr;
  }
}

void Engine::ReleaseGather(int gi) {
  RuntimeGroup& g = *groups_[gi];
  ReleaseRuntimeWeights(gi);
  if (skip_gather_ || !g.gather_started) return;
  g.gather_handle.Wait();
  if (g.cast_tmp) {  // a prefetched gather released before use
    Recycle(g.cast_tmp, g.z3.size() * DTypeSize(g.wdt));
    g.cast_tmp = nullptr;
  }
  g.w_full->Release();
  if (gather_slots_) {
    gather_slots_->Release(g.gather_block);
  } else {
    Recycle(g.gather_block, g.padded * DTypeSize(g.wdt));
  }
  g.gather_block = nullptr;
  g.gather_started = false;
}

void Engine::PrepareAndGatherWeights() {
  if (mx_) PrepareMx();
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    const size_t z1_off = g.z1.begin - g.z3.begin;
    if (g.sdt == DType::kBF16) {
      // G: cast the ZeRO-1 main weights straight into the ZeRO-1 slice of Wᶻ³.
      ScopedTimer t(&time_.cast);
      FloatToBf16(g.main_z1, g.w_z3->data_as<bf16>() + z1_off, g.z1.size());
      counters_.weight_preps++;
    }
    // Outer all-gather, in place: this rank's slice already sits at its group position.
    if (up_replica_ag_->size() > 1) {
      SSHSDP_CHECK(z1_off == static_cast<size_t>(up_replica_ag_->rank()) * g.z1.size(), LayoutError,
                   "group {}: ZeRO-1 slice at offset {} does not match replica all-gather "
                   "position {}",
                   g.layout.group, z1_off, up_replica_ag_->rank());
      ScopedTimer t(&time_.comm_wait);
      up_replica_ag_->AllGatherInPlace(g.w_z3->data(), g.z1.size(), g.sdt);
    }
    if (g.sdt == DType::kE4M3) {
      // S follows W: outer all-gather of its ZeRO-1 slice into Sᶻ³, then the ZeRO-3
      // all-gather into the full S (on the communication thread, which owns the ZeRO-3
      // communicator), and Tw relays it out into S′ — once per optimizer step (weight reuse).
      const int gi = g.layout.group;
      ScopedTimer t(&time_.comm_wait);
      if (up_replica_ag_->size() > 1)
        up_replica_ag_->AllGatherInPlace(mx_->s_z3(gi), mx_->s_z1_count(gi), DType::kUE8M0);
      Communicator* z3 = rt_zero3_.get();
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
    mx_->Quantize(mains, codes);
  }
  for (auto& gp : groups_)
    if (gp->sdt == DType::kE4M3) counters_.weight_preps++;
  counters_.mx_split_bands = mx_->last_stats().split_bands;
  counters_.mx_p2p_bytes = mx_->last_stats().bytes_sent;
}

std::vector<TensorRef> Engine::WeightViews(int gi) {
  RuntimeGroup& g = *groups_[gi];
  std::vector<TensorRef> v = g.Views(*g.w_full, g.wdt);
  if (g.wdt == DType::kE4M3)
    for (size_t r = 0; r < v.size(); ++r) {
      v[r].scales = mx_->scales(gi, static_cast<int>(r));
      v[r].scale_layout = cfg_.scale_layout;
    }
  return v;
}

bool Engine::StateIsFinite() {
  // Σx² in double of finite floats cannot overflow, so it is finite exactly when every
  // element is.
  float bad = 0;
  for (auto& gp : groups_) {
    const RuntimeGroup& g = *gp;
    for (const float* p : {g.main_z1, g.m, g.v}) {
      if (p == nullptr) continue;
      for (const Fragment& f : g.chain->Fragments(Shard::kZero1)) {
        if (!std::isfinite(kernels::SumSquares(p + f.shard_offset, static_cast<int64_t>(f.length))))
          bad = 1;
      }
    }
  }
  world_.AllReduce(&bad, 1, DType::kF32);
  return bad == 0;
}

void Engine::InitWeights(uint64_t seed) {
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    std::memset(g.main_z1, 0, g.z1.size() * 4);
    for (const Fragment& f : g.chain->Fragments(Shard::kZero1)) {
      const FragmentSpan s = SpanOf(g.pieces, f);
      if (s.length == 0) continue;  // dim-0 padding stays zero
      const UpdateParam& u = g.layout.update[s.update];
      UpdatePart part{u.name, u.shape, 0, u.kind, u.init};
      FillInit(part, seed, static_cast<int64_t>(s.begin), static_cast<int64_t>(s.length),
               g.main_z1 + s.shard_offset);
    }
    std::memset(g.m, 0, g.z1.size() * 8);
  }
  step_ = 0;
  PrepareAndGatherWeights();
}

void Engine::SetModelBatch(const int32_t* tokens, const int32_t* targets) {
  model_.SetBatch(tokens, targets, cfg_.batch_size, cfg_.seq_len);
  if (activation_bytes_ != static_cast<uint64_t>(model_.ActivationBytes())) {
    // The model owns its activation arena; account it with the rest of the rank's memory.
    memory_.Free("activations", activation_bytes_);
    activation_bytes_ = static_cast<uint64_t>(model_.ActivationBytes());
    memory_.Allocate("activations", activation_bytes_);
  }
}

void Engine::ForwardPass(bool release_all) {
  // Forward, layer by layer, prefetching the next layer's weights. Training keeps the last
  // layer (backward starts there) and, without reshard_after_forward, every layer.
  const int n = static_cast<int>(groups_.size());
  for (int g = 0; g < n; ++g) {
    StartGather(g);
    if (cfg_.prefetch && g + 1 < n) StartGather(g + 1);
    WaitGather(g);
    std::vector<TensorRef> w = views_direct_ ? WeightViews(g) : RuntimeWeights(g);
    {
      ScopedTimer t(&time_.compute);
      model_.Forward(g, w);
    }
    if (release_all || (cfg_.reshard_after_forward && g + 1 < n)) ReleaseGather(g);
  }
}

double Engine::Evaluate(const BatchFn& batch, int batches) {
  SSHSDP_CHECK(batches >= 1, ConfigError, "Evaluate: need at least one batch per rank, got {}",
               batches);
  SSHSDP_CHECK(cfg_.seq_len > 0, ConfigError,
               "sequence length must be set (EngineConfig::seq_len)");
  std::vector<int32_t> tokens(static_cast<size_t>(cfg_.batch_size) * cfg_.seq_len),
      targets(tokens.size());
  double loss_sum = 0;
  for (int i = 0; i < batches; ++i) {
    batch(i, tokens.data(), targets.data());
    SetModelBatch(tokens.data(), targets.data());
    ForwardPass(/*release_all=*/true);  // no backward follows: the last layer is released too
    loss_sum += model_.Loss();
  }
  float red = static_cast<float>(loss_sum);  // as Step's loss: an fp32 sum over ranks
  world_.AllReduce(&red, 1, DType::kF32);
  return red / (static_cast<double>(batches) * world_.size());
}

StepStats Engine::Step(const BatchFn& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = static_cast<int>(groups_.size());
  const int M = cfg_.microbatches;
  const int B = cfg_.batch_size;
  const int T = cfg_.seq_len;
  SSHSDP_CHECK(T > 0, ConfigError, "sequence length must be set (EngineConfig::seq_len)");
  counters_ = {};
  copy_meter_.Reset();
  time_ = {};
  const CommCounters rt0 = rt_zero3_->counters(), rt1 = rt_zero2_->counters();
  CommCounters up0;
  for (Communicator* c :
       {up_replica_rs_.get(), up_replica_ag_.get(), up_hsdp_.get(), up_p2p_.get(), &world_})
    up0 += c->counters();
  if (up_zero1_) up0 += up_zero1_->counters();

  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  double loss_sum = 0;
  for (int mb = 0; mb < M; ++mb) {
    batch(mb, tokens.data(), targets.data());
    SetModelBatch(tokens.data(), targets.data());
    ForwardPass(/*release_all=*/false);
    loss_sum += model_.Loss();
    // Backward in reverse; gradients go straight into G′ views, then reduce-scatter.
    for (int g = n - 1; g >= 0; --g) {
      RuntimeGroup& G = *groups_[g];
      StartGather(g);
      if (cfg_.prefetch && g > 0) StartGather(g - 1);
      WaitGather(g);
      GradWrite mode = GradWrite::kOverwrite;
      if (skip_rs_) {
        if (mb > 0) {
          mode = GradWrite::kAccumulate;  // G′ is G′ᶻ²: accumulate in backward
          counters_.fused_accumulations++;
        }
      } else {
        const size_t gs = DTypeSize(grad_dtype_);
        const size_t bytes = G.padded * gs;
        G.grad_block = grad_slots_ ? grad_slots_->Acquire() : Acquire(bytes);
        G.g_full->AttachExternal(G.grad_block, bytes);
        if (grads_direct_) {
          const size_t used = G.layout.list.numel();
          std::memset(static_cast<char*>(G.grad_block) + used * gs, 0, (G.padded - used) * gs);
        }
      }
      std::vector<TensorRef> w = views_direct_ ? WeightViews(g) : RuntimeWeights(g);
      std::vector<TensorRef> grads =
          grads_direct_ ? G.Views(*G.g_full, grad_dtype_) : GradTargets(g);
      {
        ScopedTimer t(&time_.compute);
        model_.Backward(g, w, grads, mode);
      }
      if (!skip_rs_) {
        std::function<void()> copy_in;  // ④ on the communication thread (redundancy.h)
        if (!grads_direct_) copy_in = FinishGrads(g);
        G.g_full->Release();
        const void* src = G.grad_block;
        void* dst = G.g_z2->data();
        const size_t count = G.z2.size();
        bool acc = mb > 0;
        float* add_into = nullptr;
        if (acc && cfg_.redundancies.separate_add) {  // ⑤: reduce into a temporary, then add
          G.rs_tmp = Acquire(count * 4);
          add_into = G.g_z2->data_as<float>();
          dst = G.rs_tmp;
          acc = false;
          counters_.add_passes++;
        } else if (acc) {
          counters_.fused_accumulations++;
        }
        Communicator* comm = rt_zero2_.get();
        const DType gdt = grad_dtype_;
        ReduceScatterOptions ro;
        if (cfg_.reduce == ReduceMode::kBf16Sr) {
          // bf16sr: bf16 partials with stochastic rounding, keyed by (seed, step, stream).
          ro.partial_dtype = DType::kBF16;
          ro.sr_key = {cfg_.sr_seed, static_cast<uint64_t>(step_),
                       static_cast<uint32_t>(mb * n + g)};
        }
        // The baselines' gradient side work runs where their frameworks put it: ④ copy-in
        // before and ⑤'s add after the reduce-scatter, on its (side-stream) thread.
        G.rs_handle = comm_thread_->Submit([=, copy_in = std::move(copy_in)] {
          if (copy_in) copy_in();
          comm->ReduceScatterPartials(src, gdt, dst, DType::kF32, count, acc, ro);
          if (add_into)
            kernels::Add(add_into, static_cast<const float*>(dst), add_into,
                         static_cast<int64_t>(count));
        });
      }
      ReleaseGather(g);
      if (g + 1 < n && groups_[g + 1]->grad_block) FinishReduceScatter(g + 1);
    }
    for (int g = 0; g < n; ++g)
      if (groups_[g]->grad_block) FinishReduceScatter(g);
  }
  {
    ScopedTimer t(&time_.comm_wait);
    comm_thread_->Drain();
  }

  // Update phase: outer reduce-scatter, HSDP all-reduce, norm, structured update (F), G,
  // outer all-gather.
  const bool count_norm = topo_.Coord(rank_).d == 0;
  double sumsq = 0;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    {
      ScopedTimer t(&time_.comm_wait);
      if (up_replica_rs_->size() > 1)
        up_replica_rs_->ReduceScatter(g.g_z2->data(), DType::kF32, g.g_z1, DType::kF32, g.z1.size(),
                                      false);
      if (up_hsdp_->size() > 1) up_hsdp_->AllReduce(g.g_z1, g.z1.size(), DType::kF32);
    }
    ScopedTimer t(&time_.optimizer);
    if (count_norm)
      for (const Fragment& f : g.chain->Fragments(Shard::kZero1))
        sumsq += kernels::SumSquares(g.g_z1 + f.shard_offset, static_cast<int64_t>(f.length));
  }
  float red[2] = {static_cast<float>(loss_sum), static_cast<float>(sumsq)};
  {
    ScopedTimer t(&time_.comm_wait);
    world_.AllReduce(red, 2, DType::kF32);
  }
  const double norm_scale = 1.0 / (static_cast<double>(M) * world_.size());
  const double grad_norm = std::sqrt(static_cast<double>(red[1])) * norm_scale;
  const double mean_loss = red[0] / (static_cast<double>(M) * world_.size());
  if (!std::isfinite(mean_loss) || !std::isfinite(grad_norm)) {
    // Every rank holds the same all-reduced values, so every rank takes this branch.
    SSHSDP_CHECK(cfg_.on_nonfinite == NonFinitePolicy::kSkip, NonFiniteError,
                 "step {}: non-finite loss or gradient norm (loss {}, gradient norm {}); the "
                 "update was not applied and nothing was saved (lower --lr, set --clip, or "
                 "--on-nonfinite skip)",
                 step_ + 1, mean_loss, grad_norm);
    StepStats st;
    st.step = step_;
    st.loss = mean_loss;
    st.grad_norm = grad_norm;
    st.skipped = true;
    st.tokens = static_cast<int64_t>(M) * B * T * world_.size();
    st.counters = counters_;
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  }
  double clip = 1.0;
  if (cfg_.clip_norm > 0 && grad_norm > cfg_.clip_norm) clip = cfg_.clip_norm / (grad_norm + 1e-6);
  const float grad_scale = static_cast<float>(clip * norm_scale);

  ++step_;
  {
    // F on the ZeRO-1 fragments: AdamW, then Muon (its split units point to point).
    ScopedTimer t(&time_.optimizer);
    std::vector<Zero1State> state;
    for (auto& gp : groups_) {
      RuntimeGroup& g = *gp;
      state.push_back({g.z1, {{"main", g.main_z1}, {"grad", g.g_z1}, {"m", g.m}, {"v", g.v}}});
    }
    ScalarState scalars;
    scalars.Set("grad_scale", grad_scale);
    scalars.Set("step", static_cast<double>(step_));
    scalars.Set("adamw.lr", cfg_.adamw.lr);
    scalars.Set("muon.lr", cfg_.muon.lr);
    const CommCounters p2p0 = up_p2p_->counters();
    const CommCounters z10 = up_zero1_ ? up_zero1_->counters() : CommCounters{};
    update_->Run(state, scalars);
    counters_.update_p2p = Delta(up_p2p_->counters(), p2p0);
    if (up_zero1_) counters_.update_full_tensor = Delta(up_zero1_->counters(), z10);
    counters_.update_exec_cost = update_->last_run().exec_cost;
  }
  PrepareAndGatherWeights();

  StepStats st;
  st.step = step_;
  st.loss = mean_loss;
  st.grad_norm = grad_norm;
  st.tokens = static_cast<int64_t>(M) * B * T * world_.size();
  st.counters = counters_;
  st.counters.copies = copy_meter_.bytes();
  st.counters.copies.update_copy = update_->last_run().bytes_copied;  // ⑥ reassembly
  st.counters.bytes_copied = st.counters.copies.total();
  st.counters.runtime_comm = Delta(rt_zero3_->counters(), rt0);
  st.counters.runtime_comm += Delta(rt_zero2_->counters(), rt1);
  CommCounters up1;
  for (Communicator* c :
       {up_replica_rs_.get(), up_replica_ag_.get(), up_hsdp_.get(), up_p2p_.get(), &world_})
    up1 += c->counters();
  if (up_zero1_) up1 += up_zero1_->counters();
  st.counters.update_comm = Delta(up1, up0);
  st.counters.collective_copy_bytes =
      st.counters.runtime_comm.local_copy_bytes + st.counters.update_comm.local_copy_bytes;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  time_.copy = copy_meter_.seconds();
  st.time = time_;
  st.time.other = std::max(0.0, st.seconds - (time_.compute + time_.comm_wait + time_.copy +
                                              time_.cast + time_.add + time_.optimizer));
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
    world_.AllGather(g.w_z3->data_as<uint8_t>() + (g.z1.begin - g.z3.begin), all.data(), c,
                     DType::kE4M3);
    for (int j = 0; j < topo_.so(); ++j)
      std::memcpy(full.data() + j * c, all.data() + topo_.Zero1ChunkOwner(j, 0) * c, c);
    for (size_t r = 0; r < g.layout.runtime.size(); ++r) {
      const RuntimeParam& rp = g.layout.runtime[r];
      MxRuntimeWeight& w = out[rp.name];
      w.codes.assign(full.begin() + rp.offset, full.begin() + rp.offset + rp.numel);
      const uint8_t* s = mx_->scales(gi, static_cast<int>(r));
      w.scales.assign(s, s + mx_->scales_bytes(gi, static_cast<int>(r)));
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
      const FragmentSpan s = SpanOf(g.pieces, f);
      if (s.length == 0) continue;  // dim-0 padding
      const std::vector<float>& src = weights.at(g.layout.update[s.update].name);
      std::memcpy(g.main_z1 + s.shard_offset, src.data() + s.begin, s.length * 4);
    }
    std::memset(g.m, 0, g.z1.size() * 8);
  }
  step_ = 0;
  PrepareAndGatherWeights();
}

std::vector<TensorRef> Engine::RuntimeWeights(int gi) {
  RuntimeGroup& g = *groups_[gi];
  if (!g.rt_views.empty()) return g.rt_views;  // already built for this gather
  const Redundancies& R = cfg_.redundancies;
  const GroupLayout& L = g.layout;
  const DType dt = cfg_.weight_dtype;
  const size_t es = DTypeSize(dt);
  const char* base = static_cast<const char*>(g.w_full->data());
  constexpr size_t kNone = static_cast<size_t>(-1);
  // Element offsets in the transient block: ③ copy-out targets (per update parameter, or
  // straight into the runtime tensor when it needs no packing) and ① packed tensors.
  std::vector<size_t> upd(L.update.size(), kNone), rt(L.runtime.size(), kNone);
  std::vector<bool> pack(L.runtime.size(), false);
  size_t elems = 0;
  for (size_t r = 0; r < L.runtime.size(); ++r) {
    const RuntimeParam& rp = L.runtime[r];
    pack[r] = rp.num_members > 1 && (R.tw_every_use || (!R.weight_copies && !g.contiguous[r]));
    if (R.weight_copies) {
      if (!pack[r]) rt[r] = elems;
      for (int u = rp.first_member; u < rp.first_member + rp.num_members; ++u)
        upd[u] = pack[r] ? elems + g.part_offset[u] : elems + g.part_offset[u];
      elems += rp.numel;
    }
    if (pack[r]) {
      rt[r] = elems;
      elems += rp.numel;
    }
  }
  g.rt_bytes = elems * es;
  g.rt_block = elems > 0 ? Acquire(g.rt_bytes) : nullptr;
  char* blk = static_cast<char*>(g.rt_block);
  if (R.weight_copies) {  // ③ copy-out: gathered (rank-interleaved) buffer → tensors
    for (size_t m = 0; m < L.list.num_members(); ++m) {
      const MemberPiece& pc = g.pieces[m];
      copy_meter_.Copy(blk + (upd[pc.update] + pc.offset) * es, base + L.list.member(m).offset * es,
                       pc.valid * es, &CopyBytes::weight_copy_out);
    }
  }
  for (size_t r = 0; r < L.runtime.size(); ++r) {  // ① Tw: torch.cat of the parts
    if (!pack[r]) continue;
    const RuntimeParam& rp = L.runtime[r];
    for (int u = rp.first_member; u < rp.first_member + rp.num_members; ++u) {
      const char* src = R.weight_copies ? blk + upd[u] * es : base + L.list.member(u).offset * es;
      copy_meter_.Copy(blk + (rt[r] + g.part_offset[u]) * es, src,
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

void Engine::ReleaseRuntimeWeights(int gi) {
  RuntimeGroup& g = *groups_[gi];
  g.rt_views.clear();
  if (g.rt_block) Recycle(g.rt_block, g.rt_bytes);
  g.rt_block = nullptr;
}

std::vector<TensorRef> Engine::GradTargets(int gi) {
  RuntimeGroup& g = *groups_[gi];
  const GroupLayout& L = g.layout;
  constexpr size_t kNone = static_cast<size_t>(-1);
  g.pg_offsets.assign(L.runtime.size(), kNone);
  size_t elems = 0;
  for (size_t r = 0; r < L.runtime.size(); ++r) {
    if (cfg_.redundancies.grad_copies || !g.contiguous[r]) {
      g.pg_offsets[r] = elems;
      elems += L.runtime[r].numel;
    }
  }
  g.pg_bytes = elems * 4;
  g.pg_block = elems > 0 ? Acquire(g.pg_bytes) : nullptr;
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

std::function<void()> Engine::FinishGrads(int gi) {
  RuntimeGroup& g = *groups_[gi];
  const GroupLayout& L = g.layout;
  float* gp = static_cast<float*>(g.grad_block);
  const float* pg = static_cast<const float*>(g.pg_block);
  constexpr size_t kNone = static_cast<size_t>(-1);
  if (cfg_.redundancies.grad_copies) {
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
      copy_meter_.Count(pc.valid * 4, &CopyBytes::grad_copy);
    }
    return [gp, pg, pieces = std::move(pieces), uncovered = g.uncovered] {
      for (const auto& [a, b] : uncovered) std::fill(gp + a, gp + b, 0.0f);  // padding, gaps
      for (const Piece& p : pieces) std::memcpy(gp + p.dst, pg + p.src, p.n * 4);
    };
  }
  for (const auto& [a, b] : g.uncovered) std::fill(gp + a, gp + b, 0.0f);  // padding, gaps
  {
    // Packed gradients of runtime parameters whose parts are not contiguous → member views.
    for (size_t r = 0; r < L.runtime.size(); ++r) {
      if (g.pg_offsets[r] == kNone) continue;
      const RuntimeParam& rp = L.runtime[r];
      for (int u = rp.first_member; u < rp.first_member + rp.num_members; ++u)
        copy_meter_.Copy(gp + L.list.member(u).offset, pg + g.pg_offsets[r] + g.part_offset[u],
                         NumElements(L.update[u].shape) * 4, &CopyBytes::grad_unpack);
    }
  }
  if (g.pg_block) Recycle(g.pg_block, g.pg_bytes);
  g.pg_block = nullptr;
  return {};
}

void Engine::FinishReduceScatter(int gi) {
  RuntimeGroup& P = *groups_[gi];
  {
    ScopedTimer t(&time_.comm_wait);
    P.rs_handle.Wait();
  }
  if (grad_slots_) {
    grad_slots_->Release(P.grad_block);
  } else {
    Recycle(P.grad_block, P.padded * 4);
  }
  P.grad_block = nullptr;
  if (P.pg_block) {  // ④'s per-parameter gradients, copied in by the communication thread
    Recycle(P.pg_block, P.pg_bytes);
    P.pg_block = nullptr;
  }
  if (P.rs_tmp) {  // ⑤'s temporary, added by the communication thread
    Recycle(P.rs_tmp, P.z2.size() * 4);
    P.rs_tmp = nullptr;
  }
}

std::vector<Engine::Zero1Field> Engine::Zero1Fields() {
  std::vector<Zero1Field> out;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    const int gi = g.layout.group;
    out.push_back({"main", gi, g.main_z1, g.z1, &g.layout, g.chain.get(), &g.pieces});
    out.push_back({"m", gi, g.m, g.z1, &g.layout, g.chain.get(), &g.pieces});
    out.push_back({"v", gi, g.v, g.z1, &g.layout, g.chain.get(), &g.pieces});
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
  size_t ws = 0;
  for (const auto& g : groups_) ws = std::max(ws, DTypeSize(g->wdt));
  size_t max_full = 0;
  for (const auto& g : groups_) {
    a["weights"] += std::max<size_t>(g->z3.size() * DTypeSize(g->sdt), 64);
    if (g->sdt != DType::kF32) a["main_weights"] += std::max<size_t>(g->z1.size() * 4, 64);
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
  // Update-scoped temporaries (Muon's u and v: whole units executed here, local fragments of
  // the others), allocated for the update phase only.
  a["update_temporaries(max)"] = update_->temporary_bytes();
  return a;
}

}  // namespace sshsdp
