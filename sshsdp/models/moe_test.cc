// Structure tests of the reference MoE GPT against its contract (model.h, moe.h); the
// routing / forward-value and gradient tests are moe_routing_test.cc and
// moe_gradients_test.cc:
// * packed layout: one runtime parameter per matrix kind, per-expert kMatrix update parts;
//   the router is kept off Muon; moe_every / moe_layers select the MoE blocks;
// * config validation and the Forward/Backward execution order; presets and FlopsPerToken
//   (active experts only);
// * expert_group: an MoE block as two runtime groups (attention + router, experts) computes
//   the same forward bit for bit and the same gradients to fp32 rounding; only the expert
//   group consumes MXFP8, and the forward/backward with MXFP8 expert views (codes + scales
//   relaid out for the whole packed [E·out, in] weight, every scale layout) equal the
//   forward/backward with the dequantized fp32 weights exactly.
#include "sshsdp/models/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/testing/grad_check.h"
#include "sshsdp/models/testing/moe_fixtures.h"
#include "sshsdp/numerics/mx.h"
#include "sshsdp/numerics/scale_layout.h"

namespace sshsdp {
namespace {

using testing::AllRouting;
using testing::Batch;
using testing::RandomBatch;
using testing::RandomizeWeights;
using testing::RunBackward;
using testing::RunForward;
using testing::TinyConfig;

// ---- Layout. ----

TEST(Moe, PackedExpertsAndRouterLayout) {
  MoeConfig c = TinyConfig();
  MoeGpt m(c);
  ASSERT_EQ(m.num_groups(), 4);
  for (int g = 0; g < m.num_groups(); ++g) {
    for (const RuntimeParamSpec& s : m.GroupParams(g)) ValidateSpec(s);
  }
  // Block 0 is dense (moe_every = 2), identical to the dense GPT's block.
  Gpt dense(c.trunk);
  std::vector<RuntimeParamSpec> b0 = m.GroupParams(1), d0 = dense.GroupParams(1);
  ASSERT_EQ(b0.size(), d0.size());
  for (size_t i = 0; i < b0.size(); ++i) EXPECT_EQ(b0[i].name, d0[i].name);
  EXPECT_EQ(b0[4].name, "blocks.0.mlp.fc1");

  std::vector<RuntimeParamSpec> b1 = m.GroupParams(2);
  const char* names[] = {
      "blocks.1.ln1.g",         "blocks.1.attn.qkv",     "blocks.1.attn.proj",
      "blocks.1.ln2.g",         "blocks.1.moe.router",   "blocks.1.moe.w1",
      "blocks.1.moe.w2",        "blocks.1.moe.w3",       "blocks.1.moe.shared.w1",
      "blocks.1.moe.shared.w2", "blocks.1.moe.shared.w3"};
  ASSERT_EQ(b1.size(), std::size(names));
  for (size_t i = 0; i < b1.size(); ++i) EXPECT_EQ(b1[i].name, names[i]);
  const RuntimeParamSpec& router = b1[4];
  EXPECT_EQ(router.shape, (std::vector<int64_t>{4, 16}));
  ASSERT_EQ(router.parts.size(), 1u);
  EXPECT_EQ(router.parts[0].kind, UpdateKind::kMatrix);
  EXPECT_FALSE(router.parts[0].muon_eligible);
  EXPECT_FALSE(MuonEligible(router.parts[0]));
  struct Want {
    int index;
    const char* kind;
    int64_t out, in;
  };
  for (Want w : {Want{5, "w1", 12, 16}, Want{6, "w2", 16, 12}, Want{7, "w3", 12, 16}}) {
    const RuntimeParamSpec& s = b1[w.index];
    EXPECT_EQ(s.shape, (std::vector<int64_t>{4, w.out, w.in}));
    ASSERT_EQ(s.parts.size(), 4u);
    for (int e = 0; e < 4; ++e) {
      const UpdatePart& part = s.parts[e];
      EXPECT_EQ(part.name, fmt::format("blocks.1.moe.{}.e{}", w.kind, e));
      EXPECT_EQ(part.shape, (std::vector<int64_t>{w.out, w.in}));
      EXPECT_EQ(part.offset, e * w.out * w.in);  // expert e's [out, in] matrix of [E, out, in]
      EXPECT_EQ(part.kind, UpdateKind::kMatrix);
      EXPECT_TRUE(MuonEligible(part));
    }
  }
  EXPECT_EQ(b1[8].shape, (std::vector<int64_t>{8, 16}));

  // GELU experts have no w3; no shared expert; moe_layers picks blocks explicitly.
  c.expert_mlp = ExpertMlp::kGelu;
  c.shared_expert = false;
  c.trunk.n_layer = 3;
  c.moe_layers = {0, 2};
  MoeGpt m2(c);
  EXPECT_EQ(m2.GroupParams(1).size(), 7u);
  EXPECT_EQ(m2.GroupParams(2).size(), 6u);
  EXPECT_EQ(m2.GroupParams(3)[6].name, "blocks.2.moe.w2");
  c.moe_layers.clear();
  c.moe_every = 1;
  EXPECT_TRUE(c.IsMoeLayer(0) && c.IsMoeLayer(1) && c.IsMoeLayer(2));
  c.moe_every = 2;
  EXPECT_TRUE(!c.IsMoeLayer(0) && c.IsMoeLayer(1) && !c.IsMoeLayer(2));
}

TEST(Moe, ValidatesConfigAndExecutionOrder) {
  MoeConfig c = TinyConfig();
  c.top_k = 5;
  EXPECT_THROW(MoeGpt{c}, ConfigError);
  c = TinyConfig();
  c.moe_layers = {2};
  EXPECT_THROW(MoeGpt{c}, ConfigError);
  c = TinyConfig();
  c.trunk.n_layer = 1;  // moe_every = 2 selects no block
  EXPECT_THROW(MoeGpt{c}, ConfigError);
  c = TinyConfig();
  c.aux_loss_weight = -1;
  EXPECT_THROW(MoeGpt{c}, ConfigError);
  c = TinyConfig();
  c.trunk.packed_qkv = false;  // would hand one head's [d_head, d] part to a [3d, d] GEMM
  EXPECT_THROW(MoeGpt{c}, ConfigError);
  c = TinyConfig();
  c.d_expert = -8;  // not silently the default width
  EXPECT_THROW(MoeGpt{c}, ConfigError);
  EXPECT_THROW(MoeConfig::Preset("moe-huge"), ConfigError);
  EXPECT_THROW(ParseGating("topk"), ConfigError);
  EXPECT_EQ(ParseGating("sigmoid"), Gating::kSigmoid);
  EXPECT_EQ(ParseExpertMlp("gelu"), ExpertMlp::kGelu);

  MoeGpt m(TinyConfig());
  DenseParams p(m);
  p.Init(1);
  Batch b = RandomBatch(1, 4, 32, 2);
  EXPECT_THROW(m.Forward(0, p.Weights(0)), PlanError);
  m.SetBatch(b.tokens.data(), b.targets.data(), 1, 4);
  EXPECT_THROW(m.Forward(1, p.Weights(1)), PlanError);
  EXPECT_THROW(m.Loss(), PlanError);
  EXPECT_THROW(m.Routing(1), PlanError);  // not yet run
  EXPECT_THROW(m.Forward(0, p.Weights(2)), PlanError);
  for (int g = 0; g < m.num_groups(); ++g) {
    if (g == 2) {
      EXPECT_THROW(m.Forward(2, p.Weights(1)), PlanError);  // dense views for an MoE block
    }
    m.Forward(g, p.Weights(g));
  }
  EXPECT_THROW(m.Routing(0), PlanError);  // a dense block
  EXPECT_NEAR(m.CrossEntropy(), std::log(32.0), 0.1);
  EXPECT_THROW(m.Backward(1, p.Weights(1), p.Grads(1), GradWrite::kOverwrite), PlanError);
  b.tokens[0] = 32;
  EXPECT_THROW(m.SetBatch(b.tokens.data(), b.targets.data(), 1, 4), ConfigError);
}

TEST(Moe, PresetsAndActiveFlops) {
  MoeConfig s = MoeConfig::Preset("moe-small");
  EXPECT_EQ(s.trunk.d_model, 128);
  EXPECT_EQ(s.trunk.n_layer, 4);
  EXPECT_EQ(s.n_expert, 8);
  EXPECT_EQ(s.top_k, 2);
  MoeGpt m(s);
  const double d = 128, L = 4, V = 256, T = 128, E = 8, k = 2, f = 256;
  // Active GEMM weights per token: attention, router, top-k of the E SwiGLU experts, head.
  const double active = L * (4 * d * d + E * d + k * 3 * d * f) + V * d;
  EXPECT_DOUBLE_EQ(m.FlopsPerToken(), 6 * active + 12 * L * d * T);
  const double total = L * (4 * d * d + E * d + E * 3 * d * f + 2 * d) + 2 * V * d + T * d + d;
  EXPECT_EQ(m.NumParams(), static_cast<int64_t>(total));
  // Shared expert and GELU experts.
  s.shared_expert = true;
  s.expert_mlp = ExpertMlp::kGelu;
  MoeGpt m2(s);
  const double active2 = L * (4 * d * d + E * d + k * 2 * d * f + 2 * d * f) + V * d;
  EXPECT_DOUBLE_EQ(m2.FlopsPerToken(), 6 * active2 + 12 * L * d * T);

  // moe-tiny: one forward + backward at B = 2 runs in milliseconds.
  MoeGpt tiny(MoeConfig::Preset("moe-tiny"));
  DenseParams p(tiny);
  p.Init(1);
  const int B = 2, Tt = tiny.config().trunk.seq_len;
  SyntheticTokens data(256, 1);
  std::vector<int32_t> tok(B * Tt), tgt(B * Tt);
  data.Batch(0, B, Tt, tok.data(), tgt.data());
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    tiny.SetBatch(tok.data(), tgt.data(), B, Tt);
    for (int g = 0; g < tiny.num_groups(); ++g) tiny.Forward(g, p.Weights(g));
    for (int g = tiny.num_groups() - 1; g >= 0; --g)
      tiny.Backward(g, p.Weights(g), p.Grads(g), GradWrite::kOverwrite);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  RecordProperty("moe_tiny_step_ms", std::to_string(best * 1e3));
  EXPECT_LT(best, 0.5) << "moe-tiny forward+backward took " << best * 1e3 << " ms";
  EXPECT_NEAR(tiny.CrossEntropy(), std::log(256.0), 0.1);
}

// ---- expert_group and MXFP8 expert weights. ----

MoeConfig SplitConfig() {
  MoeConfig c = TinyConfig();
  c.expert_group = true;
  return c;
}

TEST(Moe, ExpertGroupSplitsMoeBlocksAndMatchesOneGroup) {
  MoeGpt one(TinyConfig()), two(SplitConfig());
  EXPECT_FALSE(one.ConsumesMx());
  EXPECT_TRUE(two.ConsumesMx());
  ASSERT_EQ(one.num_groups(), 4);
  ASSERT_EQ(two.num_groups(), 5);  // embedding, dense block 0, block 1 attn+router, experts, head
  EXPECT_EQ(one.ExpertGroup(1), 2);
  EXPECT_EQ(two.ExpertGroup(1), 3);
  EXPECT_THROW(two.ExpertGroup(0), PlanError);
  std::vector<std::string> names;
  for (int g : {2, 3})
    for (const RuntimeParamSpec& s : two.GroupParams(g)) names.push_back(s.name);
  std::vector<std::string> want;
  for (const RuntimeParamSpec& s : one.GroupParams(2)) want.push_back(s.name);
  EXPECT_EQ(names, want);
  EXPECT_EQ(two.GroupParams(2).back().name, "blocks.1.moe.router");
  EXPECT_EQ(two.GroupParams(3).front().name, "blocks.1.moe.w1");
  for (int g = 0; g < two.num_groups(); ++g) EXPECT_EQ(two.GroupConsumesMx(g), g == 3) << g;
  for (int g = 0; g < one.num_groups(); ++g) EXPECT_FALSE(one.GroupConsumesMx(g)) << g;

  DenseParams p1(one), p2(two);
  RandomizeWeights(p1, 21);  // same parameter order, so the same values by name
  RandomizeWeights(p2, 21);
  Batch b = RandomBatch(2, 8, 32, 3);
  const double l1 = RunForward(one, p1, b);
  const auto r1 = AllRouting(one);
  const double l2 = RunForward(two, p2, b);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(AllRouting(two), r1);
  RunBackward(one, p1, GradWrite::kOverwrite);
  RunBackward(two, p2, GradWrite::kOverwrite);
  std::map<std::string, std::vector<float>> g1;
  for (int g = 0; g < one.num_groups(); ++g)
    for (size_t i = 0; i < p1.specs(g).size(); ++i)
      g1[p1.specs(g)[i].name] = p1.GradAsFloat(g, static_cast<int>(i));
  for (int g = 0; g < two.num_groups(); ++g) {
    for (size_t i = 0; i < p2.specs(g).size(); ++i) {
      const std::vector<float>& a = g1.at(p2.specs(g)[i].name);
      const std::vector<float> q = p2.GradAsFloat(g, static_cast<int>(i));
      ASSERT_EQ(a.size(), q.size());
      // Only the summation order of ∂/∂ln2 differs: fp32 rounding relative to the tensor.
      double scale = 0;
      for (float v : a) scale = std::max(scale, std::abs(double(v)));
      for (size_t k = 0; k < a.size(); ++k)
        EXPECT_NEAR(q[k], a[k], 1e-5 * scale) << p2.specs(g)[i].name << " " << k;
    }
  }
}

// MXFP8 codes + Tw-style scales of every expert-group runtime weight of `p`, and `deq`'s
// expert group set to the dequantized values (MxDequantizeWeight on the unpacked grids: an
// independent path from the kernel-layout lookup the model uses).
struct MxGroup {
  std::vector<std::vector<uint8_t>> codes, scales;
  std::vector<TensorRef> Views(ScaleLayout layout) {
    std::vector<TensorRef> v;
    for (size_t r = 0; r < codes.size(); ++r)
      v.push_back(TensorRef{codes[r].data(), DType::kE4M3, scales[r].data(), layout});
    return v;
  }
};

MxGroup QuantizeGroup(DenseParams& p, DenseParams& deq, int g, ScaleLayout layout) {
  MxGroup out;
  for (size_t r = 0; r < p.specs(g).size(); ++r) {
    const RuntimeParamSpec& rp = p.specs(g)[r];
    const std::vector<float>& w = p.master(g, static_cast<int>(r));
    std::vector<float>& dq = deq.master(g, static_cast<int>(r));
    std::vector<uint8_t> codes(w.size());
    std::vector<std::vector<uint8_t>> grids;
    std::vector<MxScaleGrid> parts;
    for (const UpdatePart& part : rp.parts) {
      const int64_t rows = part.shape[0], cols = part.shape[1];
      grids.emplace_back(MxWeightScaleCount(rows, cols));
      MxQuantizeWeight(w.data() + part.offset, rows, cols, codes.data() + part.offset,
                       grids.back().data());
      MxDequantizeWeight(codes.data() + part.offset, grids.back().data(), rows, cols,
                         dq.data() + part.offset);
    }
    for (size_t i = 0; i < rp.parts.size(); ++i)
      parts.push_back({grids[i].data(), rp.parts[i].shape[0], rp.parts[i].shape[1], 32});
    std::vector<uint8_t> s(ScaleLayoutBytes(layout, PackedScales(parts, MxOperand::kAsStored)));
    RelayoutPackedScales(parts, MxOperand::kAsStored, layout, s.data(), s.size());
    out.codes.push_back(std::move(codes));
    out.scales.push_back(std::move(s));
  }
  deq.SyncWeights();
  return out;
}

TEST(Moe, MxExpertViewsEqualDequantizedFp32Weights) {
  for (ExpertMlp mlp : {ExpertMlp::kSwiGLU, ExpertMlp::kGelu}) {
    for (ScaleLayout layout :
         {ScaleLayout::kRowMajor, ScaleLayout::kDeepGemmMnMajor, ScaleLayout::kCublasSwizzle}) {
      SCOPED_TRACE(fmt::format("{} {}", ExpertMlpName(mlp), ScaleLayoutName(layout)));
      MoeConfig c = SplitConfig();
      c.expert_mlp = mlp;
      c.d_expert = 40;  // 40-row experts: 32x32 blocks do not tile the packed [E·40, d]
      MoeGpt m(c);
      const int gx = m.ExpertGroup(1);
      DenseParams p(m), deq(m);
      RandomizeWeights(p, 5);
      RandomizeWeights(deq, 5);
      MxGroup mx = QuantizeGroup(p, deq, gx, layout);
      Batch b = RandomBatch(2, 8, 32, 9);
      const double want = RunForward(m, deq, b);
      const auto route = AllRouting(m);
      RunBackward(m, deq, GradWrite::kOverwrite);
      std::vector<std::vector<std::vector<float>>> grads(m.num_groups());
      for (int g = 0; g < m.num_groups(); ++g)
        for (size_t i = 0; i < deq.specs(g).size(); ++i)
          grads[g].push_back(deq.GradAsFloat(g, static_cast<int>(i)));

      // Same run with the MX views for the expert group (gradients into deq's buffers again).
      const std::vector<TensorRef> views = mx.Views(layout);
      m.SetBatch(b.tokens.data(), b.targets.data(), b.B, b.T);
      for (int g = 0; g < m.num_groups(); ++g) m.Forward(g, g == gx ? views : deq.Weights(g));
      EXPECT_EQ(m.Loss(), want);
      EXPECT_EQ(AllRouting(m), route);
      for (int g = m.num_groups() - 1; g >= 0; --g)
        m.Backward(g, g == gx ? views : deq.Weights(g), deq.Grads(g), GradWrite::kOverwrite);
      for (int g = 0; g < m.num_groups(); ++g)
        for (size_t i = 0; i < deq.specs(g).size(); ++i)
          EXPECT_EQ(deq.GradAsFloat(g, static_cast<int>(i)), grads[g][i]) << deq.specs(g)[i].name;
      // The quantization is real: the dequantized weights differ from the fp32 ones.
      EXPECT_NE(deq.master(gx, 0), p.master(gx, 0));
    }
  }
}

TEST(Moe, MxViewsOnlyForExpertWeights) {
  MoeGpt m(SplitConfig());
  DenseParams p(m);
  RandomizeWeights(p, 2);
  Batch b = RandomBatch(1, 8, 32, 1);
  m.SetBatch(b.tokens.data(), b.targets.data(), b.B, b.T);
  m.Forward(0, p.Weights(0));
  m.Forward(1, p.Weights(1));
  std::vector<TensorRef> w = p.Weights(2);  // attention + router: must not be MX
  std::vector<uint8_t> codes(64 * 64), scales(4096);
  w[4] = TensorRef{codes.data(), DType::kE4M3, scales.data(), ScaleLayout::kRowMajor};
  EXPECT_THROW(m.Forward(2, w), PlanError);
  // Without expert_group the model does not consume MX weights at all.
  MoeGpt one(TinyConfig());
  EXPECT_FALSE(one.ConsumesMx());
}

}  // namespace
}  // namespace sshsdp
