// Baselines as switches (redundancy.h, presets.h): every framework preset of the one engine
// must compute the same training as the single-process reference (a baseline that computes
// something else is not a baseline), on several layouts and world sizes, and its counters
// must show exactly the redundant work it pays — bytes copied by path, casts per gather,
// separate add passes, communicated bytes of its padded layout — by closed formulas. The
// reference harness mirrors engine_parity_test.cc (same model, data and tolerances).
#include <gtest/gtest.h>

#include <cmath>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/presets.h"
#include "sshsdp/engine/testing/parity_harness.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {
namespace {

using testing::BaseConfig;
using testing::Describe;
using testing::Layout;
using testing::MakeBatch;
using testing::TestGpt;
using testing::WorldSize;

// Fewer layouts than engine_parity_test: every preset runs on each.
std::vector<Layout> LayoutsFor(int W) {
  return testing::LayoutsFrom(W, {{1, {{1, 1, 1, 1}}},
                                  {2, {{2, 2, 2, 2}, {1, 1, 2, 1}}},
                                  {3, {{3, 3, 3, 3}}},
                                  {4, {{2, 2, 4, 2}, {4, 4, 4, 4}, {1, 2, 4, 4}}}});
}

// What one step must count, from the layout the engine builds (closed formulas).
struct Expected {
  uint64_t ag = 0, rs = 0;  // runtime bytes sent
  CopyBytes copies;
  uint64_t weight_preps = 0, add_passes = 0, fused = 0;
  uint64_t collective_copy = 0;  // own shard copied by out-of-place all-gathers
};

Expected Expect(const Model& model, const EngineConfig& cfg, int M, bool reshard) {
  const Redundancies& R = cfg.redundancies;
  const int so = R.replicate_optimizer ? cfg.sg : cfg.so;
  const DType wdt = cfg.weight_dtype;
  const uint64_t ws = DTypeSize(wdt);
  const bool cast = R.cast_every_gather && wdt == DType::kBF16;
  const bool gather = cfg.sw > 1 || cast || R.weight_copies;
  const bool through_rs =
      cfg.sg > 1 || cfg.shard_layout != ShardLayout::kFlat || R.grad_copies || R.separate_add;
  Expected e;
  const int n = model.num_groups();
  for (int g = 0; g < n; ++g) {
    EngineLayout E = BuildEngineLayout(cfg.shard_layout, g, model.GroupParams(g), wdt, cfg.sw, so);
    const GroupLayout& L = E.layout;
    const uint64_t padded = L.list.padded_numel();
    const uint64_t uses = reshard ? (g + 1 < n ? 2 : 1) : 1;  // forward + backward re-gather
    uint64_t numel = 0, packed = 0, unpacked = 0;
    for (size_t r = 0; r < L.runtime.size(); ++r) {
      const RuntimeParam& rp = L.runtime[r];
      numel += rp.numel;
      if (rp.num_members > 1 && (R.tw_every_use || (!R.weight_copies && !E.contiguous[r])))
        packed += rp.numel;
      if (!R.grad_copies && !E.contiguous[r]) unpacked += rp.numel;
    }
    e.ag += M * uses * (cfg.sw - 1) * (padded / cfg.sw) * ws;
    // sshsdp's gather is out of place (retained Wᶻ³ → transient W′): the collective copies the
    // own shard; the baselines write it first (② cast / ③ copy-in) and gather in place.
    if (cfg.sw > 1 && !cast && !R.weight_copies)
      e.collective_copy += M * uses * (padded / cfg.sw) * ws;
    e.rs += M * (cfg.sg - 1) * (padded / cfg.sg) * 4;
    if (R.weight_copies) {
      e.copies.weight_copy_in += M * uses * (padded / cfg.sw) * ws;
      e.copies.weight_copy_out += M * uses * numel * ws;
    }
    e.copies.weight_pack += M * uses * packed * ws;
    if (R.grad_copies) e.copies.grad_copy += M * numel * 4;
    e.copies.grad_unpack += M * unpacked * 4;
    e.weight_preps += cast ? (gather ? M * uses : 0) : (wdt == DType::kBF16 ? 1 : 0);
    if (R.separate_add && through_rs) {
      e.add_passes += M - 1;
    } else {
      e.fused += M - 1;
    }
  }
  return e;
}

// The first model built (the engine under test) with per-part QKV runtime parameters
// (GptConfig::packed_qkv = false, veScale-FSDP's model), the second (the reference) packed.
testing::ModelFactory PerPartThenPacked() {
  return [n = 0]() mutable -> std::unique_ptr<Model> {
    GptConfig g = TestGpt();
    g.packed_qkv = n++ > 0;
    return std::make_unique<Gpt>(g);
  };
}

void RunPresetParity(const std::string& preset, const Layout& l, DType wdt, int M, bool reshard,
                     testing::ModelFactory make = testing::GptOf(TestGpt())) {
  testing::ParityCase c;
  c.layout = l;
  c.make = std::move(make);
  c.cfg = BaseConfig(l, M, wdt);
  c.cfg.reshard_after_forward = reshard;
  ApplyPreset(preset, &c.cfg);
  c.ref_cfg = BaseConfig(testing::kOneRank, M * WorldSize(), wdt);
  c.tol = testing::AdamWTolerances(wdt);
  testing::ParityRun run(c);
  const Expected want = Expect(run.model(), c.cfg, M, reshard);
  run.Run([&](const testing::StepDiff& d) {
    const StepCounters& c = d.dist.counters;
    EXPECT_EQ(c.runtime_comm.total(), want.ag + want.rs);
    EXPECT_EQ(c.copies.weight_copy_in, want.copies.weight_copy_in);
    EXPECT_EQ(c.copies.weight_copy_out, want.copies.weight_copy_out);
    EXPECT_EQ(c.copies.weight_pack, want.copies.weight_pack);
    EXPECT_EQ(c.copies.grad_copy, want.copies.grad_copy);
    EXPECT_EQ(c.copies.grad_unpack, want.copies.grad_unpack);
    EXPECT_EQ(c.bytes_copied, want.copies.total());
    EXPECT_EQ(c.collective_copy_bytes, want.collective_copy);
    EXPECT_EQ(c.weight_preps, want.weight_preps);
    EXPECT_EQ(c.add_passes, want.add_passes);
    EXPECT_EQ(c.fused_accumulations, want.fused);
    if (preset == "sshsdp") {
      EXPECT_EQ(c.bytes_copied, 0u);
    }
    if (dynamic_cast<const Gpt&>(run.model()).config().fused_qkv) {
      EXPECT_EQ(c.copies.weight_pack, 0u);  // one member per runtime parameter: nothing to pack
    }
    if (preset == "vescale-fsdp" && !dynamic_cast<const Gpt&>(run.model()).config().packed_qkv) {
      // No packed runtime layout: nothing to pack per use or to scatter back.
      EXPECT_EQ(c.copies.weight_pack, 0u);
      EXPECT_EQ(c.copies.grad_unpack, 0u);
    }
    // Time split covers the step (categories are disjoint scopes of the main thread).
    const TimeSplit& t = d.dist.time;
    // ⑤'s add runs on the communication thread after its reduce-scatter (redundancy.h: where
    // the frameworks run it), so the main thread spends no time adding though passes are paid.
    EXPECT_EQ(t.add, 0.0);
    EXPECT_NEAR(t.compute + t.comm_wait + t.copy + t.cast + t.add + t.optimizer + t.other,
                d.dist.seconds, 1e-3 + 1e-6 * d.dist.seconds);
  });
}

TEST(EngineBaselines, EveryPresetMatchesReferenceBf16) {
  const int W = WorldSize();
  for (const std::string& preset : PresetNames()) {
    for (const Layout& l : LayoutsFor(W)) {
      SCOPED_TRACE(fmt::format("{} {}", preset, Describe(W, l)));
      RunPresetParity(preset, l, DType::kBF16, 3, true);
    }
  }
}

// The model as AdamW users write it (one fused [3d, d] QKV parameter, presets.h): every preset
// against the one-process reference of the same fused model; FSDP2 shards the fused parameter
// on dim 0 and, with one member per runtime parameter, packs nothing (① pays 0 bytes).
TEST(EngineBaselines, EveryPresetMatchesReferenceFusedQkv) {
  const int W = WorldSize();
  GptConfig fused = TestGpt();
  fused.fused_qkv = true;
  for (const std::string& preset : PresetNames()) {
    for (const Layout& l : LayoutsFor(W)) {
      SCOPED_TRACE(fmt::format("fused {} {}", preset, Describe(W, l)));
      RunPresetParity(preset, l, DType::kBF16, 2, true, testing::GptOf(fused));
    }
  }
}

TEST(EngineBaselines, VescalePerPartModelMatchesPackedReference) {
  // veScale-FSDP's model declares each head's Q/K/V as its own runtime parameter and runs
  // per-part GEMMs: on aligned shards it trains like the packed single-process reference and
  // pays no ① packing and no gradient scatter.
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunPresetParity("vescale-fsdp", l, DType::kBF16, 2, true, PerPartThenPacked());
  }
  const Layout l = LayoutsFor(W).front();
  SCOPED_TRACE(fmt::format("fp32 W={} sw={}", W, l.sw));
  RunPresetParity("vescale-fsdp", l, DType::kF32, 2, /*reshard=*/false, PerPartThenPacked());
}

TEST(EngineBaselines, EveryPresetMatchesReferenceFp32KeepGathered) {
  const int W = WorldSize();
  const Layout l = LayoutsFor(W).front();
  for (const std::string& preset : PresetNames()) {
    SCOPED_TRACE(fmt::format("{} W={} sw={}", preset, W, l.sw));
    RunPresetParity(preset, l, DType::kF32, 2, /*reshard=*/false);
  }
}

TEST(EngineBaselines, AblationLadderMatchesReference) {
  const int W = WorldSize();
  const Layout l = LayoutsFor(W).front();
  EngineConfig base = BaseConfig(l, 2, DType::kBF16);
  for (const auto& [label, cfg] : AblationLadder(base)) {
    SCOPED_TRACE(label);
    // The ladder's configurations, two steps each against the reference: loss, gradient
    // norm and every main weight (bf16 bounds), and the counters of the switches.
    testing::ParityCase c;
    c.layout = l;
    c.make = testing::GptOf(TestGpt());
    c.cfg = cfg;
    c.ref_cfg = BaseConfig(testing::kOneRank, 2 * W, DType::kBF16);
    c.steps = 2;
    c.seed = 3;
    c.tol = testing::AdamWTolerances(DType::kBF16);  // loss, norm and every main weight
    testing::ParityRun run(c);
    const Expected want = Expect(run.model(), cfg, 2, cfg.reshard_after_forward);
    run.Run([&](const testing::StepDiff& d) {
      EXPECT_EQ(d.dist.counters.bytes_copied, want.copies.total());
      EXPECT_EQ(d.dist.counters.add_passes, want.add_passes);
    });
  }
}

TEST(EngineBaselines, Dim0LayoutFollowsTorchChunk) {
  // One parameter of 3 rows x 2 and one of 1 row x 4 at sw = 2, so = 4: rank 0 holds rows
  // {0,1} and row {0}; rank 1 holds row {2} (+1 padding row) and nothing (+1 padding row).
  std::vector<RuntimeParamSpec> specs;
  RuntimeParamSpec a{"a", {3, 2}, {UpdatePart{"a", {3, 2}, 0, UpdateKind::kMatrix, {}}}};
  RuntimeParamSpec b{"b", {1, 4}, {UpdatePart{"b", {1, 4}, 0, UpdateKind::kMatrix, {}}}};
  specs = {a, b};
  EngineLayout E = BuildEngineLayout(ShardLayout::kDim0, 0, specs, DType::kF32, 2, 4);
  const TensorList& L = E.layout.list;
  ASSERT_EQ(L.num_members(), 4u);
  // block = 2*2 + 1*4 = 8 per rank, already a multiple of so/sw = 2.
  EXPECT_EQ(L.padded_numel(), 16u);
  EXPECT_EQ(L.member(0).name, "a#0");
  EXPECT_EQ(L.member(2).name, "a#1");
  EXPECT_EQ(L.member(2).offset, 8u);
  EXPECT_EQ(E.pieces[0].valid, 4u);
  EXPECT_EQ(E.pieces[2].offset, 4u);  // row 2 of a
  EXPECT_EQ(E.pieces[2].valid, 2u);   // one real row, one padding row
  EXPECT_EQ(E.pieces[3].valid, 0u);   // b has no row for rank 1
  // Uncovered: a#1's padding row and all of b#1.
  ASSERT_EQ(E.uncovered.size(), 1u);
  EXPECT_EQ(E.uncovered[0], std::make_pair(size_t{10}, size_t{16}));
}

TEST(EngineBaselines, AlignedLayoutKeepsUnitsInOneShard) {
  Gpt model(TestGpt());
  for (int g = 0; g < model.num_groups(); ++g) {
    for (int so : {2, 3, 4}) {
      EngineLayout E =
          BuildEngineLayout(ShardLayout::kAligned, g, model.GroupParams(g), DType::kBF16, 1, so);
      const TensorList& L = E.layout.list;
      const size_t chunk = L.padded_numel() / so;
      ASSERT_EQ(L.padded_numel() % so, 0u);
      for (const TensorListMember& m : L.members()) {
        if (m.numel > chunk) continue;
        EXPECT_EQ(m.offset / chunk, (m.end() - 1) / chunk)
            << m.name << " straddles a ZeRO-1 chunk, so=" << so;
      }
    }
  }
}

TEST(EngineBaselines, PresetsAndRefusals) {
  EngineConfig cfg;
  ApplyPreset("fsdp2", &cfg);
  EXPECT_EQ(cfg.redundancies.ToString(), "①②③④⑤⑥⑦");
  EXPECT_EQ(cfg.shard_layout, ShardLayout::kDim0);
  ApplyPreset("sshsdp", &cfg);
  EXPECT_EQ(cfg.redundancies.ToString(), "none");
  // veScale-FSDP: no packed runtime layout (the model runs per-part GEMMs), so no ①.
  ApplyPreset("vescale-fsdp", &cfg);
  EXPECT_EQ(cfg.redundancies.ToString(), "②⑤⑦");
  EXPECT_EQ(cfg.shard_layout, ShardLayout::kAligned);
  // The model as its users write it: fused QKV except where Muon needs per-head units.
  for (const std::string& p : PresetNames()) {
    EXPECT_EQ(PresetQkvModel(p, OptimizerKind::kAdamW, UnitRule::kHead), QkvModel::kFused) << p;
    EXPECT_EQ(PresetQkvModel(p, OptimizerKind::kMuon, UnitRule::kMatrix), QkvModel::kFused) << p;
  }
  EXPECT_EQ(PresetQkvModel("vescale-fsdp", OptimizerKind::kMuon, UnitRule::kHead),
            QkvModel::kPerPart);
  EXPECT_EQ(PresetQkvModel("fsdp2", OptimizerKind::kMuon, UnitRule::kHead),
            QkvModel::kPackedPerHead);
  EXPECT_EQ(PresetQkvModel("sshsdp", OptimizerKind::kMuon, UnitRule::kHead),
            QkvModel::kPackedPerHead);
  try {
    ApplyPreset("deepspeed", &cfg);
    ADD_FAILURE() << "accepted an unknown preset";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("megatron-fsdp"), std::string::npos) << e.what();
  }
  ApplyPreset("megatron-fsdp", &cfg);
  try {
    CheckStructuredUpdates(cfg.redundancies, "muon", "blocks.0.attn.q.h0");
    ADD_FAILURE() << "megatron-fsdp accepted Muon per head";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.attn.q.h0"), std::string::npos) << e.what();
  }
  // The dim-0 layout cannot run without copy-out / gradient copies.
  auto world = MpiCommunicator::World(1);
  Gpt model(TestGpt());
  EngineConfig bad = BaseConfig({1, 1, world->size(), 1}, 1, DType::kBF16);
  bad.shard_layout = ShardLayout::kDim0;
  EXPECT_THROW({ Engine e(model, *world, bad); }, ConfigError);
  // Per-part QKV runtime weights (veScale's model) take fp32 / bf16, not MXFP8.
  GptConfig pc = TestGpt();
  pc.packed_qkv = false;
  Gpt per_part(pc);
  EngineConfig mx = BaseConfig({1, 1, world->size(), 1}, 1, DType::kE4M3);
  { Engine ok(model, *world, mx); }
  EXPECT_THROW({ Engine e(per_part, *world, mx); }, ConfigError);
}

TEST(EngineBaselines, MuonNeedsStructuredUpdates) {
  // ⑥: Megatron-FSDP has no structured updates (refused); FSDP2 runs Muon by full_tensor
  // (parity and counters: engine_muon_parity_test); veScale-FSDP's aligned shards run Muon per
  // head through point-to-point units like sshsdp.
  auto world = MpiCommunicator::World(1);
  Gpt model(TestGpt());
  {
    EngineConfig cfg = BaseConfig({1, 1, world->size(), 1}, 1, DType::kBF16);
    ApplyPreset("megatron-fsdp", &cfg);
    cfg.optimizer = OptimizerKind::kMuon;
    try {
      Engine e(model, *world, cfg);
      ADD_FAILURE() << "megatron-fsdp accepted Muon per head";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("blocks.0.attn.q.h0"), std::string::npos) << e.what();
    }
  }
  for (const char* preset : {"vescale-fsdp", "fsdp2"}) {
    EngineConfig cfg = BaseConfig({1, 1, world->size(), 1}, 1, DType::kBF16);
    ApplyPreset(preset, &cfg);
    cfg.optimizer = OptimizerKind::kMuon;
    Engine e(model, *world, cfg);
    e.InitWeights(1);
    int64_t step = 0;
    StepStats st = e.Step(MakeBatch(&step, 1, world->size(), world->rank(), 2, 8, 61));
    EXPECT_TRUE(std::isfinite(st.loss)) << preset;
    EXPECT_EQ(e.structured_update().full_tensor() != nullptr, std::string(preset) == "fsdp2");
  }
  {
    // veScale's own model: per-part QKV runtime parameters, Muon per head.
    GptConfig pc = TestGpt();
    pc.packed_qkv = false;
    Gpt per_part(pc);
    EngineConfig cfg = BaseConfig({1, 1, world->size(), 1}, 1, DType::kBF16);
    ApplyPreset("vescale-fsdp", &cfg);
    cfg.optimizer = OptimizerKind::kMuon;
    Engine e(per_part, *world, cfg);
    e.InitWeights(1);
    int64_t step = 0;
    StepStats st = e.Step(MakeBatch(&step, 1, world->size(), world->rank(), 2, 8, 61));
    EXPECT_TRUE(std::isfinite(st.loss));
    EXPECT_EQ(st.counters.copies.weight_pack + st.counters.copies.grad_unpack, 0u);
  }
}

}  // namespace
}  // namespace sshsdp
