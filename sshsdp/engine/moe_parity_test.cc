// MoE engine parity (the paper's correctness method applied to the MoE reference model):
// multi-rank training of MoeGpt for several steps equals single-process training of the
// same logical update — same model, same global batch per step, same initial weights — on
// several (sw, sg, so) layouts, fp32 and bf16 runtime weights, several microbatches, HSDP
// replicas and simulated nodes, with AdamW and with expert-wise Muon. Every layout with
// so > 1 is checked (through ShardChain) to cut at least one expert's matrix across a ZeRO-1
// shard boundary, so an expert's update unit is split between ranks; with Muon that unit is
// gathered point to point by one execution rank (asserted through the update plan), each
// expert's [out, in] matrix is one Newton–Schulz unit and the router stays on AdamW
// (muon_eligible = false). A further test forces routing so that two experts receive no
// tokens on any rank: their packed-gradient slices must be written as explicit zeros (the
// gradient blocks of sg > 1 are recycled, never cleared), so they change only by weight
// decay, identically to the reference. MXFP8 expert weights (MoeConfig::expert_group): only
// the expert groups are MX (the router, attention and norm gains stay bf16, checked through
// GatherMxWeights); training matches the reference on every layout, with expert matrices
// (one 32-row band each) straddling ZeRO-1 shards so their G bands are split between ranks;
// an MoE model without expert groups is refused. The reference runs in the same process on a
// one-rank communicator with W·M microbatches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/testing/parity_data.h"
#include "sshsdp/layout/shard_chain.h"
#include "sshsdp/models/moe.h"
#include "sshsdp/params/param_layout.h"

namespace sshsdp {
namespace {

using testing::MakeBatch;

struct Layout {
  int sw, sg, so, rpn;
};

std::vector<Layout> LayoutsFor(int W) {
  // SSHSDP_TEST_LAYOUT="sw,sg,so,rpn" runs one layout (for debugging a failure).
  if (const char* e = std::getenv("SSHSDP_TEST_LAYOUT")) {
    Layout l{};
    if (std::sscanf(e, "%d,%d,%d,%d", &l.sw, &l.sg, &l.so, &l.rpn) == 4) return {l};
  }
  switch (W) {
    case 1:
      return {{1, 1, 1, 1}};
    case 2:
      return {{2, 2, 2, 2}, {1, 1, 2, 1}};
    case 4:
      return {{2, 2, 4, 2}, {1, 2, 4, 4}, {4, 4, 4, 4}, {2, 2, 2, 2}};
    default:
      return {};
  }
}

// Two MoE blocks, 4 SwiGLU experts of width 20, top-2 softmax, shared expert: sizes chosen
// so ZeRO-1 boundaries fall inside expert matrices (checked below, not assumed).
MoeConfig TestModel() {
  MoeConfig c;
  c.trunk.vocab = 61;
  c.trunk.seq_len = 8;
  c.trunk.d_model = 24;
  c.trunk.n_head = 3;
  c.trunk.n_layer = 2;
  c.n_expert = 4;
  c.top_k = 2;
  c.d_expert = 20;
  c.shared_expert = true;
  c.d_shared = 12;
  c.aux_loss_weight = 0.01f;
  return c;
}

// Sigmoid gating without renormalisation, GELU experts, only block 1 is MoE.
MoeConfig TestModelVariant() {
  MoeConfig c = TestModel();
  c.gating = Gating::kSigmoid;
  c.renormalize = false;
  c.expert_mlp = ExpertMlp::kGelu;
  c.shared_expert = false;
  c.moe_every = 2;
  return c;
}

EngineConfig BaseConfig(const Layout& l, int M, DType wdt) {
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
  cfg.clip_norm = 0.5f;
  return cfg;
}

// Names of expert matrices ("blocks.l.moe.wX.eY") whose ZeRO-1 owners include more than one
// rank in this layout.
std::vector<std::string> StraddlingExperts(const Model& model, const Layout& l, int W, DType wdt) {
  Topology topo(W, l.rpn, l.sw, l.sg, l.so);
  std::vector<std::string> out;
  for (int g = 0; g < model.num_groups(); ++g) {
    GroupLayout L = BuildGroupLayout(g, model.GroupParams(g), wdt, static_cast<size_t>(l.so));
    ShardChain chain(L.list, topo, 0);
    for (const UpdateParam& u : L.update) {
      if (u.name.find(".moe.w") == std::string::npos) continue;
      auto owners = chain.Zero1Owners(u.member, 0, NumElements(u.shape));
      for (const OwnedFragment& o : owners) {
        if (o.rank != owners.front().rank) {
          out.push_back(u.name);
          break;
        }
      }
    }
  }
  return out;
}

void ExpectSameWeights(Engine& a, Engine& b, double tol, int64_t step) {
  auto wa = a.GatherMainWeights();
  auto wb = b.GatherMainWeights();
  ASSERT_EQ(wa.size(), wb.size());
  double worst = 0;
  std::string worst_name;
  for (auto& [name, va] : wa) {
    const auto& vb = wb.at(name);
    ASSERT_EQ(va.size(), vb.size()) << name;
    for (size_t i = 0; i < va.size(); ++i) {
      double d = std::abs(double(va[i]) - vb[i]);
      if (d > worst) worst = d, worst_name = name;
    }
  }
  EXPECT_LT(worst, tol) << "step " << step << " worst param " << worst_name;
}

void RunParity(const MoeConfig& mc, const Layout& l, DType wdt, int M) {
  auto world = MpiCommunicator::World(l.rpn);
  const int W = world->size(), r = world->rank();
  auto self = world->Split(r, 0);
  MoeGpt model(mc), ref_model(mc);
  if (l.so > 1) {
    std::vector<std::string> straddle = StraddlingExperts(model, l, W, wdt);
    ASSERT_FALSE(straddle.empty()) << "no expert matrix crosses a ZeRO-1 boundary";
    if (r == 0) ::testing::Test::RecordProperty("straddling_expert", straddle.front());
  }
  EngineConfig cfg = BaseConfig(l, M, wdt);
  Engine eng(model, *world, cfg);
  Engine ref(ref_model, *self, BaseConfig({1, 1, 1, 1}, M * W, wdt));
  eng.InitWeights(7);
  ref.InitWeights(7);
  int64_t step = 0;
  BatchFn batch = MakeBatch(&step, M, W, r, cfg.batch_size, cfg.seq_len, mc.trunk.vocab);
  BatchFn rbatch = MakeBatch(&step, M * W, 1, 0, cfg.batch_size, cfg.seq_len, mc.trunk.vocab);
  // As in engine_parity_test: fp32 differs by summation order only; bf16 runtime weights
  // can round a last-bit difference to the neighbouring bf16 value.
  const bool f32 = wdt == DType::kF32;
  const double loss_tol = f32 ? 1e-5 : 2e-4, norm_tol = f32 ? 1e-4 : 2e-3,
               weight_tol = f32 ? 2e-5 : 3e-4;
  for (; step < 3; ++step) {
    StepStats a = eng.Step(batch);
    StepStats b = ref.Step(rbatch);
    EXPECT_NEAR(a.loss, b.loss, loss_tol * std::abs(b.loss)) << "step " << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, norm_tol * b.grad_norm) << "step " << step;
    EXPECT_EQ(a.counters.add_passes, 0u);
    EXPECT_EQ(a.counters.bytes_copied, 0u);
    ExpectSameWeights(eng, ref, weight_tol, step);
  }
}

EngineConfig MuonConfigFor(const Layout& l, int M, DType wdt, DType u_dtype) {
  EngineConfig cfg = BaseConfig(l, M, wdt);
  cfg.optimizer = OptimizerKind::kMuon;
  cfg.muon_unit = UnitRule::kHead;  // one unit per update parameter: per expert
  cfg.muon.lr = 0.02f;
  cfg.muon.weight_decay = 0.1f;
  cfg.muon.u_dtype = u_dtype;
  return cfg;
}

// Expert-wise Muon: the plan has one [out, in] unit per expert matrix (and none for the
// router, which AdamW updates); straddling experts are split units exchanged point to point.
void RunMuonParity(const MoeConfig& mc, const Layout& l, DType wdt, DType u_dtype, int M) {
  auto world = MpiCommunicator::World(l.rpn);
  const int W = world->size(), r = world->rank();
  auto self = world->Split(r, 0);
  MoeGpt model(mc), ref_model(mc);
  EngineConfig cfg = MuonConfigFor(l, M, wdt, u_dtype);
  Engine eng(model, *world, cfg);
  Engine ref(ref_model, *self, MuonConfigFor({1, 1, 1, 1}, M * W, wdt, u_dtype));
  eng.InitWeights(7);
  ref.InitWeights(7);

  const UpdatePlan* plan = eng.structured_update().plan(OptimizerKind::kMuon);
  ASSERT_NE(plan, nullptr);
  std::map<std::string, const UpdateUnit*> units;
  for (const UpdateUnit& u : plan->units()) units[u.name] = &u;
  const int64_t d = mc.trunk.d_model, f = mc.expert_ff();
  const bool swiglu = mc.expert_mlp == ExpertMlp::kSwiGLU;
  for (int blk = 0; blk < mc.trunk.n_layer; ++blk) {
    if (!mc.IsMoeLayer(blk)) continue;
    for (const char* kind : {"w1", "w2", "w3"}) {
      if (std::string(kind) == "w3" && !swiglu) continue;
      for (int e = 0; e < mc.n_expert; ++e) {
        const std::string name = fmt::format("blocks.{}.moe.{}.e{}", blk, kind, e);
        auto it = units.find(name);
        ASSERT_NE(it, units.end()) << name << " is not a Muon unit";
        EXPECT_EQ(it->second->rows, std::string(kind) == "w2" ? d : f) << name;
        EXPECT_EQ(it->second->cols, std::string(kind) == "w2" ? f : d) << name;
      }
    }
    const std::string router = fmt::format("blocks.{}.moe.router", blk);
    EXPECT_EQ(units.count(router), 0u) << "the router must stay on AdamW";
    const GroupLayout L =
        BuildGroupLayout(blk + 1, model.GroupParams(blk + 1), wdt, static_cast<size_t>(l.so));
    const int member = L.list.Find(router);
    ASSERT_GE(member, 0);
    EXPECT_EQ(eng.structured_update().optimizers()[blk + 1][member], OptimizerKind::kAdamW);
  }
  if (l.so > 1) {
    // Some straddling expert is a split unit of the plan.
    std::vector<std::string> straddle = StraddlingExperts(model, l, W, wdt);
    ASSERT_FALSE(straddle.empty());
    EXPECT_GT(plan->num_split(), 0);
  }

  int64_t step = 0;
  BatchFn batch = MakeBatch(&step, M, W, r, cfg.batch_size, cfg.seq_len, mc.trunk.vocab);
  BatchFn rbatch = MakeBatch(&step, M * W, 1, 0, cfg.batch_size, cfg.seq_len, mc.trunk.vocab);
  // As in engine_muon_parity_test: fp32 u differs by summation order only (amplified a little
  // by Newton–Schulz); bf16 u and bf16 weights can round differently, far below a wrong or
  // missing fragment (~lr·|v| ≈ 5e-3).
  const bool exact = wdt == DType::kF32 && u_dtype == DType::kF32;
  const double loss_tol = exact ? 1e-6 : 1e-3, weight_tol = exact ? 5e-6 : 2e-3;
  for (; step < 3; ++step) {
    StepStats a = eng.Step(batch);
    StepStats b = ref.Step(rbatch);
    EXPECT_NEAR(a.loss, b.loss, loss_tol * std::abs(b.loss)) << "step " << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, (exact ? 1e-5 : 1e-2) * b.grad_norm) << "step " << step;
    EXPECT_EQ(eng.structured_update().last_run().bytes_copied, 0u);
    ExpectSameWeights(eng, ref, weight_tol, step);
  }
}

TEST(MoeEngineParity, AllLayoutsFp32) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunParity(TestModel(), l, DType::kF32, 2);
  }
}

TEST(MoeEngineParity, AllLayoutsBf16) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunParity(TestModel(), l, DType::kBF16, 2);
  }
}

TEST(MoeEngineParity, SigmoidGeluEveryOtherBlock) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
  RunParity(TestModelVariant(), l, DType::kF32, 3);
}

TEST(MoeEngineParity, ExpertWiseMuonFp32AllLayouts) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunMuonParity(TestModel(), l, DType::kF32, DType::kF32, 2);
  }
}

// The paper's configuration: bf16 runtime weights and bf16 u; GELU experts on the variant.
TEST(MoeEngineParity, ExpertWiseMuonBf16) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
  RunMuonParity(TestModel(), l, DType::kBF16, DType::kBF16, 2);
  RunMuonParity(TestModelVariant(), l, DType::kF32, DType::kF32, 2);
}

// Experts 2 and 3 of every MoE block receive no tokens (coordinate 0 of every embedding
// dominates and the router's column 0 ranks experts 0 > 1 >> 2 > 3): their gradients are
// explicit zeros on every rank, so AdamW moves them only by weight decay.
TEST(MoeEngineParity, ExpertsWithoutTokensGetZeroGradients) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
  const MoeConfig mc = TestModel();
  auto world = MpiCommunicator::World(l.rpn);
  const int r = world->rank();
  auto self = world->Split(r, 0);
  MoeGpt model(mc), ref_model(mc);
  const int M = 2;
  EngineConfig cfg = BaseConfig(l, M, DType::kF32);
  cfg.adamw.weight_decay = 0.1f;
  Engine eng(model, *world, cfg);
  EngineConfig rcfg = BaseConfig({1, 1, 1, 1}, M * W, DType::kF32);
  rcfg.adamw.weight_decay = 0.1f;
  Engine ref(ref_model, *self, rcfg);
  eng.InitWeights(3);
  auto init = eng.GatherMainWeights();
  const int d = mc.trunk.d_model;
  std::vector<float>& wte = init.at("wte");
  for (size_t row = 0; row < wte.size() / d; ++row) wte[row * d] = 30.0f;
  const float col0[] = {1.0f, 0.8f, -1.0f, -2.0f};
  for (int blk = 0; blk < mc.trunk.n_layer; ++blk) {
    std::vector<float>& wr = init.at(fmt::format("blocks.{}.moe.router", blk));
    for (int e = 0; e < mc.n_expert; ++e) wr[e * d] = col0[e];
  }
  eng.LoadMainWeights(init);
  ref.LoadMainWeights(init);
  int64_t step = 0;
  BatchFn batch = MakeBatch(&step, M, W, r, cfg.batch_size, cfg.seq_len, mc.trunk.vocab);
  BatchFn rbatch = MakeBatch(&step, M * W, 1, 0, cfg.batch_size, cfg.seq_len, mc.trunk.vocab);
  for (; step < 2; ++step) {
    StepStats a = eng.Step(batch);
    StepStats b = ref.Step(rbatch);
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(b.loss)) << "step " << step;
    ExpectSameWeights(eng, ref, 2e-5, step);
    for (int blk = 0; blk < mc.trunk.n_layer; ++blk) {
      EXPECT_EQ(model.ExpertTokens(blk), (std::vector<int64_t>{16, 16, 0, 0})) << "block " << blk;
    }
  }
  auto after = eng.GatherMainWeights();
  const float lr = cfg.adamw.lr, decay = (1 - lr * 0.1f) * (1 - lr * 0.1f);
  for (int blk = 0; blk < mc.trunk.n_layer; ++blk) {
    for (const char* kind : {"w1", "w2", "w3"}) {
      for (int e = 0; e < mc.n_expert; ++e) {
        const std::string name = fmt::format("blocks.{}.moe.{}.e{}", blk, kind, e);
        const std::vector<float>&w0 = init.at(name), &w1 = after.at(name);
        double moved = 0;
        for (size_t i = 0; i < w0.size(); ++i) moved += std::abs(w1[i] - w0[i] * decay);
        if (e >= 2) {
          EXPECT_LT(moved, 1e-8 * w0.size()) << name << " moved beyond weight decay";
        } else {
          EXPECT_GT(moved, 1e-5 * w0.size()) << name << " did not train";
        }
      }
    }
  }
}

// MXFP8 expert weights: the sharded engine quantizes every expert's own 32x32 blocks at
// ZeRO-1 (bands split between ranks where a matrix straddles a shard) to the same codes as the
// single-process engine. Step 1 runs on identical weights (only the loss/gradient summation
// order differs); later main weights differ in their last fp32 bits and can land on the
// neighbouring E4M3 code, hence the looser tolerance (as in mx_weights_test).
void RunMxParity(MoeConfig mc, const Layout& l, int M, ScaleLayout sl) {
  mc.expert_group = true;
  auto world = MpiCommunicator::World(l.rpn);
  const int W = world->size(), r = world->rank();
  auto self = world->Split(r, 0);
  MoeGpt model(mc), ref_model(mc);
  if (l.so > 1) {
    std::vector<std::string> straddle = StraddlingExperts(model, l, W, DType::kE4M3);
    ASSERT_FALSE(straddle.empty()) << "no expert matrix crosses a ZeRO-1 boundary";
  }
  EngineConfig cfg = BaseConfig(l, M, DType::kE4M3);
  cfg.scale_layout = sl;
  EngineConfig rcfg = BaseConfig({1, 1, 1, 1}, M * W, DType::kE4M3);
  rcfg.scale_layout = sl;
  Engine eng(model, *world, cfg);
  Engine ref(ref_model, *self, rcfg);
  eng.InitWeights(7);
  ref.InitWeights(7);

  // Exactly the expert runtime weights are MX; the codes and scales equal the reference's.
  auto mx = eng.GatherMxWeights();
  auto rmx = ref.GatherMxWeights();
  std::vector<std::string> want;
  for (int blk = 0; blk < mc.trunk.n_layer; ++blk) {
    if (!mc.IsMoeLayer(blk)) continue;
    for (const RuntimeParamSpec& rp : model.GroupParams(model.ExpertGroup(blk)))
      want.push_back(rp.name);
  }
  std::vector<std::string> got;
  for (auto& [name, w] : mx) {
    got.push_back(name);
    EXPECT_EQ(w.codes, rmx.at(name).codes) << name;
    EXPECT_EQ(w.scales, rmx.at(name).scales) << name;
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(mx.count("blocks.1.moe.router"), 0u);

  int64_t step = 0;
  BatchFn batch = MakeBatch(&step, M, W, r, cfg.batch_size, cfg.seq_len, mc.trunk.vocab);
  BatchFn rbatch = MakeBatch(&step, M * W, 1, 0, cfg.batch_size, cfg.seq_len, mc.trunk.vocab);
  for (; step < 3; ++step) {
    StepStats a = eng.Step(batch);
    StepStats b = ref.Step(rbatch);
    const double tol = step == 0 ? 1e-5 : 2e-3;
    EXPECT_NEAR(a.loss, b.loss, tol * std::abs(b.loss)) << "step " << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, (step == 0 ? 1e-4 : 2e-2) * b.grad_norm)
        << "step " << step;
    if (l.so > 1) {
      EXPECT_GT(a.counters.mx_split_bands, 0u) << "step " << step;
    }
    ExpectSameWeights(eng, ref, 1e-3, step);  // << lr = 3e-3 per step
  }
}

TEST(MoeEngineParity, MxExpertWeightsAllLayouts) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunMxParity(TestModel(), l, 2, ScaleLayout::kCublasSwizzle);
  }
}

// GELU experts, sigmoid gating, a dense (bf16) block before the MoE block, DeepGEMM scales;
// 40-row w1 experts (two bands each, the second partial); a shared expert (MX too) so that
// shard boundaries do not fall between w1 and w2.
TEST(MoeEngineParity, MxExpertWeightsVariant) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
  MoeConfig mc = TestModelVariant();
  mc.shared_expert = true;
  mc.d_expert = 40;
  RunMxParity(mc, l, 2, ScaleLayout::kDeepGemmMnMajor);
}

// Without expert groups the MoE block's single flat buffer would hold the router (and the
// attention, norm gains) too: refused at construction, on every rank alike.
TEST(MoeEngineParity, MxWithoutExpertGroupsIsRefused) {
  auto world = MpiCommunicator::World(1);
  MoeGpt model(TestModel());
  EngineConfig cfg = BaseConfig({1, 1, world->size(), 1}, 1, DType::kE4M3);
  try {
    Engine eng(model, *world, cfg);
    ADD_FAILURE() << "MoE without expert groups accepted --weight-dtype mxfp8";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expert_group"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sshsdp
