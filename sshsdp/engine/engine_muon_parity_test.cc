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
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/presets.h"
#include "sshsdp/engine/testing/parity_data.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {
namespace {

using testing::MakeBatch;

struct Layout {
  int sw, sg, so, rpn;
};

// The layouts of engine_parity_test (SSHSDP_TEST_LAYOUT="sw,sg,so,rpn" runs one).
std::vector<Layout> LayoutsFor(int W) {
  if (const char* e = std::getenv("SSHSDP_TEST_LAYOUT")) {
    Layout l{};
    if (std::sscanf(e, "%d,%d,%d,%d", &l.sw, &l.sg, &l.so, &l.rpn) == 4) return {l};
  }
  switch (W) {
    case 1:
      return {{1, 1, 1, 1}};
    case 2:
      return {{2, 2, 2, 2}, {1, 1, 2, 1}};
    case 3:
      return {{3, 3, 3, 3}, {1, 1, 3, 3}};
    case 4:
      return {{2, 2, 4, 2}, {1, 2, 4, 4}, {4, 4, 4, 4}, {2, 2, 2, 2}};
    case 6:
      return {{2, 2, 6, 2}, {3, 3, 3, 3}};
    case 8:
      return {{2, 4, 8, 4}, {2, 2, 4, 2}};
    default:
      return {};
  }
}

// Heads [8, 24] of the packed QKV cut by shard boundaries (as in engine_parity_test).
GptConfig Unaligned() {
  GptConfig c;
  c.vocab = 61;
  c.seq_len = 8;
  c.d_model = 24;
  c.n_head = 3;
  c.n_layer = 2;
  return c;
}

// Block groups of 3120 elements: ln1 [0,24), qkv [24,1752) = 9 heads of 192, proj, ln2,
// fc1 [16,24], fc2 [24,16]. so = 2: the boundary 1560 = 24 + 8·192 is a head boundary and
// every unit is local; so = 4 adds 780 (inside a head) and 2340 (inside ln2).
GptConfig Aligned() {
  GptConfig c = Unaligned();
  c.d_ff = 16;
  return c;
}

EngineConfig MuonConfigFor(const Layout& l, int M, DType wdt, UnitRule unit, DType u_dtype) {
  EngineConfig cfg;
  cfg.sw = l.sw;
  cfg.sg = l.sg;
  cfg.so = l.so;
  cfg.ranks_per_node = l.rpn;
  cfg.microbatches = M;
  cfg.batch_size = 2;
  cfg.seq_len = 8;
  cfg.weight_dtype = wdt;
  cfg.adamw.lr = 3e-3f;
  cfg.adamw.eps = 1e-6f;
  cfg.clip_norm = 0.5f;  // active: grad_scale carries a clipping factor into f0
  cfg.optimizer = OptimizerKind::kMuon;
  cfg.muon_unit = unit;
  cfg.muon.lr = 0.02f;
  cfg.muon.weight_decay = 0.1f;
  cfg.muon.u_dtype = u_dtype;
  return cfg;
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

// Tolerances: with fp32 u the distributed run differs from the reference by fp32 summation
// order only (times Newton–Schulz's amplification of weak directions): ~1e-6. With bf16 u a
// rounding that differs somewhere in u moves v by ~1e-3 relative on weak directions (muon.h),
// and with bf16 runtime weights main weights that differ in their last bits can round to
// neighbouring bf16 values; the bound stays far below the ~lr·|v| ≈ 5e-3 of a wrong or
// missing fragment.
using ModelFactory = std::function<std::unique_ptr<Model>()>;
ModelFactory GptOf(const GptConfig& c) {
  return [c] { return std::make_unique<Gpt>(c); };
}

void RunMuonParity(const Layout& l, const ModelFactory& make, int vocab, DType wdt, UnitRule unit,
                   DType u_dtype, int M, bool expect_all_local = false) {
  auto world = MpiCommunicator::World(l.rpn);
  const int W = world->size(), r = world->rank();
  auto self = world->Split(r, 0);
  std::unique_ptr<Model> model_owner = make(), ref_owner = make();
  Model &model = *model_owner, &ref_model = *ref_owner;
  EngineConfig cfg = MuonConfigFor(l, M, wdt, unit, u_dtype);
  Engine eng(model, *world, cfg);
  Engine ref(ref_model, *self, MuonConfigFor({1, 1, 1, 1}, M * W, wdt, unit, u_dtype));
  eng.InitWeights(7);
  ref.InitWeights(7);
  int64_t step = 0;
  BatchFn batch = MakeBatch(&step, M, W, r, cfg.batch_size, cfg.seq_len, vocab);
  BatchFn rbatch = MakeBatch(&step, M * W, 1, 0, cfg.batch_size, cfg.seq_len, vocab);

  const UpdatePlan* plan = eng.structured_update().plan(OptimizerKind::kMuon);
  ASSERT_NE(plan, nullptr);
  const uint64_t expect = ExpectedBytes(eng, model, l, wdt, u_dtype, r);
  EXPECT_EQ(plan->BytesSent(r), expect);
  // Newton–Schulz work: each unit once per replica.
  double total = 0;
  for (const UnitPlacement& p : plan->placements()) total += p.cost;
  const double mine = plan->ExecCost(r);
  float share[1] = {static_cast<float>(mine / total)};
  world->AllReduce(share, 1, DType::kF32);
  EXPECT_NEAR(share[0], static_cast<float>(eng.topology().num_replicas()), 1e-4);

  const bool exact = wdt == DType::kF32 && u_dtype == DType::kF32;
  const double loss_tol = exact ? 1e-6 : 1e-3, weight_tol = exact ? 5e-6 : 2e-3;
  for (; step < 3; ++step) {
    StepStats a = eng.Step(batch);
    StepStats b = ref.Step(rbatch);
    EXPECT_NEAR(a.loss, b.loss, loss_tol * std::abs(b.loss)) << "step " << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, (exact ? 1e-5 : 1e-2) * b.grad_norm) << "step " << step;
    EXPECT_EQ(a.counters.update_p2p.total(), expect) << "step " << step;
    // One batched exchange for the fetches and one for the returns — none on a rank that
    // neither owns a fragment of a split unit nor executes one.
    EXPECT_EQ(a.counters.update_p2p.calls, expect > 0 ? 2u : 0u);
    EXPECT_EQ(eng.structured_update().last_run().bytes_copied, 0u);
    EXPECT_EQ(a.counters.update_exec_cost, mine);
    auto wa = eng.GatherMainWeights();
    auto wb = ref.GatherMainWeights();
    double worst = 0;
    std::string worst_name;
    for (auto& [name, va] : wa) {
      const auto& vb = wb.at(name);
      for (size_t i = 0; i < va.size(); ++i) {
        double d = std::abs(double(va[i]) - vb[i]);
        if (d > worst) worst = d, worst_name = name;
      }
    }
    if (std::getenv("SSHSDP_TEST_VERBOSE") && r == 0)
      fmt::print("step {} worst {:.3g} ({})\n", step, worst, worst_name);
    EXPECT_LT(worst, weight_tol) << "step " << step << " worst param " << worst_name;
  }
  if (expect_all_local) {
    EXPECT_EQ(plan->num_split(), 0);
    EXPECT_EQ(expect, 0u);
  }
}

// fp32 runtime weights and fp32 u: tight parity, heads cut by shards and heads on shard
// boundaries.
TEST(EngineMuonParity, PerHeadFp32Unaligned) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunMuonParity(l, GptOf(Unaligned()), 61, DType::kF32, UnitRule::kHead, DType::kF32, 2);
  }
}

TEST(EngineMuonParity, PerHeadFp32Aligned) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunMuonParity(l, GptOf(Aligned()), 61, DType::kF32, UnitRule::kHead, DType::kF32, 2,
                  /*expect_all_local=*/l.so == 2);
  }
}

// The paper's configuration: bf16 runtime weights, bf16 u.
TEST(EngineMuonParity, PerHeadBf16) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunMuonParity(l, GptOf(Unaligned()), 61, DType::kBF16, UnitRule::kHead, DType::kBF16, 2);
  }
}

// The packed QKV as one [3d, d] unit.
TEST(EngineMuonParity, PerMatrixQkv) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
  RunMuonParity(l, GptOf(Unaligned()), 61, DType::kF32, UnitRule::kMatrix, DType::kF32, 2);
  RunMuonParity(l, GptOf(Unaligned()), 61, DType::kBF16, UnitRule::kMatrix, DType::kBF16, 2);
}

// Stacked experts: every expert matrix of the packed [E, f, d] runtime weights is its own Muon
// unit (the router stays on AdamW: muon_eligible = false).
TEST(EngineMuonParity, PerExpertMoe) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MoeConfig c;
  c.trunk.vocab = 61;
  c.trunk.seq_len = 8;
  c.trunk.d_model = 24;
  c.trunk.n_head = 3;
  c.trunk.n_layer = 2;
  c.n_expert = 4;
  c.top_k = 2;
  c.d_expert = 20;
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
  SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
  RunMuonParity(
      l, [c] { return std::make_unique<MoeGpt>(c); }, 61, DType::kF32, UnitRule::kHead, DType::kF32,
      2);
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
void RunFullTensorParity(const Layout& l, const ModelFactory& make, int vocab, DType wdt,
                         UnitRule unit, DType u_dtype, int M) {
  auto world = MpiCommunicator::World(l.rpn);
  const int W = world->size(), r = world->rank();
  auto self = world->Split(r, 0);
  std::unique_ptr<Model> model_owner = make(), ref_owner = make();
  EngineConfig cfg = MuonConfigFor(l, M, wdt, unit, u_dtype);
  ApplyPreset("fsdp2", &cfg);
  Engine eng(*model_owner, *world, cfg);
  Engine ref(*ref_owner, *self, MuonConfigFor({1, 1, 1, 1}, M * W, wdt, unit, u_dtype));
  eng.InitWeights(7);
  ref.InitWeights(7);
  int64_t step = 0;
  BatchFn batch = MakeBatch(&step, M, W, r, cfg.batch_size, cfg.seq_len, vocab);
  BatchFn rbatch = MakeBatch(&step, M * W, 1, 0, cfg.batch_size, cfg.seq_len, vocab);

  const int so = eng.topology().so();  // ⑦: so = sg
  EXPECT_EQ(so, l.sg);
  EXPECT_EQ(eng.structured_update().plan(OptimizerKind::kMuon), nullptr);
  const FullTensorMuon* ft = eng.structured_update().full_tensor();
  ASSERT_NE(ft, nullptr);
  const FullTensorExpect want = ExpectFullTensor(*model_owner, cfg, so);
  EXPECT_EQ(ft->BytesSent(), want.bytes);
  EXPECT_EQ(ft->items().size(), want.calls);
  ASSERT_GT(want.flops, 0);

  const bool exact = wdt == DType::kF32 && u_dtype == DType::kF32;
  const double loss_tol = exact ? 1e-6 : 1e-3, weight_tol = exact ? 5e-6 : 2e-3;
  for (; step < 3; ++step) {
    StepStats a = eng.Step(batch);
    StepStats b = ref.Step(rbatch);
    EXPECT_NEAR(a.loss, b.loss, loss_tol * std::abs(b.loss)) << "step " << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, (exact ? 1e-5 : 1e-2) * b.grad_norm) << "step " << step;
    const StepCounters& c = a.counters;
    EXPECT_EQ(c.update_full_tensor.total(), want.bytes) << "step " << step;
    EXPECT_EQ(c.update_full_tensor.calls, want.calls);
    EXPECT_EQ(c.update_p2p.total(), 0u);
    EXPECT_EQ(c.update_exec_cost, want.flops);  // every unit on every rank
    EXPECT_EQ(c.copies.update_copy, eng.structured_update().last_run().bytes_copied);
    if (cfg.sw == so || so == 1) {
      EXPECT_EQ(c.copies.update_copy, want.copy);
      if (unit == UnitRule::kHead) {
        EXPECT_EQ(c.copies.update_copy, 0u);
      }
    }
    auto wa = eng.GatherMainWeights();
    auto wb = ref.GatherMainWeights();
    double worst = 0;
    std::string worst_name;
    for (auto& [name, va] : wa) {
      const auto& vb = wb.at(name);
      for (size_t i = 0; i < va.size(); ++i) {
        double d = std::abs(double(va[i]) - vb[i]);
        if (d > worst) worst = d, worst_name = name;
      }
    }
    if (std::getenv("SSHSDP_TEST_VERBOSE") && r == 0)
      fmt::print("full_tensor step {} worst {:.3g} ({})\n", step, worst, worst_name);
    EXPECT_LT(worst, weight_tol) << "step " << step << " worst param " << worst_name;
  }
  // Newton–Schulz redundancy: so × the mean per-rank share of the balanced p2p units.
  if (const UpdatePlan* p2p = ref.structured_update().plan(OptimizerKind::kMuon)) {
    double total = 0;
    for (const UnitPlacement& p : p2p->placements()) total += p.cost;
    EXPECT_NEAR(want.flops, total, 1e-9 * total);
  }
}

TEST(EngineMuonFullTensor, Fsdp2PerHeadFp32) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunFullTensorParity(l, GptOf(Unaligned()), 61, DType::kF32, UnitRule::kHead, DType::kF32, 2);
  }
}

TEST(EngineMuonFullTensor, Fsdp2PerMatrixAndBf16) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
  RunFullTensorParity(l, GptOf(Unaligned()), 61, DType::kF32, UnitRule::kMatrix, DType::kF32, 2);
  RunFullTensorParity(l, GptOf(Unaligned()), 61, DType::kBF16, UnitRule::kHead, DType::kBF16, 2);
}

// Stacked experts: FSDP2 gathers the whole [E, f, d] weight (dim 0 = experts across ranks) and
// runs Newton–Schulz per expert.
TEST(EngineMuonFullTensor, Fsdp2PerExpertMoe) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MoeConfig c;
  c.trunk.vocab = 61;
  c.trunk.seq_len = 8;
  c.trunk.d_model = 24;
  c.trunk.n_head = 3;
  c.trunk.n_layer = 2;
  c.n_expert = 4;
  c.top_k = 2;
  c.d_expert = 20;
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
  RunFullTensorParity(
      l, [c] { return std::make_unique<MoeGpt>(c); }, 61, DType::kF32, UnitRule::kHead, DType::kF32,
      2);
}

// The bench's ablation ladder with Muon: every step (⑥ full_tensor on flat shards included)
// trains like the reference; megatron-fsdp still refuses Muon, naming the parameter.
TEST(EngineMuonFullTensor, AblationLadderAndRefusal) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const Layout l = LayoutsFor(W).front();
  auto world = MpiCommunicator::World(l.rpn);
  const int r = world->rank();
  auto self = world->Split(r, 0);
  const EngineConfig base = MuonConfigFor(l, 2, DType::kF32, UnitRule::kHead, DType::kF32);
  for (const auto& [label, cfg] : AblationLadder(base)) {
    SCOPED_TRACE(label);
    Gpt model(Unaligned()), ref_model(Unaligned());
    Engine eng(model, *world, cfg);
    Engine ref(ref_model, *self,
               MuonConfigFor({1, 1, 1, 1}, 2 * W, DType::kF32, UnitRule::kHead, DType::kF32));
    eng.InitWeights(3);
    ref.InitWeights(3);
    int64_t step = 0;
    StepStats a{}, b{};
    for (; step < 2; ++step) {
      a = eng.Step(MakeBatch(&step, 2, W, r, 2, 8, 61));
      b = ref.Step(MakeBatch(&step, 2 * W, 1, 0, 2, 8, 61));
    }
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * b.loss);
    const bool full = cfg.redundancies.structured_updates == StructuredUpdates::kFullTensor;
    EXPECT_EQ(eng.structured_update().full_tensor() != nullptr, full);
    if (full) {
      EXPECT_EQ(a.counters.update_full_tensor.total(),
                ExpectFullTensor(model, cfg, eng.topology().so()).bytes);
    }
    auto wa = eng.GatherMainWeights();
    auto wb = ref.GatherMainWeights();
    double worst = 0;
    for (auto& [name, va] : wa)
      for (size_t i = 0; i < va.size(); ++i)
        worst = std::max(worst, std::abs(double(va[i]) - wb.at(name)[i]));
    EXPECT_LT(worst, 5e-6);
  }
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
