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
#include <map>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/testing/parity_harness.h"
#include "sshsdp/layout/shard_chain.h"
#include "sshsdp/models/moe.h"
#include "sshsdp/params/param_layout.h"

namespace sshsdp {
namespace {

using testing::BaseConfig;
using testing::Describe;
using testing::Layout;
using testing::LayoutsFor;  // registered at W = 1, 2, 4
using testing::WorldSize;

// Two MoE blocks, 4 SwiGLU experts of width 20, top-2 softmax, shared expert: sizes chosen
// so ZeRO-1 boundaries fall inside expert matrices (checked below, not assumed).
MoeConfig TestModel() {
  MoeConfig c = testing::TestMoe();
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

// `mc` from `l` against the one-rank reference with W·M microbatches.
testing::ParityCase MoeCase(const MoeConfig& mc, const Layout& l, const EngineConfig& cfg,
                            const EngineConfig& ref_cfg) {
  testing::ParityCase c;
  c.layout = l;
  c.make = testing::MoeOf(mc);
  c.cfg = cfg;
  c.ref_cfg = ref_cfg;
  c.vocab = mc.trunk.vocab;
  return c;
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

void RunParity(const MoeConfig& mc, const Layout& l, DType wdt, int M) {
  // As in engine_parity_test: fp32 differs by summation order only; bf16 runtime weights
  // can round a last-bit difference to the neighbouring bf16 value.
  testing::ParityCase c =
      MoeCase(mc, l, BaseConfig(l, M, wdt), BaseConfig(testing::kOneRank, M * WorldSize(), wdt));
  c.tol = testing::AdamWTolerances(wdt);
  testing::ParityRun run(c);
  if (l.so > 1) {
    std::vector<std::string> straddle = StraddlingExperts(run.model(), l, run.W(), wdt);
    ASSERT_FALSE(straddle.empty()) << "no expert matrix crosses a ZeRO-1 boundary";
    if (run.rank() == 0) ::testing::Test::RecordProperty("straddling_expert", straddle.front());
  }
  run.Run([&](const testing::StepDiff& d) {
    EXPECT_EQ(d.dist.counters.add_passes, 0u);
    EXPECT_EQ(d.dist.counters.bytes_copied, 0u);
  });
}

// One unit per update parameter: per expert.
EngineConfig MuonConfigFor(const Layout& l, int M, DType wdt, DType u_dtype) {
  return testing::MuonEngineConfig(l, M, wdt, UnitRule::kHead, u_dtype);
}

// Expert-wise Muon: the plan has one [out, in] unit per expert matrix (and none for the
// router, which AdamW updates); straddling experts are split units exchanged point to point.
void RunMuonParity(const MoeConfig& mc, const Layout& l, DType wdt, DType u_dtype, int M) {
  // As in engine_muon_parity_test: fp32 u differs by summation order only (amplified a little
  // by Newton–Schulz); bf16 u and bf16 weights can round differently, far below a wrong or
  // missing fragment (~lr·|v| ≈ 5e-3).
  testing::ParityCase c = MoeCase(mc, l, MuonConfigFor(l, M, wdt, u_dtype),
                                  MuonConfigFor(testing::kOneRank, M * WorldSize(), wdt, u_dtype));
  c.tol = testing::MuonTolerances(wdt == DType::kF32 && u_dtype == DType::kF32);
  testing::ParityRun run(c);
  Engine& eng = run.engine();
  const Model& model = run.model();

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
    std::vector<std::string> straddle = StraddlingExperts(model, l, run.W(), wdt);
    ASSERT_FALSE(straddle.empty());
    EXPECT_GT(plan->num_split(), 0);
  }

  run.Run([&](const testing::StepDiff&) {
    EXPECT_EQ(eng.structured_update().last_run().bytes_copied, 0u);
  });
}

TEST(MoeEngineParity, AllLayoutsFp32) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunParity(TestModel(), l, DType::kF32, 2);
  }
}

TEST(MoeEngineParity, AllLayoutsBf16) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunParity(TestModel(), l, DType::kBF16, 2);
  }
}

TEST(MoeEngineParity, SigmoidGeluEveryOtherBlock) {
  const int W = WorldSize();
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(Describe(W, l));
  RunParity(TestModelVariant(), l, DType::kF32, 3);
}

TEST(MoeEngineParity, ExpertWiseMuonFp32AllLayouts) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunMuonParity(TestModel(), l, DType::kF32, DType::kF32, 2);
  }
}

// The paper's configuration: bf16 runtime weights and bf16 u; GELU experts on the variant.
TEST(MoeEngineParity, ExpertWiseMuonBf16) {
  const int W = WorldSize();
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(Describe(W, l));
  RunMuonParity(TestModel(), l, DType::kBF16, DType::kBF16, 2);
  RunMuonParity(TestModelVariant(), l, DType::kF32, DType::kF32, 2);
}

// Experts 2 and 3 of every MoE block receive no tokens (coordinate 0 of every embedding
// dominates and the router's column 0 ranks experts 0 > 1 >> 2 > 3): their gradients are
// explicit zeros on every rank, so AdamW moves them only by weight decay.
TEST(MoeEngineParity, ExpertsWithoutTokensGetZeroGradients) {
  const int W = WorldSize();
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(Describe(W, l));
  const MoeConfig mc = TestModel();
  const int M = 2;
  testing::ParityCase c = MoeCase(mc, l, BaseConfig(l, M, DType::kF32),
                                  BaseConfig(testing::kOneRank, M * W, DType::kF32));
  c.cfg.adamw.weight_decay = 0.1f;
  c.ref_cfg.adamw.weight_decay = 0.1f;
  c.steps = 2;
  c.seed = 3;
  c.tol = {1e-5, testing::kNotCompared, 2e-5};
  testing::ParityRun run(c);
  Engine& eng = run.engine();
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
  run.ref().LoadMainWeights(init);
  MoeGpt& model = run.model_as<MoeGpt>();
  run.Run([&](const testing::StepDiff&) {
    for (int blk = 0; blk < mc.trunk.n_layer; ++blk) {
      EXPECT_EQ(model.ExpertTokens(blk), (std::vector<int64_t>{16, 16, 0, 0})) << "block " << blk;
    }
  });
  auto after = eng.GatherMainWeights();
  const float lr = c.cfg.adamw.lr, decay = (1 - lr * 0.1f) * (1 - lr * 0.1f);
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
  const int W = WorldSize();
  if (l.so > 1) {
    std::vector<std::string> straddle = StraddlingExperts(MoeGpt(mc), l, W, DType::kE4M3);
    ASSERT_FALSE(straddle.empty()) << "no expert matrix crosses a ZeRO-1 boundary";
  }
  testing::ParityCase c = MoeCase(mc, l, BaseConfig(l, M, DType::kE4M3),
                                  BaseConfig(testing::kOneRank, M * W, DType::kE4M3));
  c.cfg.scale_layout = sl;
  c.ref_cfg.scale_layout = sl;
  c.tol_at = testing::MxTolerances;
  testing::ParityRun run(c);
  Engine &eng = run.engine(), &ref = run.ref();
  MoeGpt& model = run.model_as<MoeGpt>();

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

  run.Run([&](const testing::StepDiff& d) {
    if (l.so > 1) {
      EXPECT_GT(d.dist.counters.mx_split_bands, 0u) << "step " << d.step;
    }
  });
}

TEST(MoeEngineParity, MxExpertWeightsAllLayouts) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunMxParity(TestModel(), l, 2, ScaleLayout::kCublasSwizzle);
  }
}

// GELU experts, sigmoid gating, a dense (bf16) block before the MoE block, DeepGEMM scales;
// 40-row w1 experts (two bands each, the second partial); a shared expert (MX too) so that
// shard boundaries do not fall between w1 and w2.
TEST(MoeEngineParity, MxExpertWeightsVariant) {
  const int W = WorldSize();
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(Describe(W, l));
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
