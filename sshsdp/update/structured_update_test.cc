// Structured updates on real ranks (mpirun): the paper's four-rank example with the exact
// point-to-point messages asserted through the plan AND the communicator's byte counters, the
// updated main weights equal to a one-rank reference of the same logical per-unit update, HSDP
// replicas each running the plan on their own ranks, and — over every valid layout and random
// head sizes — bytes moved equal exactly the off-rank fragments of split units (zero, with no
// exchange at all, when every unit is local).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/update/structured_update.h"

namespace sshsdp {
namespace {

// The CPU backend the updates of this file run on.
Backend& Cpu() {
  static const std::unique_ptr<Backend> cpu = MakeCpuBackend();
  return *cpu;
}

// Values by global element index (so every layout sees the same logical tensors).
float InitValue(size_t i) { return 0.3f * std::sin(0.37f * static_cast<float>(i) + 0.1f); }
float GradValue(size_t i, int step) {
  return std::cos(0.11f * static_cast<float>(i) + 0.7f * static_cast<float>(step));
}

// ZeRO-1 arrays of one group on one rank.
struct Arrays {
  Range chunk;
  std::vector<float> main, grad, m, v;
  explicit Arrays(Range c)
      : chunk(c), main(c.size()), grad(c.size()), m(c.size(), 0), v(c.size(), 0) {
    for (size_t i = 0; i < c.size(); ++i) main[i] = InitValue(c.begin + i);
  }
  void SetGrad(int step) {
    for (size_t i = 0; i < chunk.size(); ++i) grad[i] = GradValue(chunk.begin + i, step);
  }
  Zero1State State() {
    return {chunk,
            {{"main", main.data()}, {"grad", grad.data()}, {"m", m.data()}, {"v", v.data()}}};
  }
};

ScalarState Scalars(int step) {
  ScalarState s;
  s.Set("grad_scale", 0.5);
  s.Set("step", step);
  s.Set("adamw.lr", 0.01);
  s.Set("muon.lr", 0.02);
  return s;
}

// Runs `steps` updates of `layout` under `topo` on this rank and, in the same process, on a
// one-rank layout; checks this rank's main weights against the reference. Returns the plan's
// and the counter's bytes and the exchange calls of the last step.
struct RunResult {
  uint64_t counter_bytes = 0, plan_bytes = 0, calls = 0;
};
RunResult RunAndCompare(const GroupLayout& layout, const Topology& topo, const UpdateOptions& opt,
                        int steps, std::string* plan_text = nullptr) {
  auto world = MpiCommunicator::World(topo.ranks_per_node());
  const int r = world->rank();
  auto p2p = world->Duplicate();
  auto self = world->Split(r, 0);
  ShardChain chain(layout.list, topo, r);
  StructuredUpdate up({{&layout, &chain, {}}}, opt, r, *p2p);
  Topology one(1, 1, 1, 1, 1);
  ShardChain rchain(layout.list, one, 0);
  StructuredUpdate ref({{&layout, &rchain, {}}}, opt, 0, *self);
  Arrays mine(chain.LocalRange(Shard::kZero1)), all(rchain.LocalRange(Shard::kZero1));
  RunResult out;
  for (int t = 1; t <= steps; ++t) {
    mine.SetGrad(t);
    all.SetGrad(t);
    const CommCounters before = p2p->counters();
    up.Run({mine.State()}, Scalars(t));
    ref.Run({all.State()}, Scalars(t));
    out.counter_bytes = p2p->counters().total() - before.total();
    out.calls = p2p->counters().calls - before.calls;
    EXPECT_EQ(up.last_run().bytes_sent, out.counter_bytes);
    EXPECT_EQ(up.last_run().bytes_copied, 0u);
    EXPECT_EQ(ref.last_run().bytes_sent, 0u);
    double worst = 0;
    for (size_t i = 0; i < mine.chunk.size(); ++i) {
      const size_t gi = mine.chunk.begin + i;
      if (gi >= layout.list.numel()) break;
      worst = std::max(worst, std::abs(double(mine.main[i]) - all.main[gi]));
      EXPECT_EQ(mine.m[i], all.m[gi]) << "momentum of element " << gi;  // elementwise: exact
    }
    // NS of a gathered unit runs on the same bf16 input as the reference: only the batching
    // of the GEMMs differs.
    EXPECT_LT(worst, 1e-6) << "step " << t << " rank " << r;
  }
  if (const UpdatePlan* p = up.plan(OptimizerKind::kMuon)) {
    out.plan_bytes = p->BytesSent(r);
    if (plan_text) *plan_text = p->Describe();
  }
  return out;
}

// Figure 4: Linear [6,4] then Q heads [4,4] x3, so=4, sg=sw=2; ZeRO-1 chunk owners
// [0, 2, 1, 3] (per replica). Muon per head, AdamW for the Linear.
GroupLayout PaperLayout() {
  RuntimeParamSpec lin{"linear", {6, 4}, {{"linear", {6, 4}, 0, UpdateKind::kMatrix, {}}}};
  RuntimeParamSpec q{"q", {12, 4}, {}};
  for (int h = 0; h < 3; ++h)
    q.parts.push_back({fmt::format("q.h{}", h), {4, 4}, h * 16, UpdateKind::kMatrix, {}});
  return BuildGroupLayout(0, {lin, q}, DType::kBF16, 4);
}

TEST(StructuredUpdate, PaperExampleExactMessages) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  if (W % 4 != 0) GTEST_SKIP() << "needs 4 ranks per replica";
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  Topology topo(W, 4, 2, 2, 4);  // W = 8: two HSDP replicas, ranks 0-3 and 4-7
  GroupLayout L = PaperLayout();
  UpdateOptions o;
  o.backend = &Cpu();
  o.optimizer = OptimizerKind::kMuon;
  o.overrides["linear"] = UnitRule::kAdamW;
  std::string text;
  RunResult res = RunAndCompare(L, topo, o, 3, &text);
  // Head0: u[12,16) 1 -> 2 (4 bf16 = 8 B), v[12,16) 2 -> 1 (4 fp32 = 16 B).
  // Head1: u[14,16) 3 -> 1 (4 B),          v[14,16) 1 -> 3 (8 B).  Head2: local on rank 3.
  const int local = r % 4;
  const uint64_t expect_bytes[4] = {0, 8 + 8, 16, 4};
  const uint64_t expect_calls[4] = {0, 2, 2, 2};  // fetch exchange + return exchange
  EXPECT_EQ(res.counter_bytes, expect_bytes[local]) << text;
  EXPECT_EQ(res.plan_bytes, expect_bytes[local]);
  EXPECT_EQ(res.calls, expect_calls[local]);
  if (r == 0) fmt::print("{}", text);
}

// Heads of chunk size exactly: every unit is local on every layout with so = 4 chunks.
TEST(StructuredUpdate, AlignedUnitsMoveNothing) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  RuntimeParamSpec q{"q", {4 * W, 8}, {}};
  for (int h = 0; h < W; ++h)
    q.parts.push_back({fmt::format("q.h{}", h), {4, 8}, h * 32, UpdateKind::kMatrix, {}});
  GroupLayout L = BuildGroupLayout(0, {q}, DType::kBF16, W);
  UpdateOptions o;
  o.backend = &Cpu();
  o.optimizer = OptimizerKind::kMuon;
  RunResult res = RunAndCompare(L, Topology(W, W, 1, 1, W), o, 2);
  EXPECT_EQ(res.counter_bytes, 0u);
  EXPECT_EQ(res.plan_bytes, 0u);
  EXPECT_EQ(res.calls, 0u);
}

// Every valid layout of this world with random head sizes: the bytes this rank sends equal the
// off-rank fragments of split units, computed here straight from the shard chain.
TEST(StructuredUpdate, BytesEqualOffRankFragmentsOnEveryLayout) {
  int W = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  std::mt19937 rng(11);
  for (int sw = 1; sw <= W; ++sw)
    for (int sg = sw; sg <= W; sg += sw)
      for (int so = sg; so <= W; so += sg) {
        if (sg % sw || so % sg || W % so) continue;
        SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={}", W, sw, sg, so));
        const int64_t d = 4 + rng() % 9, heads = 2 + rng() % 4, dh = 1 + rng() % 5;
        RuntimeParamSpec lin{"lin", {d, d}, {{"lin", {d, d}, 0, UpdateKind::kMatrix, {}}}};
        RuntimeParamSpec gain{"g", {d}, {{"g", {d}, 0, UpdateKind::kVector, {}}}};
        RuntimeParamSpec q{"q", {heads * dh, d}, {}};
        for (int h = 0; h < heads; ++h)
          q.parts.push_back(
              {fmt::format("q.h{}", h), {dh, d}, h * dh * d, UpdateKind::kMatrix, {}});
        GroupLayout L = BuildGroupLayout(0, {lin, gain, q}, DType::kBF16, so);
        Topology topo(W, W, sw, sg, so);
        UpdateOptions o;
        o.backend = &Cpu();
        o.optimizer = OptimizerKind::kMuon;
        o.muon_unit = rng() % 2 ? UnitRule::kHead : UnitRule::kMatrix;
        RunResult res = RunAndCompare(L, topo, o, 1);
        // Independent count: each split unit's pieces off the execution rank travel twice —
        // u (bf16) to the execution rank, v (fp32) back.
        ShardChain chain(L.list, topo, r);
        UnitPolicy policy{true, o.muon_unit, {}};
        auto plan =
            std::make_unique<UpdatePlan>(MuonProgram(o.muon, Cpu()), SelectUnits(L, policy).muon,
                                         std::vector<const ShardChain*>{&chain}, topo.Coord(r).d);
        uint64_t expect = 0;
        for (size_t i = 0; i < plan->units().size(); ++i) {
          const UpdateUnit& u = plan->units()[i];
          const int exec = plan->placements()[i].exec_rank;
          for (int m = u.first_member; m < u.first_member + u.num_members; ++m) {
            const TensorListMember& mem = L.list.member(m);
            const size_t a = std::max(u.begin, mem.offset) - mem.offset;
            const size_t b = std::min(u.end(), mem.end()) - mem.offset;
            for (const OwnedFragment& f : chain.Zero1Owners(m, a, b)) {
              if (f.rank == exec) continue;
              if (f.rank == r) expect += 2 * f.fragment.length;  // u to exec
              if (exec == r) expect += 4 * f.fragment.length;    // v back to the owner
            }
          }
        }
        EXPECT_EQ(res.counter_bytes, expect);
        EXPECT_EQ(res.plan_bytes, expect);
      }
}

// A member mapping that does not fit the buffer is a PlanError naming the group and member,
// before anything runs (UpdateGroupView::pieces comes from the engine's baseline layouts).
TEST(StructuredUpdate, BadMemberPiecesAreRefused) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  auto world = MpiCommunicator::World(1);
  auto self = world->Split(r, 0);
  GroupLayout L = PaperLayout();
  Topology one(1, 1, 1, 1, 1);
  ShardChain chain(L.list, one, 0);
  UpdateOptions o;
  o.backend = &Cpu();
  o.optimizer = OptimizerKind::kMuon;
  auto expect_plan_error = [&](std::vector<MemberPiece> pieces, const std::string& needle) {
    try {
      StructuredUpdate up({{&L, &chain, std::move(pieces)}}, o, 0, *self);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const PlanError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_plan_error({{0, 0, 24}}, "4 buffer members but 4 update parameters and 1 member pieces");
  expect_plan_error({{0, 0, 24}, {1, 0, 16}, {2, 0, 16}, {9, 0, 16}},
                    "member 3 maps to update parameter 9");
  expect_plan_error({{0, 0, 24}, {1, 0, 17}, {2, 0, 16}, {3, 0, 16}}, "17 valid elements");
}

}  // namespace
}  // namespace sshsdp
