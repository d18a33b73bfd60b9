// RunPlan: every rank's buffers, transient peak, collectives and update plan, from the
// engine's own construction code run per rank without communicators (see plan.h).
#include "sshsdp/engine/plan.h"

#include <algorithm>
#include <memory>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/ring_bytes.h"
#include "sshsdp/engine/engine_internal.h"
#include "sshsdp/engine/mx_weights.h"

namespace sshsdp {
namespace {

void AddSend(CommCounters* c, const Topology& t, int from, int to, uint64_t bytes) {
  if (t.SameNode(from, to)) {
    c->intra_node_bytes += bytes;
  } else {
    c->inter_node_bytes += bytes;
  }
}

// The rank a ring position sends to: its successor in the group.
int RingNext(const Topology& t, Group g, int rank) {
  return t.GroupMember(g, rank, (t.GroupPosition(g, rank) + 1) % t.GroupSize(g));
}

class CollectiveTally {
 public:
  CollectiveTally(const Topology& t, int rank) : t_(t), rank_(rank) {}

  // `calls` ring collectives in group g, each sending `bytes` to the successor.
  PlannedCollective& Ring(const char* name, Group g, const char* group, uint64_t calls,
                          uint64_t bytes, uint64_t local_copy = 0) {
    PlannedCollective& c = Find(name, group, t_.GroupSize(g));
    c.calls += calls;
    AddSend(&c.sent, t_, rank_, RingNext(t_, g, rank_), calls * bytes);
    c.sent.calls += calls;
    c.sent.local_copy_bytes += calls * local_copy;
    return c;
  }
  // One point-to-point message of `bytes` to world rank `to` (`calls` counts messages; the
  // engine's counters count one call per batched exchange, so sent.calls leaves them out).
  void Message(const char* name, int to, uint64_t bytes) {
    PlannedCollective& c = Find(name, "world", t_.world());
    c.calls += 1;
    AddSend(&c.sent, t_, rank_, to, bytes);
  }
  std::vector<PlannedCollective> list;

 private:
  PlannedCollective& Find(const char* name, const char* group, int size) {
    for (PlannedCollective& c : list)
      if (c.name == name) return c;
    list.push_back({name, group, size, 0, {}});
    return list.back();
  }
  const Topology& t_;
  int rank_;
};

// The step's buffer order (engine_step.cc: ForwardPass, BackwardGroup, FinishReduceScatter)
// replayed on a dry pool: how many gathers and reduce-scatters run, and the transient peak.
struct ScheduleReplay {
  std::vector<uint64_t> gathers, reduce_scatters;  // per group
  uint64_t transient_peak = 0;
};

// tied: Model::TiesFirstGroup — group 0's weights held from its forward to its backward, its
// gradient block from the last group's backward to its own.
ScheduleReplay ReplaySchedule(const std::vector<std::unique_ptr<RuntimeGroup>>& groups,
                              const EngineConfig& cfg, const EngineModes& modes, bool tied) {
  MemoryAccount acct;
  ScheduleReplay out;
  {
    TransientPool pool(&acct);  // dry: placeholders only
    const int n = static_cast<int>(groups.size());
    std::vector<void*> gather(n, nullptr), grad(n, nullptr);
    out.gathers.assign(n, 0);
    out.reduce_scatters.assign(n, 0);
    bool first_step = true;  // the counts are one step's
    auto start = [&](int g) {
      if (modes.skip_gather || gather[g]) return;
      gather[g] = pool.Acquire(groups[g]->padded * DTypeSize(groups[g]->wdt));
      if (first_step) out.gathers[g]++;
    };
    auto release = [&](int g) {
      if (!gather[g]) return;
      pool.Recycle(gather[g]);
      gather[g] = nullptr;
    };
    auto finish = [&](int g) {
      pool.Recycle(grad[g]);
      grad[g] = nullptr;
    };
    // Steps until the pool stops growing: the engine's pool keeps its blocks from step to
    // step, and a best fit among all of them may place a later step's requests differently
    // from the first step's (which started empty), needing another block.
    auto step = [&] {
      for (int mb = 0; mb < cfg.microbatches; ++mb) {
        for (int g = 0; g < n; ++g) {
          start(g);
          if (cfg.prefetch && g + 1 < n) start(g + 1);
          if (cfg.reshard_after_forward && g + 1 < n && !(tied && g == 0)) release(g);
        }
        for (int g = n - 1; g >= 0; --g) {
          start(g);
          if (cfg.prefetch && g > 0) start(g - 1);
          auto acquire_grad = [&](int a) {
            grad[a] = pool.Acquire(groups[a]->padded * DTypeSize(modes.grad_dtype));
            if (first_step) out.reduce_scatters[a]++;
          };
          if (!modes.skip_rs && !(tied && g == 0)) acquire_grad(g);
          if (!modes.skip_rs && tied && g == n - 1) acquire_grad(0);  // the head writes it first
          release(g);
          if (g + 1 < n && grad[g + 1]) finish(g + 1);
        }
        for (int g = 0; g < n; ++g)
          if (grad[g]) finish(g);
      }
      for (int g = 0; g < n; ++g) release(g);  // the step ends with every block free
    };
    auto held = [&] {
      const auto it = acct.by_category().find("transient");
      return it == acct.by_category().end() ? uint64_t{0} : it->second.current;
    };
    for (int s = 0; s < 64; ++s) {
      const uint64_t before = held();
      step();
      first_step = false;
      if (s > 0 && held() == before) break;
    }
  }
  const auto it = acct.by_category().find("transient");
  out.transient_peak = it == acct.by_category().end() ? 0 : it->second.peak;
  return out;
}

void CheckScope(const EngineConfig& cfg) {
  SSHSDP_CHECK(cfg.comm_path == CommPath::kCollective, ConfigError,
               "sshsdp plan models the collective comm path; --comm-path {} ({}) is not "
               "planned: drop --comm-path {}",
               CommPathName(cfg.comm_path),
               cfg.comm_path == CommPath::kNccl ? "NCCL on device buffers"
                                                : "registered windows, one-sided transfers",
               CommPathName(cfg.comm_path));
  SSHSDP_CHECK(cfg.shard_layout == ShardLayout::kFlat && cfg.redundancies.ToString() == "none",
               ConfigError,
               "sshsdp plan models sshsdp's own data path; the baselines' redundancies ({}) "
               "copy through buffers the plan does not model: plan the sshsdp preset",
               cfg.redundancies.ToString());
}

}  // namespace

RunPlan PlanRun(const Model& model, int world, const EngineConfig& cfg_in) {
  ValidateEngineConfig(cfg_in);
  CheckScope(cfg_in);
  SSHSDP_CHECK(world >= 1, ConfigError, "world size must be >= 1, got {}", world);
  const Topology topo(world, cfg_in.ranks_per_node > 0 ? cfg_in.ranks_per_node : world, cfg_in.sw,
                      cfg_in.sg, EffectiveSo(cfg_in));
  EngineConfig cfg = cfg_in;
  cfg.so = topo.so();
  // The engine's backend, or the CPU backend it would make (what the update and G run on).
  const std::unique_ptr<Backend> own = cfg.backend ? nullptr : MakeCpuBackend();
  if (!cfg.backend) cfg.backend = own.get();
  const bool on_device = !cfg.backend->host_memory();
  const EngineModes modes = CheckEngineSetup(model, cfg, topo);
  CheckBackendSetup(cfg, topo);  // what the engine on cfg.backend refuses (sshsdp plan --backend)
  RunPlan plan{topo, cfg, {}, {}, {}, {}, 0, 0};
  plan.cfg.backend = cfg_in.backend;  // not `own`, which goes with this call
  const int n = model.num_groups();
  const UpdateOptions uopt = UpdateOptionsOf(cfg);
  // One update plan per (optimizer, replica), not per rank; ranks are numbered replica by
  // replica (Topology::Coord: d = rank / so), so only the current replica's are kept.
  StructuredUpdate::PlanCache update_plans;
  for (int r = 0; r < world; ++r) {
    if (r % topo.so() == 0) update_plans.clear();
    std::vector<std::unique_ptr<RuntimeGroup>> groups;
    for (int g = 0; g < n; ++g) groups.push_back(PlanRuntimeGroup(model, g, cfg, topo, r));
    std::vector<UpdateGroupView> views;
    for (auto& g : groups) views.push_back(UpdateViewOf(*g));
    const StructuredUpdate update(views, uopt, r, &update_plans);
    for (int g = 0; g < n; ++g)
      for (size_t u = 0; u < groups[g]->layout.update.size(); ++u)
        groups[g]->layout.update[u].optimizer = update.optimizers()[g][u];

    RankPlan rp;
    rp.rank = r;
    rp.coord = topo.Coord(r);
    std::map<std::string, uint64_t>& mem = rp.memory;
    for (auto& gp : groups) {
      const RuntimeGroup& g = *gp;
      const GroupBufferSizes b = BufferSizes(g, topo);
      mem["weights"] += BufferBytes(b.w_z3);
      if (!b.main_is_view) mem["main_weights"] += BufferBytes(b.main_z1);
      mem["gradients"] += BufferBytes(b.g_z2);
      if (!b.g_z1_is_view) mem["gradients"] += BufferBytes(b.g_z1);
      const auto state = Engine::StateLayout(g.layout, g.pieces, g.chain->Fragments(Shard::kZero1));
      mem["optimizer_state"] += BufferBytes(StateElements(state, g.z1.size()) * 4);
    }
    std::unique_ptr<MxWeights> mx;
    if (cfg.weight_dtype == DType::kE4M3) {
      mx = MakeMxWeights(groups, topo, r, cfg.scale_layout, /*p2p=*/nullptr, /*memory=*/nullptr,
                         *cfg.backend);
      mem["scales"] = mx->persistent_bytes();
    }
    // On a device the executors keep their roots between steps (update_executor.h): all at
    // once; on host memory each program's roots live only while it runs.
    const uint64_t mx_temps = mx ? mx->temporary_bytes() : 0;
    const uint64_t temps = on_device ? update.temporary_bytes() + mx_temps
                                     : std::max<uint64_t>(update.peak_temporary_bytes(), mx_temps);
    if (temps) mem["update_temporaries"] = temps;
    const ScheduleReplay replay = ReplaySchedule(groups, cfg, modes, model.TiesFirstGroup());
    if (replay.transient_peak) mem["transient"] = replay.transient_peak;
    for (const auto& [cat, bytes] : mem) rp.peak += bytes;

    // Per step: the runtime collectives of the replayed schedule, then the update phase.
    CollectiveTally tally(topo, r);
    for (int g = 0; g < n; ++g) {
      rp.gathers += replay.gathers[g];
      rp.reduce_scatters += replay.reduce_scatters[g];
    }
    const size_t partial = cfg.reduce == ReduceMode::kBf16Sr ? 2 : 4;
    for (auto& gp : groups) {
      const RuntimeGroup& g = *gp;
      const int gi = g.layout.group;
      const size_t e = DTypeSize(g.wdt);
      tally.Ring("all-gather", Group::kZero3, "zero3", replay.gathers[gi],
                 RingAllGatherSendBytes(topo.sw(), g.z3.size(), e),
                 g.z3.size() ? g.z3.size() * e : 0);
      tally.Ring("reduce-scatter", Group::kZero2, "zero2", replay.reduce_scatters[gi],
                 RingReduceScatterSendBytes(topo.sg(), g.z2.size(), partial));
      if (mx && g.wdt == DType::kE4M3) {
        const size_t s = mx->s_z3_count(g.layout.group);
        tally.Ring("S all-gather (mxfp8 scales)", Group::kZero3, "zero3", 1,
                   RingAllGatherSendBytes(topo.sw(), s, 1), s);
      }
    }
    for (const PlannedCollective& c : tally.list) rp.runtime_comm += c.sent;
    const size_t runtime_kinds = tally.list.size();

    const int replica_rs = topo.so() / topo.sg(), replica_ag = topo.so() / topo.sw();
    const int hsdp = topo.num_replicas();
    for (auto& gp : groups) {
      const size_t z1 = gp->z1.size();
      if (replica_rs > 1)
        tally.Ring("outer reduce-scatter", Group::kReplicaRS, "replica", 1,
                   RingReduceScatterSendBytes(replica_rs, z1, 4));
      if (hsdp > 1) {
        const int pos = topo.GroupPosition(Group::kHsdp, r);
        tally.Ring("HSDP all-reduce", Group::kHsdp, "hsdp", 1,
                   RingAllReduceSendBytes(hsdp, pos, z1, 4, 4));
      }
    }
    tally.Ring("loss/norm all-reduce", Group::kWorld, "world", 1,
               RingAllReduceSendBytes(world, r, 2, 4, 4));
    for (OptimizerKind k : {OptimizerKind::kAdamW, OptimizerKind::kMuon}) {
      const UpdatePlan* up = update.plan(k);
      if (!up) continue;
      rp.update_exec_cost += up->ExecCost(r);
      for (const PlannedMessage& m : up->messages())
        if (m.src == r) {
          tally.Message("update point-to-point (messages)", m.dst, m.bytes);
          AddSend(&rp.update_p2p, topo, r, m.dst, m.bytes);
        }
    }
    if (mx && mx->plan()) {
      for (const PlannedMessage& m : mx->plan()->messages())
        if (m.src == r) {
          tally.Message("G point-to-point (mxfp8 code messages)", m.dst, m.bytes);
          rp.mx_p2p_bytes += m.bytes;
        }
      for (const MxWeights::ScaleMessage& m : mx->ScaleMessages())
        if (m.exec == r && m.owner != r) {
          tally.Message("G point-to-point (mxfp8 scale messages)", m.owner, m.hi - m.lo);
          rp.mx_p2p_bytes += m.hi - m.lo;
        }
    }
    for (auto& gp : groups) {
      const RuntimeGroup& g = *gp;
      if (replica_ag <= 1) continue;
      tally.Ring("outer all-gather", Group::kReplicaAG, "replica", 1,
                 RingAllGatherSendBytes(replica_ag, g.z1.size(), DTypeSize(g.sdt)));
      if (mx && g.sdt == DType::kE4M3)
        tally.Ring("S outer all-gather (mxfp8 scales)", Group::kReplicaAG, "replica", 1,
                   RingAllGatherSendBytes(replica_ag, mx->s_z1_count(g.layout.group), 1));
    }
    for (size_t i = runtime_kinds; i < tally.list.size(); ++i) rp.update_comm += tally.list[i].sent;
    rp.collectives = std::move(tally.list);

    if (r == 0) {
      for (auto& gp : groups) {
        const RuntimeGroup& g = *gp;
        plan.groups.push_back({g.layout.group, g.layout.list.numel(), g.padded,
                               std::string(DTypeName(g.wdt)),
                               static_cast<int>(g.layout.list.num_members()),
                               static_cast<int>(g.layout.update.size())});
        const size_t chunk = g.padded / static_cast<size_t>(topo.so());
        for (int j = 0; j < topo.so(); ++j) {
          PlannedChunk c;
          c.group = g.layout.group;
          c.chunk = j;
          c.begin = j * chunk;
          c.end = c.begin + chunk;
          for (int d = 0; d < hsdp; ++d) c.owners.push_back(topo.Zero1ChunkOwner(j, d));
          for (const TensorListMember& m : g.layout.list.members()) {
            const size_t lo = std::max(m.offset, c.begin), hi = std::min(m.end(), c.end);
            if (lo >= hi) continue;
            c.members.push_back(
                lo == m.offset && hi == m.end()
                    ? m.name
                    : fmt::format("{}[{}:{})", m.name, lo - m.offset, hi - m.offset));
          }
          plan.chunks.push_back(std::move(c));
        }
      }
      if (const UpdatePlan* mu = update.plan(OptimizerKind::kMuon)) {
        plan.muon_units = static_cast<int>(mu->units().size());
        plan.muon_split = mu->num_split();
        for (size_t i = 0; i < mu->units().size(); ++i) {
          const UpdateUnit& u = mu->units()[i];
          const UnitPlacement& pl = mu->placements()[i];
          PlannedUnit pu{
              "muon",       u.name, static_cast<int>(u.rows), static_cast<int>(u.cols), {},
              pl.exec_rank, pl.cost};
          for (const UnitPiece& pc : pl.pieces) pu.owners.push_back(pc.rank);
          plan.units.push_back(std::move(pu));
        }
      }
    }
    plan.ranks.push_back(std::move(rp));
  }
  return plan;
}

}  // namespace sshsdp
