// Engine construction: topology, per-group buffers and shard chains, communicators, the
// structured-update plan and the data path (see engine.h). The step's schedule is in
// engine_step.cc, the persistent state's initialization, G and consolidation in
// engine_state.cc, the data paths in data_path.cc / redundancy_path.cc.
#include "sshsdp/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/direct_communicator.h"
#include "sshsdp/device/nccl_communicator.h"
#include "sshsdp/device/staged_communicator.h"
#include "sshsdp/engine/engine_internal.h"
#include "sshsdp/engine/mx_weights.h"

namespace sshsdp {
namespace {

std::unique_ptr<DataNode> FullViews(const std::string& name, const GroupLayout& L, DType dt) {
  auto root = std::make_unique<DataNode>(name, L.list.padded_numel() * DTypeSize(dt));
  for (const RuntimeParam& rp : L.runtime)
    root->AddChild(rp.name, dt, rp.shape, rp.offset * DTypeSize(dt));
  root->Finalize();
  return root;
}

}  // namespace

std::unique_ptr<DataNode> Engine::Buffer(const std::string& name, size_t bytes,
                                         const std::string& category) {
  auto root = std::make_unique<DataNode>(name, BufferBytes(bytes));
  root->Finalize();
  const size_t alloc = (root->bytes() + 63) / 64 * 64;  // zeroed, freed with the engine
  void* p = cfg_.backend->Alloc(alloc);
  backend_blocks_.blocks.push_back(p);
  cfg_.backend->Zero(p, alloc);
  root->AttachExternal(p, root->bytes());
  memory_.Allocate(category, root->bytes());
  return root;
}

void CheckBackendSetup(const EngineConfig& cfg, const Topology& topo) {
  SSHSDP_CHECK(
      cfg.comm_path != CommPath::kNccl || (cfg.backend && !cfg.backend->host_memory()), ConfigError,
      "--comm-path nccl moves device buffers: it needs the engine on a GPU (--backend "
      "cuda; EngineConfig::backend with comm_path=nccl), got {}; on the CPU use "
      "--comm-path collective or direct",
      "backend " + (cfg.backend ? cfg.backend->name() : std::string("cpu")) + " (host memory)");
  if (!cfg.backend || cfg.backend->host_memory()) return;  // host memory: every feature
  const std::string b = cfg.backend->name();
  const Redundancies& R = cfg.redundancies;
  // MXFP8: a GPU without an MX GEMM (Hopper) dequantizes each weight for its GEMM, reading
  // one scale per row and 32-column block (Backend::MxDequantizeRows): Tw's row-major layout.
  SSHSDP_CHECK(cfg.weight_dtype != DType::kE4M3 || cfg.scale_layout == ScaleLayout::kRowMajor,
               ConfigError,
               "the engine on backend {} dequantizes MXFP8 weights for its GEMMs from per-row "
               "scales: set the scale layout to row_major (--scale-layout row_major; "
               "EngineConfig::scale_layout = kRowMajor), got {}",
               b, ScaleLayoutName(cfg.scale_layout));
  SSHSDP_CHECK(cfg.reduce == ReduceMode::kFp32, ConfigError,
               "the engine on backend {} reduces fp32 gradients (--reduce fp32), got {}", b,
               ReduceModeName(cfg.reduce));
  SSHSDP_CHECK(cfg.shard_layout == ShardLayout::kFlat && !R.tw_every_use && !R.cast_every_gather &&
                   !R.weight_copies && !R.grad_copies && !R.separate_add &&
                   !R.replicate_optimizer && R.structured_updates != StructuredUpdates::kFullTensor,
               ConfigError,
               "the engine on backend {} runs sshsdp's own data path (flat layout, no baseline "
               "redundancies), got {}",
               b, R.ToString());
  // Host memory (the CPU backend) moves over MPI's paths. A device's: the runtime groups
  // (ZeRO-3 sw, ZeRO-2 sg; every microbatch) over the direct path with its DirectDeviceMemory
  // (one node) or over NCCL; the outer groups over NCCL or staged through host memory
  // (Engine::SetUpOuterGroupsOnDevice), so with sw = sg = 1 any path will do.
  if (topo.sw() == 1 && topo.sg() == 1) return;
  SSHSDP_CHECK(cfg.comm_path == CommPath::kNccl ||
                   (cfg.comm_path == CommPath::kDirect && cfg.direct_device != nullptr),
               ConfigError,
               "the engine on backend {} with {} ranks moves device buffers in its ZeRO-3 / "
               "ZeRO-2 groups ({}) over NCCL (comm_path=nccl) or on the direct path "
               "(comm_path=direct with direct_device, one node)",
               b, topo.world(), topo.ToString());
}

int EffectiveSo(const EngineConfig& c) { return c.redundancies.replicate_optimizer ? c.sg : c.so; }

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

EngineModes CheckEngineSetup(const Model& model, const EngineConfig& cfg, const Topology& topo) {
  ValidateEngineConfig(cfg);
  SSHSDP_CHECK(cfg.weight_dtype == DType::kF32 || cfg.weight_dtype == DType::kBF16 ||
                   cfg.weight_dtype == DType::kE4M3,
               ConfigError, "runtime weight dtype must be fp32, bf16 or mxfp8 (e4m3), got {}",
               DTypeName(cfg.weight_dtype));
  if (cfg.weight_dtype == DType::kE4M3) {
    SSHSDP_CHECK(model.ConsumesMx(), ConfigError,
                 "weight dtype mxfp8: this model does not consume MXFP8 weight views (the MoE "
                 "model does only with its experts in their own runtime groups, on the host "
                 "and on a backend: MoeConfig::expert_group)");
    bool any_mx = false;
    for (int g = 0; g < model.num_groups() && !any_mx; ++g) any_mx = model.GroupConsumesMx(g);
    SSHSDP_CHECK(any_mx, ConfigError,
                 "weight dtype mxfp8: no runtime group of this model consumes MXFP8 weights");
    SSHSDP_CHECK(model.ReadsScaleLayout(cfg.scale_layout), ConfigError,
                 "weight dtype mxfp8: this model dequantizes MXFP8 weights for its GEMMs from "
                 "per-row scales: set the scale layout to row_major (--scale-layout row_major; "
                 "EngineConfig::scale_layout = kRowMajor), got {}",
                 ScaleLayoutName(cfg.scale_layout));
    // (S gathers over MPI groups of its own where W does not: Engine::mx_zero3_.)
    SSHSDP_CHECK(cfg.shard_layout == ShardLayout::kFlat && !cfg.redundancies.weight_copies &&
                     !cfg.redundancies.tw_every_use,
                 ConfigError,
                 "weight dtype mxfp8 runs on the flat shard layout without ③/① copies (of the "
                 "baselines only ② quantize-every-gather), got {}",
                 cfg.redundancies.ToString());
    SSHSDP_CHECK(!cfg.redundancies.cast_every_gather || cfg.comm_path == CommPath::kCollective,
                 ConfigError,
                 "weight dtype mxfp8 with ② quantize-every-gather gathers fp32 shards into "
                 "transient buffers: it runs on the collective comm path, got {}",
                 CommPathName(cfg.comm_path));
  }
  EngineModes m;
  m.grad_dtype = GradDType(cfg.reduce);
  SSHSDP_CHECK(m.grad_dtype == DType::kF32 ||
                   (cfg.shard_layout == ShardLayout::kFlat && !cfg.redundancies.grad_copies),
               ConfigError,
               "reduce mode {} writes bf16 gradients straight into G′: it needs the flat shard "
               "layout without ④ gradient copies",
               ReduceModeName(cfg.reduce));
  SSHSDP_CHECK(cfg.microbatches >= 1, ConfigError, "microbatches must be >= 1, got {}",
               cfg.microbatches);
  SSHSDP_CHECK(cfg.batch_size >= 1, ConfigError, "batch size must be >= 1, got {}", cfg.batch_size);
  SSHSDP_CHECK(model.num_groups() >= 1, ConfigError, "model has no runtime groups");
  const Redundancies& R = cfg.redundancies;
  SSHSDP_CHECK(cfg.shard_layout != ShardLayout::kDim0 || (R.weight_copies && R.grad_copies),
               ConfigError,
               "the dim-0 shard layout interleaves parameters by rank in the gathered buffer: "
               "it needs weight copy-out (③) and gradient copies (④) on, got {}",
               R.ToString());
  m.store_dtype = R.cast_every_gather ? DType::kF32 : cfg.weight_dtype;
  const bool grads_direct = cfg.shard_layout == ShardLayout::kFlat && !R.grad_copies;
  m.skip_gather = topo.sw() == 1 && m.store_dtype == cfg.weight_dtype && !R.weight_copies;
  m.skip_rs = topo.sg() == 1 && grads_direct && !R.separate_add && m.grad_dtype == DType::kF32;
  return m;
}

namespace {

// cfg with its backend: the given one, else `own`.
EngineConfig WithBackend(const EngineConfig& cfg, Backend* own) {
  EngineConfig c = cfg;
  if (c.backend == nullptr) c.backend = own;
  return c;
}

}  // namespace

Engine::Engine(Model& model, Communicator& world, const EngineConfig& cfg)
    : own_backend_(cfg.backend ? nullptr : MakeCpuBackend()),
      model_(model),
      world_(world),
      cfg_(WithBackend(cfg, own_backend_.get())),
      on_device_(!cfg_.backend->host_memory()),
      topo_(world.size(), cfg.ranks_per_node > 0 ? cfg.ranks_per_node : world.size(), cfg.sw,
            cfg.sg, EffectiveSo(cfg)),
      rank_(world.rank()),
      pool_(std::make_unique<TransientPool>(&memory_, *cfg_.backend)) {
  backend_blocks_.backend = cfg_.backend;
  const EngineModes modes = CheckEngineSetup(model, cfg_, topo_);
  CheckBackendSetup(cfg_, topo_);
  cfg_.so = topo_.so();
  grad_dtype_ = modes.grad_dtype;
  store_dtype_ = modes.store_dtype;
  skip_gather_ = modes.skip_gather;
  skip_rs_ = modes.skip_rs;
  tied_ = model.TiesFirstGroup();
  SSHSDP_CHECK(!tied_ || model.num_groups() >= 2, PlanError,
               "a model that ties its first group to its last needs two groups, has {}",
               model.num_groups());
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
  if (cfg_.comm_path == CommPath::kNccl) {
    // The comm thread's ZeRO-3 / ZeRO-2 groups over NCCL on the backend's device (collective
    // over each group; a missing NCCL or shared GPUs fail every member alike). The other groups
    // stay on MPI: they carry host memory (norms, the update's staged exchanges).
    const int rpn = topo_.ranks_per_node();
    rt_zero3_ = NcclCommunicator::Create(std::move(rt_zero3_), cfg_.backend, rpn);
    rt_zero2_ = NcclCommunicator::Create(std::move(rt_zero2_), cfg_.backend, rpn);
  }
  up_replica_rs_ = split(world_, sshsdp::Group::kReplicaRS);
  up_replica_ag_ = split(world_, sshsdp::Group::kReplicaAG);
  up_hsdp_ = split(world_, sshsdp::Group::kHsdp);
  if (cfg_.weight_dtype == DType::kE4M3 &&
      (on_device_ || cfg_.comm_path != CommPath::kCollective)) {
    mx_replica_ag_ = split(world_, sshsdp::Group::kReplicaAG);
    mx_zero3_ = split(world_, sshsdp::Group::kZero3);
  }
  if (on_device_) SetUpOuterGroupsOnDevice();
  comm_thread_ = std::make_unique<CommThread>("runtime");
  up_p2p_ = world_.Duplicate();
  BuildUpdate();
  for (auto& gp : groups_) AllocateState(*gp);
  if (cfg_.weight_dtype == DType::kE4M3)
    mx_ = MakeMxWeights(groups_, topo_, rank_, cfg_.scale_layout, up_p2p_.get(), &memory_,
                        *cfg_.backend);
  DataPathContext ctx;
  ctx.cfg = &cfg_;
  ctx.zero3_position = topo_.GroupPosition(Group::kZero3, rank_);
  ctx.grad_dtype = grad_dtype_;
  ctx.pool = pool_.get();
  ctx.meter = &copy_meter_;
  ctx.counters = &counters_;
  ctx.time = &time_;
  ctx.mx = mx_.get();
  ctx.backend = cfg_.backend;
  path_ = MakeDataPath(ctx);
}

void Engine::BuildUpdate() {
  // Which optimizer and unit every update parameter gets, and the plans (metadata only: every
  // rank computes the same plan of its replica without communicating).
  const UpdateOptions o = UpdateOptionsOf(cfg_);
  if (o.full_tensor && !first_structured_.empty()) {
    // The ZeRO-1 group of this rank's replica, ordered by chunk (collective over the world;
    // the condition is the same on every rank).
    up_zero1_ = world_.Split(topo_.Coord(rank_).d, topo_.ChunkIndex(Shard::kZero1, rank_));
  }
  std::vector<UpdateGroupView> views;
  for (auto& gp : groups_) views.push_back(UpdateViewOf(*gp));
  update_ =
      std::make_unique<StructuredUpdate>(views, o, rank_, *up_p2p_, &memory_, up_zero1_.get());
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t u = 0; u < groups_[g]->layout.update.size(); ++u)
      groups_[g]->layout.update[u].optimizer = update_->optimizers()[g][u];
}

std::map<std::string, Zero1Array> Engine::StateLayout(const GroupLayout& layout,
                                                      const std::vector<MemberPiece>& pieces,
                                                      const std::vector<Fragment>& zero1) {
  // Which state fields each update parameter's optimizer keeps, and for each field the chunk
  // elements that need it: every element (dense) or the runs of its parameters' fragments.
  const std::map<OptimizerKind, std::vector<std::string>> fields_of = {
      {OptimizerKind::kAdamW, OptimizerStateFields(OptimizerKind::kAdamW)},
      {OptimizerKind::kMuon, OptimizerStateFields(OptimizerKind::kMuon)}};
  std::map<std::string, std::vector<PackedRun>> runs;
  std::map<std::string, size_t> params_with;
  for (const UpdateParam& u : layout.update)
    for (const std::string& f : fields_of.at(u.optimizer)) params_with[f]++;
  for (const Fragment& fr : zero1) {
    const OptimizerKind opt = layout.update[pieces[fr.member].update].optimizer;
    for (const std::string& f : fields_of.at(opt)) {
      std::vector<PackedRun>& r = runs[f];
      if (!r.empty() && r.back().end == fr.shard_offset) {
        r.back().end += fr.length;  // adjacent fragments: one run
      } else {
        r.push_back({fr.shard_offset, fr.shard_offset + fr.length, 0});
      }
    }
  }
  std::map<std::string, Zero1Array> out;
  for (auto& [f, n] : params_with) {
    Zero1Array& a = out[f];
    a.packed = n < layout.update.size();
    if (!a.packed) continue;
    a.runs = std::move(runs[f]);
    size_t at = 0;
    for (PackedRun& r : a.runs) {
      r.offset = at;
      at += r.end - r.begin;
    }
  }
  return out;
}

void Engine::AllocateState(RuntimeGroup& g) {
  g.opt_state = StateLayout(g.layout, g.pieces, g.chain->Fragments(Shard::kZero1));
  const size_t elems = StateElements(g.opt_state, g.z1.size());
  g.state =
      Buffer(fmt::format("group{}.optimizer_state", g.layout.group), elems * 4, "optimizer_state");
  size_t at = 0;
  for (auto& [f, a] : g.opt_state) {
    a.data = g.state->data_as<float>() + at;
    at += a.packed ? a.stored() : g.z1.size();
  }
}

void Engine::SetUpOuterGroupsOnDevice() {
  // The outer phase's collectives move backend memory (G′ᶻ² → Gᶻ¹ in the replica group, HSDP's
  // all-reduce of Gᶻ¹, Wᶻ¹ → Wᶻ³): over NCCL with comm_path=nccl, else staged through one
  // host buffer per group over MPI — once per step, not per microbatch. Size-1 groups move
  // nothing and stay as they are (the engine skips them).
  size_t rs_bytes = 0, ag_bytes = 0, ar_bytes = 0;
  const size_t r = static_cast<size_t>(up_replica_rs_->size());
  for (const auto& g : groups_) {
    const size_t c = g->z1.size();
    rs_bytes = std::max(rs_bytes, (r * c * 4 + 63) / 64 * 64 + c * 4);
    ag_bytes = std::max(ag_bytes, up_replica_ag_->size() * c * DTypeSize(g->sdt));
    ar_bytes = std::max(ar_bytes, c * 4);
  }
  const int rpn = topo_.ranks_per_node();
  size_t staging = 0;
  auto wrap = [&](std::unique_ptr<Communicator>& c, size_t bytes) {
    if (c->size() == 1) return;
    if (cfg_.comm_path == CommPath::kNccl) {
      c = NcclCommunicator::Create(std::move(c), cfg_.backend, rpn);
      return;
    }
    auto staged = std::make_unique<StagedCommunicator>(std::move(c), cfg_.backend);
    staged->Reserve(bytes);
    staging += staged->host_bytes();
    staged_.push_back(staged.get());
    c = std::move(staged);
  };
  wrap(up_replica_rs_, rs_bytes);
  wrap(up_replica_ag_, ag_bytes);
  wrap(up_hsdp_, ar_bytes);
  if (staging) memory_.Allocate("staging", staging);
}

uint64_t Engine::StagedBytes() const {
  uint64_t b = 0;
  for (const StagedCommunicator* s : staged_) b += s->staged_bytes();
  return b;
}

void Engine::SetUpDirectPath() {
  // The comm thread's ZeRO-3 / ZeRO-2 groups become direct communicators (their own windows);
  // the buffers their collectives touch are slots of registered roots, as many as the
  // schedule keeps live at once: two gathered layers (this one and the prefetched one) or all
  // of them without reshard_after_forward; two gradient buffers (this layer's and the one
  // whose reduce-scatter is still running); one more of each with tied embeddings (group 0's,
  // held from its forward to its backward and from the head's backward to its own).
  DirectDeviceMemory* direct_device = on_device_ ? cfg_.direct_device : nullptr;
  auto to_direct = [direct_device](std::unique_ptr<Communicator>& c) {
    auto* mpi = dynamic_cast<MpiCommunicator*>(c.get());
    SSHSDP_CHECK(mpi != nullptr, ConfigError, "comm_path=direct: {} is not an MPI group",
                 c->name());
    c.release();
    auto d = DirectCommunicator::Create(std::unique_ptr<MpiCommunicator>(mpi), direct_device);
    DirectCommunicator* raw = d.get();
    c = std::move(d);
    return raw;
  };
  DirectCommunicator* z3 = to_direct(rt_zero3_);
  DirectCommunicator* z2 = to_direct(rt_zero2_);
  const int n = static_cast<int>(groups_.size());
  size_t max_padded = 0, max_z2 = 0, max_gather = 0;
  for (const auto& g : groups_) {
    max_padded = std::max(max_padded, g->padded);
    max_z2 = std::max(max_z2, g->z2.size());
    // Per group's dtype: with MXFP8 blocks (one byte) the embedding and head stay bf16.
    max_gather = std::max(max_gather, g->padded * DTypeSize(g->wdt));
  }
  if (!skip_gather_) {
    gather_slots_ = std::make_unique<RegisteredSlots>(
        *z3, "zero3.gather", max_gather,
        cfg_.reshard_after_forward ? std::min(tied_ ? 3 : 2, n) : n);  // tied: group 0 held
  }
  if (!skip_rs_) {
    grad_slots_ = std::make_unique<RegisteredSlots>(*z2, "zero2.grad", max_padded * 4,
                                                    std::min(tied_ ? 3 : 2, n));
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
}

std::unique_ptr<RuntimeGroup> PlanRuntimeGroup(const Model& model, int gi, const EngineConfig& cfg,
                                               const Topology& topo, int rank) {
  auto g = std::make_unique<RuntimeGroup>();
  EngineLayout E = BuildEngineLayout(cfg.shard_layout, gi, model.GroupParams(gi), cfg.weight_dtype,
                                     topo.sw(), topo.so());
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
  g->chain = std::make_unique<ShardChain>(g->layout.list, topo, rank);
  g->z3 = g->chain->LocalRange(Shard::kZero3);
  g->z2 = g->chain->LocalRange(Shard::kZero2);
  g->z1 = g->chain->LocalRange(Shard::kZero1);
  g->padded = g->layout.list.padded_numel();
  g->wdt = cfg.weight_dtype;
  if (g->wdt == DType::kE4M3 && !model.GroupConsumesMx(gi)) g->wdt = DType::kBF16;
  g->sdt = cfg.redundancies.cast_every_gather ? DType::kF32 : g->wdt;
  return g;
}

GroupBufferSizes BufferSizes(const RuntimeGroup& g, const Topology& topo) {
  GroupBufferSizes b;
  b.w_z3 = g.z3.size() * DTypeSize(g.sdt);
  b.main_is_view = g.sdt == DType::kF32;  // fp32: a view of Wᶻ³'s ZeRO-1 slice
  if (!b.main_is_view) b.main_z1 = g.z1.size() * 4;
  b.g_z2 = g.z2.size() * 4;
  b.g_z1_is_view = topo.so() == topo.sg();  // a view of G′ᶻ²
  if (!b.g_z1_is_view) b.g_z1 = g.z1.size() * 4;
  return b;
}

size_t StateElements(const std::map<std::string, Zero1Array>& fields, size_t z1) {
  size_t elems = 0;
  for (const auto& [f, a] : fields) elems += a.packed ? a.stored() : z1;
  return elems;
}

std::unique_ptr<MxWeights> MakeMxWeights(const std::vector<std::unique_ptr<RuntimeGroup>>& groups,
                                         const Topology& topo, int rank, ScaleLayout scale_layout,
                                         Communicator* p2p, MemoryAccount* memory,
                                         Backend& backend) {
  std::vector<const GroupLayout*> layouts;
  std::vector<const ShardChain*> chains;
  std::vector<bool> mx_groups;
  for (const auto& g : groups) {
    layouts.push_back(&g->layout);
    chains.push_back(g->chain.get());
    mx_groups.push_back(g->wdt == DType::kE4M3);
  }
  return std::make_unique<MxWeights>(layouts, chains, topo, rank, scale_layout, p2p, memory,
                                     mx_groups, backend);
}

UpdateOptions UpdateOptionsOf(const EngineConfig& cfg) {
  UpdateOptions o;
  o.optimizer = cfg.optimizer;
  o.adamw = cfg.adamw;
  o.muon = cfg.muon;
  o.muon_unit = cfg.muon_unit;
  o.overrides = cfg.unit_overrides;
  // ⑥ (Megatron-FSDP's refusal is checked at construction): FSDP2's full_tensor path gathers
  // whole matrices on every rank of the ZeRO-1 group (FullTensorMuon), on any shard layout;
  // sshsdp / veScale move split units point to point.
  o.full_tensor = cfg.redundancies.structured_updates == StructuredUpdates::kFullTensor;
  // AdamW and Muon as the backend's ops; Muon's temporaries (u, v) in its memory, on a device
  // split units' fragments staged through the host for the point-to-point exchange.
  o.backend = cfg.backend;
  return o;
}

UpdateGroupView UpdateViewOf(const RuntimeGroup& g) {
  UpdateGroupView v{&g.layout, g.chain.get(), g.pieces};
  bool identity = g.pieces.size() == g.layout.update.size();
  for (size_t m = 0; m < g.pieces.size(); ++m) {
    const MemberPiece& pc = g.pieces[m];
    identity = identity && pc.update == static_cast<int>(m) && pc.offset == 0 &&
               pc.valid == g.layout.list.member(m).numel;
  }
  if (identity) v.pieces.clear();
  return v;
}

void Engine::BuildGroup(int gi) {
  std::unique_ptr<RuntimeGroup> g = PlanRuntimeGroup(model_, gi, cfg_, topo_, rank_);
  const GroupBufferSizes b = BufferSizes(*g, topo_);
  const std::string p = "group" + std::to_string(gi);

  g->w_z3 = Buffer(p + ".w_z3", b.w_z3, "weights");
  if (b.main_is_view) {
    // Zero copy: fp32 runtime weights ARE the main weights; the ZeRO-1 slice of Wᶻ³ holds them.
    g->main_z1 = g->w_z3->data_as<float>() + (g->z1.begin - g->z3.begin);
  } else {
    g->main_own = Buffer(p + ".main_z1", b.main_z1, "main_weights");
    g->main_z1 = g->main_own->data_as<float>();
  }
  g->g_z2 = Buffer(p + ".g_z2", b.g_z2, "gradients");
  if (b.g_z1_is_view) {
    g->g_z1 = g->g_z2->data_as<float>();  // same shard: a view
  } else {
    g->g_z1_own = Buffer(p + ".g_z1", b.g_z1, "gradients");
    g->g_z1 = g->g_z1_own->data_as<float>();
  }

  if (cfg_.shard_layout == ShardLayout::kFlat) {
    g->w_full = FullViews(p + ".w_full", g->layout, g->wdt);
    g->g_full = FullViews(p + ".g_full", g->layout, grad_dtype_);
  } else {  // runtime parameters are not views of the buffer: bare roots
    g->w_full = std::make_unique<DataNode>(p + ".w_full", g->padded * DTypeSize(g->wdt));
    g->w_full->Finalize();
    g->g_full = std::make_unique<DataNode>(p + ".g_full", g->padded * 4);
    g->g_full->Finalize();
  }
  if (skip_gather_) g->w_full->AttachExternal(g->w_z3->data(), g->w_z3->bytes());
  if (skip_rs_) g->g_full->AttachExternal(g->g_z2->data(), g->g_z2->bytes());
  groups_.push_back(std::move(g));
}

std::vector<UpdateParam> Engine::UpdateParams() const {
  std::vector<UpdateParam> out;
  for (const auto& g : groups_)
    for (const UpdateParam& u : g->layout.update) out.push_back(u);
  return out;
}

}  // namespace sshsdp
