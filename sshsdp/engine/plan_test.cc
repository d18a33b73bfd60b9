// RunPlan against real multi-rank steps (issue 18): for every layout of the parity tests at
// this world size (HSDP replicas, sw < sg, so > sg, uneven shards, simulated nodes) and for
// AdamW and Muon per head / per matrix, bf16 / fp32 / MXFP8 runtime weights, the bf16sr
// reduction, weight reuse off (keep-gathered, no prefetch) and the MoE model (with dense blocks
// between MoE blocks too: the transient pool's steady state after several steps), each rank's
// plan — computed in this process without communicating — equals what its engine counted in
// a real step: runtime and update bytes intra / inter node, runtime calls and local copies,
// gathers, point-to-point bytes, Newton–Schulz cost, MXFP8 G bytes, and the peak of every
// memory category the engine accounts (activations, the model's own, excepted).
#include "sshsdp/engine/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/engine_internal.h"
#include "sshsdp/engine/mx_weights.h"
#include "sshsdp/engine/presets.h"
#include "sshsdp/engine/testing/parity_harness.h"
#include "sshsdp/models/llama.h"

namespace sshsdp {
namespace {

using testing::Layout;

struct PlanCase {
  std::string name;
  testing::ModelFactory make;
  std::function<EngineConfig(const Layout&)> cfg;
};

void ExpectBytes(const CommCounters& got, const CommCounters& want, const char* what) {
  EXPECT_EQ(got.intra_node_bytes, want.intra_node_bytes) << what << " intra-node bytes";
  EXPECT_EQ(got.inter_node_bytes, want.inter_node_bytes) << what << " inter-node bytes";
}

void CheckCase(const PlanCase& c, const Layout& l) {
  const int W = testing::WorldSize();
  SCOPED_TRACE(c.name + " " + testing::Describe(W, l));
  auto world = MpiCommunicator::World(l.rpn);
  const EngineConfig cfg = c.cfg(l);
  std::unique_ptr<Model> model = c.make();
  const RunPlan plan = PlanRun(*model, W, cfg);  // no communication
  ASSERT_EQ(plan.ranks.size(), static_cast<size_t>(W));
  const RankPlan& rp = plan.ranks[world->rank()];
  EXPECT_EQ(rp.rank, world->rank());

  Engine eng(*model, *world, cfg);
  eng.InitWeights(5);
  int64_t step = 0;
  const BatchFn batch = testing::MakeBatch(&step, cfg.microbatches, W, world->rank(),
                                           cfg.batch_size, cfg.seq_len, 61);
  for (int s = 0; s < 3; ++s) {  // later steps run with every buffer already in place
    const StepStats st = eng.Step(batch);
    const StepCounters& k = st.counters;
    ExpectBytes(k.runtime_comm, rp.runtime_comm, "runtime");
    EXPECT_EQ(k.runtime_comm.calls, rp.runtime_comm.calls);
    EXPECT_EQ(k.runtime_comm.local_copy_bytes, rp.runtime_comm.local_copy_bytes);
    ExpectBytes(k.update_comm, rp.update_comm, "update");
    ExpectBytes(k.update_p2p, rp.update_p2p, "update point-to-point");
    EXPECT_EQ(k.gathers, rp.gathers);
    EXPECT_DOUBLE_EQ(k.update_exec_cost, rp.update_exec_cost);
    EXPECT_EQ(k.mx_p2p_bytes, rp.mx_p2p_bytes);
  }
  std::map<std::string, uint64_t> accounted;
  for (const auto& [cat, u] : eng.memory().by_category())
    if (cat != "activations" && u.peak > 0) accounted[cat] = u.peak;
  EXPECT_EQ(accounted, rp.memory);
}

std::vector<PlanCase> Cases() {
  using testing::BaseConfig;
  using testing::GptOf;
  using testing::MuonEngineConfig;
  const testing::ModelFactory gpt = GptOf(testing::TestGpt());
  std::vector<PlanCase> out;
  out.push_back(
      {"adamw bf16 M=2", gpt, [](const Layout& l) { return BaseConfig(l, 2, DType::kBF16); }});
  out.push_back(
      {"adamw fp32 M=1", gpt, [](const Layout& l) { return BaseConfig(l, 1, DType::kF32); }});
  out.push_back({"muon per head bf16", gpt, [](const Layout& l) {
                   return MuonEngineConfig(l, 2, DType::kBF16, UnitRule::kHead, DType::kBF16);
                 }});
  out.push_back({"muon per matrix fp32", gpt, [](const Layout& l) {
                   return MuonEngineConfig(l, 1, DType::kF32, UnitRule::kMatrix, DType::kF32);
                 }});
  out.push_back({"mxfp8", gpt, [](const Layout& l) { return BaseConfig(l, 2, DType::kE4M3); }});
  out.push_back({"bf16sr, keep gathered, no prefetch", gpt, [](const Layout& l) {
                   EngineConfig c = BaseConfig(l, 3, DType::kBF16);
                   c.reduce = ReduceMode::kBf16Sr;
                   c.reshard_after_forward = false;
                   c.prefetch = false;
                   return c;
                 }});
  out.push_back({"moe muon per expert", testing::MoeOf(testing::TestMoe()), [](const Layout& l) {
                   return MuonEngineConfig(l, 2, DType::kBF16, UnitRule::kHead, DType::kBF16);
                 }});
  // Groups of three sizes (embedding, dense block, MoE block): a later step's best fit among
  // the pool's kept blocks needs a block the first step's did not.
  MoeConfig mixed = testing::TestMoe();
  mixed.trunk.n_layer = 3;
  mixed.moe_every = 2;
  out.push_back({"moe and dense blocks fp32", testing::MoeOf(mixed),
                 [](const Layout& l) { return BaseConfig(l, 1, DType::kF32); }});
  // Tied embeddings (a Qwen3): group 0 held from its forward to its backward, its gradient
  // from the head's backward to its own.
  LlamaConfig tied;
  tied.vocab = 61, tied.seq_len = 16, tied.d_model = 24, tied.n_head = 3, tied.n_kv_head = 1;
  tied.head_dim = 8, tied.d_ff = 40, tied.tied = true;
  out.push_back({"tied qwen3 bf16 M=2", [tied] { return std::make_unique<Llama>(tied); },
                 [](const Layout& l) { return BaseConfig(l, 2, DType::kBF16); }});
  return out;
}

TEST(RunPlan, EqualsTheCountersAndMemoryOfRealSteps) {
  const int W = testing::WorldSize();
  const std::vector<Layout> layouts = testing::LayoutsFor(W);
  ASSERT_FALSE(layouts.empty()) << "no layouts at world size " << W;
  for (const PlanCase& c : Cases())
    for (const Layout& l : layouts) CheckCase(c, l);
}

TEST(RunPlan, RefusesWhatTheEngineRefusesAndWhatItDoesNotModel) {
  const int W = testing::WorldSize();
  Gpt model(testing::TestGpt());
  EngineConfig bad = testing::BaseConfig({1, 1, 1, 1}, 1, DType::kBF16);
  bad.sw = W + 1;  // not a divisor chain of W
  EXPECT_THROW(PlanRun(model, W, bad), LayoutError);
  EngineConfig lr = testing::BaseConfig({1, 1, W, W}, 1, DType::kBF16);
  lr.adamw.lr = -1;
  EXPECT_THROW(PlanRun(model, W, lr), ConfigError);
  EngineConfig direct = testing::BaseConfig({1, 1, W, W}, 1, DType::kBF16);
  direct.comm_path = CommPath::kDirect;
  EXPECT_THROW(PlanRun(model, W, direct), ConfigError);
  EngineConfig fsdp2 = testing::BaseConfig({1, 1, W, W}, 1, DType::kBF16);
  ApplyPreset("fsdp2", &fsdp2);
  EXPECT_THROW(PlanRun(model, W, fsdp2), ConfigError);
}

// The parts the plan builds without communicators size themselves but refuse to run: a plan
// can never move bytes or update weights by mistake.
TEST(RunPlan, PlanOnlyPartsRefuseToRun) {
  const int W = testing::WorldSize();
  Gpt model(testing::TestGpt());
  EngineConfig cfg =
      testing::MuonEngineConfig({1, 1, W, W}, 1, DType::kE4M3, UnitRule::kHead, DType::kBF16);
  const std::unique_ptr<Backend> cpu = MakeCpuBackend();
  cfg.backend = cpu.get();
  const Topology topo(W, W, 1, 1, W);
  std::vector<std::unique_ptr<RuntimeGroup>> groups;
  for (int g = 0; g < model.num_groups(); ++g)
    groups.push_back(PlanRuntimeGroup(model, g, cfg, topo, 0));
  std::vector<UpdateGroupView> views;
  for (auto& g : groups) views.push_back(UpdateViewOf(*g));
  StructuredUpdate update(views, UpdateOptionsOf(cfg), 0);
  ASSERT_NE(update.plan(OptimizerKind::kMuon), nullptr);
  EXPECT_GT(update.peak_temporary_bytes(), 0u);
  EXPECT_THROW(update.Run({}, ScalarState{}), PlanError);
  std::unique_ptr<MxWeights> mx =
      MakeMxWeights(groups, topo, 0, cfg.scale_layout, nullptr, nullptr, *cpu);
  ASSERT_NE(mx->plan(), nullptr);
  EXPECT_THROW(mx->Quantize({}, {}), PlanError);
  UpdateOptions full = UpdateOptionsOf(cfg);
  full.full_tensor = true;  // ⑥ needs the ZeRO-1 group's communicator: no plan-only form
  EXPECT_THROW(StructuredUpdate(views, full, 0), PlanError);
}

// Planning a world builds one UpdatePlan per optimizer and HSDP replica, not one per rank (the
// ranks of a replica share it): what keeps `sshsdp plan` from growing with the square of the
// world.
TEST(RunPlan, RanksOfAReplicaShareOneUpdatePlan) {
  Gpt model(testing::TestGpt());
  EngineConfig cfg =
      testing::MuonEngineConfig({1, 2, 2, 8}, 1, DType::kBF16, UnitRule::kHead, DType::kBF16);
  const std::unique_ptr<Backend> cpu = MakeCpuBackend();
  cfg.backend = cpu.get();
  const Topology topo(8, 8, 1, 2, 2);  // 4 replicas of 2 ranks
  StructuredUpdate::PlanCache cache;
  std::vector<const UpdatePlan*> muon;
  for (int r = 0; r < topo.world(); ++r) {
    std::vector<std::unique_ptr<RuntimeGroup>> groups;
    for (int g = 0; g < model.num_groups(); ++g)
      groups.push_back(PlanRuntimeGroup(model, g, cfg, topo, r));
    std::vector<UpdateGroupView> views;
    for (auto& g : groups) views.push_back(UpdateViewOf(*g));
    StructuredUpdate update(views, UpdateOptionsOf(cfg), r, &cache);
    muon.push_back(update.plan(OptimizerKind::kMuon));
    ASSERT_NE(muon.back(), nullptr);
    const std::vector<int>& ranks = muon.back()->ranks();
    EXPECT_NE(std::find(ranks.begin(), ranks.end(), r), ranks.end()) << r;
  }
  EXPECT_EQ(cache.size(), 2u * topo.num_replicas());  // AdamW and Muon, per replica
  for (int r = 0; r < topo.world(); ++r)
    for (int q = 0; q < topo.world(); ++q)
      EXPECT_EQ(muon[r] == muon[q], topo.Coord(r).d == topo.Coord(q).d) << r << " " << q;
}

}  // namespace
}  // namespace sshsdp
