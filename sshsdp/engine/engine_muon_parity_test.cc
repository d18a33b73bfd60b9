// Distributed Muon + AdamW parity (issue 4): multi-rank training with Muon per head (per matrix:
// the packed QKV as one unit; per expert: the MoE model's stacked experts) on every layout of
// engine_parity_test equals the same engine on a one-rank communicator — the single-process
// reference of the same logical per-unit update — with head boundaries that cut through shards
// (the default test model) and that fall exactly on shard boundaries (d_ff = 16: at so = 2 every
// unit is local, at so = 4 one ZeRO-1 boundary lies between two V heads and another cuts a K
// head). Also asserts:
//   * bytes moved by the update phase = the off-rank fragments of split units, computed here
//     from the shard chain (u, bf16 or fp32, to the execution rank, v in fp32 back), zero with no
//     exchange at all when every unit is local;
//   * no bytes copied to assemble units (temporaries are data-tree views);
//   * every unit's Newton–Schulz work runs exactly once per replica.
// ⑥ full_tensor (FSDP2-style Muon, the fsdp2 preset: dim-0 shards, optimizer replicated across
// replica groups): every rank of the ZeRO-1 group all-gathers every whole Muon matrix, runs
// Newton–Schulz on all of them and keeps its own shard — the same training as the reference on
// every layout (W = 3: uneven dim-0 chunks with padding; so < W: HSDP), with exact counters:
//   * update bytes per rank = Σ over gathered parameters (so − 1) · count · sizeof(u), count =
//     the largest ZeRO-1 chunk's share of the parameter (padding rows included) — for dim-0
//     shards with sw = so, Σ ceil(rows / so) · cols;
//   * one all-gather per gathered parameter (a head, a matrix, a stacked expert weight; the
//     merged runtime parameter per "matrix");
//   * Newton–Schulz FLOPs per rank = those of every unit (so × the balanced p2p share);
//   * reassembly bytes = the merged matrices' elements (dim-0 pieces of several parts), zero
//     per head.
// SSHSDP_TEST_VERBOSE=1 prints the worst weight difference per step; SSHSDP_TEST_LAYOUT=
// "sw,sg,so,rpn" runs one layout.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <set>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/presets.h"
#include "sshsdp/engine/testing/parity_harness.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {
namespace {

using testing::Describe;
using testing::GptOf;
using testing::Layout;
using testing::LayoutsFor;  // the layouts of engine_parity_test
using testing::ModelFactory;
using testing::MoeOf;
using testing::MuonEngineConfig;
using testing::WorldSize;

// Heads [8, 24] of the packed QKV cut by shard boundaries (as in engine_parity_test).
GptConfig Unaligned() { return testing::TestGpt(); }

// Block groups of 3120 elements: ln1 [0,24), qkv [24,1752) = 9 heads of 192, proj, ln2,
// fc1 [16,24], fc2 [24,16]. so = 2: the boundary 1560 = 24 + 8·192 is a head boundary and
// every unit is local; so = 4 adds 780 (inside a head) and 2340 (inside ln2).
GptConfig Aligned() {
  GptConfig c = Unaligned();
  c.d_ff = 16;
  return c;
}

// The default Muon parity case: `make` with Muon from `l` against the one-rank reference,
// bounds of MuonTolerances (exact with fp32 weights and fp32 u).
testing::ParityCase MuonCase(const Layout& l, const ModelFactory& make, DType wdt, UnitRule unit,
                             DType u_dtype, int M) {
  testing::ParityCase c;
  c.layout = l;
  c.make = make;
  c.cfg = MuonEngineConfig(l, M, wdt, unit, u_dtype);
  c.ref_cfg = MuonEngineConfig(testing::kOneRank, M * WorldSize(), wdt, unit, u_dtype);
  c.tol = testing::MuonTolerances(wdt == DType::kF32 && u_dtype == DType::kF32);
  return c;
}

// Bytes this rank sends in the update: for every split unit, its fragments off the execution
// rank travel as bf16 u (owner → exec) and fp32 v (exec → owner). From the shard chain.
uint64_t ExpectedBytes(const Engine& eng, const Model& model, const Layout& l, DType wdt,
                       DType u_dtype, int r) {
  const UpdatePlan* plan = eng.structured_update().plan(OptimizerKind::kMuon);
  if (!plan) return 0;
  Topology topo(eng.topology());
  std::vector<GroupLayout> layouts;
  for (int g = 0; g < model.num_groups(); ++g)
    layouts.push_back(BuildGroupLayout(g, model.GroupParams(g), wdt, l.so));
  uint64_t bytes = 0;
  for (size_t i = 0; i < plan->units().size(); ++i) {
    const UpdateUnit& u = plan->units()[i];
    const int exec = plan->placements()[i].exec_rank;
    ShardChain chain(layouts[u.group].list, topo, r);
    for (int m = u.first_member; m < u.first_member + u.num_members; ++m) {
      const TensorListMember& mem = layouts[u.group].list.member(m);
      const size_t a = std::max(u.begin, mem.offset) - mem.offset;
      const size_t b = std::min(u.end(), mem.end()) - mem.offset;
      for (const OwnedFragment& f : chain.Zero1Owners(m, a, b)) {
        if (f.rank == exec) continue;
        if (f.rank == r) bytes += DTypeSize(u_dtype) * f.fragment.length;
        if (exec == r) bytes += 4 * f.fragment.length;
      }
    }
  }
  return bytes;
}

void RunMuonParity(const Layout& l, const ModelFactory& make, DType wdt, UnitRule unit,
                   DType u_dtype, int M, bool expect_all_local = false) {
  testing::ParityRun run(MuonCase(l, make, wdt, unit, u_dtype, M));
  Engine& eng = run.engine();
  const int r = run.rank();
  const UpdatePlan* plan = eng.structured_update().plan(OptimizerKind::kMuon);
  ASSERT_NE(plan, nullptr);
  const uint64_t expect = ExpectedBytes(eng, run.model(), l, wdt, u_dtype, r);
  EXPECT_EQ(plan->BytesSent(r), expect);
  // Newton–Schulz work: each unit once per replica.
  double total = 0;
  for (const UnitPlacement& p : plan->placements()) total += p.cost;
  const double mine = plan->ExecCost(r);
  float share[1] = {static_cast<float>(mine / total)};
  run.world().AllReduce(share, 1, DType::kF32);
  EXPECT_NEAR(share[0], static_cast<float>(eng.topology().num_replicas()), 1e-4);

  run.Run([&](const testing::StepDiff& d) {
    EXPECT_EQ(d.dist.counters.update_p2p.total(), expect) << "step " << d.step;
    // One batched exchange for the fetches and one for the returns — none on a rank that
    // neither owns a fragment of a split unit nor executes one.
    EXPECT_EQ(d.dist.counters.update_p2p.calls, expect > 0 ? 2u : 0u);
    EXPECT_EQ(eng.structured_update().last_run().bytes_copied, 0u);
    EXPECT_EQ(d.dist.counters.update_exec_cost, mine);
  });
  if (expect_all_local) {
    EXPECT_EQ(plan->num_split(), 0);
    EXPECT_EQ(expect, 0u);
  }
}

// Each optimizer keeps only its own state: m for every element of the chunk, AdamW's second
// moment v only for the AdamW parameters' ZeRO-1 fragments (none for Muon parameters), so
// the account's optimizer_state is exactly that.
void ExpectOwnState(Engine& eng) {
  uint64_t expect = 0;
  for (const Engine::Zero1Field& f : eng.Zero1Fields()) {
    if (f.field == "main") continue;
    if (f.field == "m") {
      EXPECT_FALSE(f.data.packed);
      expect += f.chunk.size() * 4;
      continue;
    }
    ASSERT_EQ(f.field, "v");
    bool any_muon = false;
    for (const UpdateParam& u : f.layout->update) any_muon |= u.optimizer == OptimizerKind::kMuon;
    EXPECT_EQ(f.data.packed, any_muon) << "group " << f.group;
    size_t adamw = 0;
    for (const Fragment& fr : f.chain->Fragments(Shard::kZero1)) {
      if (fr.length == 0) continue;
      const UpdateParam& u = f.layout->update[(*f.pieces)[fr.member].update];
      float* first = f.data.At(fr.shard_offset);
      float* last = f.data.At(fr.shard_offset + fr.length - 1);
      if (u.optimizer == OptimizerKind::kMuon) {
        EXPECT_EQ(first, nullptr) << u.name;
        EXPECT_EQ(last, nullptr) << u.name;
      } else {
        ASSERT_NE(first, nullptr) << u.name;
        EXPECT_EQ(last, first + fr.length - 1) << u.name;
        adamw += fr.length;
      }
    }
    expect += (f.data.packed ? adamw : f.chunk.size()) * 4;
  }
  EXPECT_EQ(eng.memory().current("optimizer_state"), expect);
}

TEST(EngineMuonState, EachOptimizerKeepsOnlyItsOwnState) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    for (UnitRule unit : {UnitRule::kHead, UnitRule::kMatrix}) {
      testing::ParityRun run(MuonCase(l, GptOf(Unaligned()), DType::kBF16, unit, DType::kBF16, 1));
      ExpectOwnState(run.engine());
      ExpectOwnState(run.ref());
    }
    testing::ParityCase c;  // AdamW only: v everywhere, dense
    c.layout = l;
    c.make = GptOf(Unaligned());
    c.cfg = testing::BaseConfig(l, 1, DType::kBF16);
    c.ref_cfg = testing::BaseConfig(testing::kOneRank, W, DType::kBF16);
    testing::ParityRun run(c);
    ExpectOwnState(run.engine());
  }
}

// fp32 runtime weights and fp32 u: tight parity, heads cut by shards and heads on shard
// boundaries.
TEST(EngineMuonParity, PerHeadFp32Unaligned) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunMuonParity(l, GptOf(Unaligned()), DType::kF32, UnitRule::kHead, DType::kF32, 2);
  }
}

TEST(EngineMuonParity, PerHeadFp32Aligned) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunMuonParity(l, GptOf(Aligned()), DType::kF32, UnitRule::kHead, DType::kF32, 2,
                  /*expect_all_local=*/l.so == 2);
  }
}

// The paper's configuration: bf16 runtime weights, bf16 u.
TEST(EngineMuonParity, PerHeadBf16) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunMuonParity(l, GptOf(Unaligned()), DType::kBF16, UnitRule::kHead, DType::kBF16, 2);
  }
}

// The packed QKV as one [3d, d] unit.
TEST(EngineMuonParity, PerMatrixQkv) {
  const int W = WorldSize();
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(Describe(W, l));
  RunMuonParity(l, GptOf(Unaligned()), DType::kF32, UnitRule::kMatrix, DType::kF32, 2);
  RunMuonParity(l, GptOf(Unaligned()), DType::kBF16, UnitRule::kMatrix, DType::kBF16, 2);
}

// Stacked experts: every expert matrix of the packed [E, f, d] runtime weights is its own Muon
// unit (the router stays on AdamW: muon_eligible = false).
TEST(EngineMuonParity, PerExpertMoe) {
  const int W = WorldSize();
  const MoeConfig c = testing::TestMoe();
  {
    MoeGpt probe(c);
    GroupLayout L = BuildGroupLayout(1, probe.GroupParams(1), DType::kF32, 1);
    UnitSelection sel = SelectUnits(L, UnitPolicy{true, UnitRule::kHead, {}});
    int experts = 0;
    for (const UpdateUnit& u : sel.muon) experts += u.name.find(".moe.w1.e") != std::string::npos;
    EXPECT_EQ(experts, c.n_expert);
    for (const UpdateUnit& u : sel.adamw) EXPECT_EQ(u.name.find("moe.w"), std::string::npos);
  }
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(Describe(W, l));
  RunMuonParity(l, MoeOf(c), DType::kF32, UnitRule::kHead, DType::kF32, 2);
}

// ⑥ full_tensor: what one step must count, from the layouts (see the header).
struct FullTensorExpect {
  uint64_t bytes = 0, calls = 0, copy = 0;
  double flops = 0;
};

FullTensorExpect ExpectFullTensor(const Model& model, const EngineConfig& cfg, int so) {
  FullTensorExpect e;
  const size_t es = DTypeSize(cfg.muon.u_dtype);
  const UnitPolicy policy{true, cfg.muon_unit, {}};
  for (int g = 0; g < model.num_groups(); ++g) {
    const auto specs = model.GroupParams(g);
    const GroupLayout flat = BuildGroupLayout(g, specs, cfg.weight_dtype, 1);
    const UnitSelection sel = SelectUnits(flat, policy);
    std::set<std::pair<int, int>> items;  // gathered parameters: update parts [first, +count)
    for (const UpdateUnit& u : sel.muon) {
      e.flops += NewtonSchulzFlops(u.rows, u.cols, cfg.muon.ns_steps);
      items.insert({u.first_member, u.num_members});
    }
    const EngineLayout E =
        BuildEngineLayout(cfg.shard_layout, g, specs, cfg.weight_dtype, cfg.sw, so);
    const size_t chunk = E.layout.list.padded_numel() / so;
    for (const auto& [first, count] : items) {
      size_t send = 0, closed = 0, numel = 0;
      for (int p = first; p < first + count; ++p) {
        const auto& shape = flat.update[p].shape;
        const size_t rows = shape[0], n = NumElements(shape);
        closed += (rows + so - 1) / so * (n / rows);
        numel += n;
      }
      for (int j = 0; j < so; ++j) {  // chunk j's share: its elements of the parameter's pieces
        size_t lo = (j + 1) * chunk, hi = j * chunk;
        for (size_t m = 0; m < E.pieces.size(); ++m) {
          if (E.pieces[m].update < first || E.pieces[m].update >= first + count) continue;
          const TensorListMember& mem = E.layout.list.member(m);
          const size_t a = std::max(mem.offset, j * chunk),
                       b = std::min(mem.end(), (j + 1) * chunk);
          if (a >= b) continue;
          lo = std::min(lo, a);
          hi = std::max(hi, b);
        }
        if (hi > lo) send = std::max(send, hi - lo);
      }
      if (cfg.shard_layout == ShardLayout::kDim0 && cfg.sw == so) {
        EXPECT_EQ(send, closed);
      }
      e.bytes += static_cast<uint64_t>(so - 1) * send * es;
      e.calls++;
      if (cfg.shard_layout == ShardLayout::kDim0 && cfg.sw == so && so > 1 && count > 1)
        e.copy += numel * es;
    }
  }
  return e;
}

// The fsdp2 preset with Muon against the single-process reference (the sshsdp engine on one
// rank with W·M microbatches).
void RunFullTensorParity(const Layout& l, const ModelFactory& make, DType wdt, UnitRule unit,
                         DType u_dtype, int M) {
  testing::ParityCase c = MuonCase(l, make, wdt, unit, u_dtype, M);
  ApplyPreset("fsdp2", &c.cfg);
  c.label = "full_tensor";
  testing::ParityRun run(c);
  Engine& eng = run.engine();
  const int so = eng.topology().so();  // ⑦: so = sg
  EXPECT_EQ(so, l.sg);
  EXPECT_EQ(eng.structured_update().plan(OptimizerKind::kMuon), nullptr);
  const FullTensorMuon* ft = eng.structured_update().full_tensor();
  ASSERT_NE(ft, nullptr);
  const FullTensorExpect want = ExpectFullTensor(run.model(), c.cfg, so);
  EXPECT_EQ(ft->BytesSent(), want.bytes);
  EXPECT_EQ(ft->items().size(), want.calls);
  ASSERT_GT(want.flops, 0);

  run.Run([&](const testing::StepDiff& d) {
    const StepCounters& k = d.dist.counters;
    EXPECT_EQ(k.update_full_tensor.total(), want.bytes) << "step " << d.step;
    EXPECT_EQ(k.update_full_tensor.calls, want.calls);
    EXPECT_EQ(k.update_p2p.total(), 0u);
    EXPECT_EQ(k.update_exec_cost, want.flops);  // every unit on every rank
    EXPECT_EQ(k.copies.update_copy, eng.structured_update().last_run().bytes_copied);
    if (c.cfg.sw == so || so == 1) {
      EXPECT_EQ(k.copies.update_copy, want.copy);
      if (unit == UnitRule::kHead) {
        EXPECT_EQ(k.copies.update_copy, 0u);
      }
    }
  });
  // Newton–Schulz redundancy: so × the mean per-rank share of the balanced p2p units.
  if (const UpdatePlan* p2p = run.ref().structured_update().plan(OptimizerKind::kMuon)) {
    double total = 0;
    for (const UnitPlacement& p : p2p->placements()) total += p.cost;
    EXPECT_NEAR(want.flops, total, 1e-9 * total);
  }
}

TEST(EngineMuonFullTensor, Fsdp2PerHeadFp32) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunFullTensorParity(l, GptOf(Unaligned()), DType::kF32, UnitRule::kHead, DType::kF32, 2);
  }
}

TEST(EngineMuonFullTensor, Fsdp2PerMatrixAndBf16) {
  const int W = WorldSize();
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(Describe(W, l));
  RunFullTensorParity(l, GptOf(Unaligned()), DType::kF32, UnitRule::kMatrix, DType::kF32, 2);
  RunFullTensorParity(l, GptOf(Unaligned()), DType::kBF16, UnitRule::kHead, DType::kBF16, 2);
}

// Stacked experts: FSDP2 gathers the whole [E, f, d] weight (dim 0 = experts across ranks) and
// runs Newton–Schulz per expert.
TEST(EngineMuonFullTensor, Fsdp2PerExpertMoe) {
  const int W = WorldSize();
  const MoeConfig c = testing::TestMoe();
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(Describe(W, l));
  RunFullTensorParity(l, MoeOf(c), DType::kF32, UnitRule::kHead, DType::kF32, 2);
}

// The bench's ablation ladder with Muon: every step (⑥ full_tensor on flat shards included)
// trains like the reference; megatron-fsdp still refuses Muon, naming the parameter.
TEST(EngineMuonFullTensor, AblationLadderAndRefusal) {
  const int W = WorldSize();
  const Layout l = LayoutsFor(W).front();
  const EngineConfig base = MuonEngineConfig(l, 2, DType::kF32, UnitRule::kHead, DType::kF32);
  for (const auto& [label, cfg] : AblationLadder(base)) {
    SCOPED_TRACE(label);
    // Two steps; loss and weights (fp32 bounds) compared after the second.
    testing::ParityCase c =
        MuonCase(l, GptOf(Unaligned()), DType::kF32, UnitRule::kHead, DType::kF32, 2);
    c.cfg = cfg;
    c.steps = 2;
    c.seed = 3;
    c.tol_at = [](int64_t step) {
      return step == 1 ? testing::Tolerances{1e-5, testing::kNotCompared, 5e-6}
                       : testing::kNoneCompared;
    };
    testing::ParityRun run(c);
    Engine& eng = run.engine();
    const bool full = cfg.redundancies.structured_updates == StructuredUpdates::kFullTensor;
    EXPECT_EQ(eng.structured_update().full_tensor() != nullptr, full);
    const std::vector<testing::StepDiff> steps = run.Run();
    if (full) {
      EXPECT_EQ(steps.back().dist.counters.update_full_tensor.total(),
                ExpectFullTensor(run.model(), cfg, eng.topology().so()).bytes);
    }
  }
  auto world = MpiCommunicator::World(l.rpn);
  EngineConfig mg = base;
  ApplyPreset("megatron-fsdp", &mg);
  Gpt model(Unaligned());
  try {
    Engine e(model, *world, mg);
    ADD_FAILURE() << "megatron-fsdp accepted Muon";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("megatron-fsdp"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("blocks.0.attn.q.h0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sshsdp
