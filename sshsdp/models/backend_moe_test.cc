// BackendMoeModel on the CPU backend against MoeGpt (the oracle): the same weights and batch
// give the same loss, routing and gradients BIT FOR BIT — every op is the one MoeGpt runs —
// for softmax and sigmoid gating, with and without renormalisation, SwiGLU and GELU experts,
// with and without a shared expert, dense blocks between MoE blocks, both group structures
// (MoeConfig::expert_group), fp32 and bf16 weights, overwritten and accumulated gradients, and
// experts left without tokens. (The engine's test, engine_backend_moe_test, runs it on the
// guarded backend too: memory the host cannot touch.)
#include "sshsdp/models/backend_moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "sshsdp/models/data.h"
#include "sshsdp/models/testing/moe_fixtures.h"
#include "sshsdp/params/model.h"

namespace sshsdp {
namespace {

struct Variant {
  std::string name;
  MoeConfig c;
  DType w = DType::kF32;
};

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  MoeConfig base = testing::TinyConfig();  // block 0 dense, block 1 MoE, shared expert
  base.trunk.bf16_attention = false;       // the backends' attention is fp32
  v.push_back({"dense+moe shared swiglu softmax", base});
  MoeConfig c = base;
  c.gating = Gating::kSigmoid;
  c.renormalize = false;
  c.expert_mlp = ExpertMlp::kGelu;
  c.shared_expert = false;
  c.moe_every = 1;
  v.push_back({"every block moe, gelu sigmoid unnormalised", c});
  c = base;
  c.expert_group = true;
  c.moe_every = 1;
  c.top_k = 3;
  v.push_back({"expert groups top-3", c});
  c = base;
  c.n_expert = 16;  // 8·8·2 assignments over 16 experts: some get none
  c.top_k = 1;
  v.push_back({"16 experts top-1 (idle experts)", c});
  for (size_t i = 0, n = v.size(); i < n; ++i) {
    Variant b = v[i];
    b.name += " bf16";
    b.w = DType::kBF16;
    v.push_back(b);
  }
  return v;
}

// Loss and gradients of one batch, twice: overwrite then accumulate (the grads are read after
// each pass: `grads[0]`, `grads[1]`).
template <typename M>
double Run(M& model, DenseParams& p, const std::vector<int32_t>& tok,
           const std::vector<int32_t>& tgt, int B, int T, std::vector<std::vector<float>>* grads) {
  double loss = 0.0;
  grads->clear();
  for (GradWrite mode : {GradWrite::kOverwrite, GradWrite::kAccumulate}) {
    if (mode == GradWrite::kOverwrite) {  // NaN everywhere: every gradient must be written
      for (int g = 0; g < p.num_groups(); ++g) {
        const std::vector<TensorRef> grads = p.Grads(g);
        for (size_t i = 0; i < grads.size(); ++i) {
          EXPECT_EQ(grads[i].dtype, DType::kF32);
          std::fill_n(static_cast<float*>(grads[i].data), p.specs(g)[i].numel(),
                      std::numeric_limits<float>::quiet_NaN());
        }
      }
    }
    model.SetBatch(tok.data(), tgt.data(), B, T);
    for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, p.Weights(g));
    loss = model.Loss();
    for (int g = model.num_groups() - 1; g >= 0; --g)
      model.Backward(g, p.Weights(g), p.Grads(g), mode);
    std::vector<float> all;
    for (int g = 0; g < p.num_groups(); ++g)
      for (size_t i = 0; i < p.specs(g).size(); ++i) {
        const auto gi = p.GradAsFloat(g, static_cast<int>(i));
        all.insert(all.end(), gi.begin(), gi.end());
      }
    grads->push_back(std::move(all));
  }
  return loss;
}

void ExpectSameAsMoeGpt(Backend& b) {
  const int B = 2, T = 6;  // T below seq_len 8: positions past T get zero gradients
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    MoeGpt ref(v.c);
    DenseParams pr(ref, v.w);
    pr.Init(5);
    std::vector<int32_t> tok(B * T), tgt(B * T);
    SyntheticTokens(v.c.trunk.vocab, 3).Batch(0, B, T, tok.data(), tgt.data());
    std::vector<std::vector<float>> want, got;
    const double want_loss = Run(ref, pr, tok, tgt, B, T, &want);

    BackendMoeModel model(b, v.c);
    ASSERT_EQ(model.num_groups(), ref.num_groups());
    for (int g = 0; g < ref.num_groups(); ++g) {
      const auto a = model.GroupParams(g), r = ref.GroupParams(g);
      ASSERT_EQ(a.size(), r.size());
      for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].name, r[i].name);
    }
    DenseParams pb(model, v.w);  // the CPU backend's memory is the host's
    pb.Init(5);
    const double loss = Run(model, pb, tok, tgt, B, T, &got);
    EXPECT_EQ(std::memcmp(&loss, &want_loss, sizeof loss), 0)
        << "loss " << loss << " vs " << want_loss;
    EXPECT_EQ(model.AuxLoss(), ref.AuxLoss());
    EXPECT_NEAR(model.FlopsPerToken(), ref.FlopsPerToken(), 1e-9 * ref.FlopsPerToken());
    for (int l = 0; l < v.c.trunk.n_layer; ++l) {
      if (!v.c.IsMoeLayer(l)) continue;
      EXPECT_EQ(model.Routing(l), ref.Routing(l)) << "block " << l;
      EXPECT_EQ(model.ExpertTokens(l), ref.ExpertTokens(l)) << "block " << l;
    }
    for (size_t pass = 0; pass < 2; ++pass) {
      ASSERT_EQ(got[pass].size(), want[pass].size());
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < got[pass].size(); ++i)
        if (std::memcmp(&got[pass][i], &want[pass][i], 4) != 0 && bad++ == 0) first = i;
      EXPECT_EQ(bad, 0u) << (pass ? "accumulated" : "overwritten") << " gradients: " << bad
                         << " differ, first at " << first << ": " << got[pass][first] << " vs "
                         << want[pass][first];
    }
  }
}

TEST(BackendMoe, CpuBackendEqualsMoeGptBitForBit) {
  auto cpu = MakeCpuBackend();
  ExpectSameAsMoeGpt(*cpu);
}

// The variant with 16 experts leaves some without tokens (fp32 and bf16 weights), so the
// overwrite pass above checks their explicit zeros; routing is not readable before a forward.
TEST(BackendMoe, IdleExpertsAreExercised) {
  MoeConfig c = testing::TinyConfig();
  c.n_expert = 16;
  c.top_k = 1;
  c.trunk.bf16_attention = false;
  auto cpu = MakeCpuBackend();
  for (DType w : {DType::kF32, DType::kBF16}) {
    BackendMoeModel model(*cpu, c);
    DenseParams p(model, w);
    p.Init(5);
    std::vector<int32_t> tok(16), tgt(16);
    SyntheticTokens(c.trunk.vocab, 3).Batch(0, 2, 8, tok.data(), tgt.data());
    model.SetBatch(tok.data(), tgt.data(), 2, 8);
    EXPECT_THROW(model.ExpertTokens(1), PlanError);
    for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, p.Weights(g));
    int idle = 0;
    for (int64_t n : model.ExpertTokens(1)) idle += n == 0;
    EXPECT_GT(idle, 0) << DTypeName(w) << ": the variant must leave an expert without tokens";
    EXPECT_THROW(model.ExpertTokens(0), PlanError);  // a dense block
  }
}

// The trunk keeps a dense MLP's activations (fc1 and GELU outputs per block, one gradient
// buffer) only for the blocks that run one; an MoE block's MLP half through it is refused.
TEST(BackendMoe, TrunkHoldsMlpActivationsOnlyForDenseBlocks) {
  auto cpu = MakeCpuBackend();
  const GptConfig c = testing::TinyConfig().trunk;
  const int B = 2, T = 8;
  BackendGpt all(*cpu, c, B, T), one(*cpu, c, B, T, {true, false}),
      none(*cpu, c, B, T, {false, false});
  const int64_t mlp = int64_t{B} * T * c.ff() * 4;
  EXPECT_EQ(all.activation_bytes() - one.activation_bytes(), 2 * mlp);
  EXPECT_EQ(one.activation_bytes() - none.activation_bytes(), 3 * mlp);
  std::vector<float> w(1 << 16, 0.01f);
  const void* p[6] = {w.data(), w.data(), w.data(), w.data(), w.data(), w.data()};
  std::vector<int32_t> tok(B * T, 1);
  one.SetTokens(tok.data(), tok.data());
  one.ForwardGroup(0, p, DType::kF32);
  one.ForwardGroup(1, p, DType::kF32);  // block 0: dense
  EXPECT_THROW(one.ForwardGroup(2, p, DType::kF32), PlanError);
  EXPECT_THROW(BackendGpt(*cpu, c, B, T, {true}), ConfigError);
}

TEST(BackendMoe, MxOnlyInExpertGroupsAndFp32GradientsOnly) {
  auto cpu = MakeCpuBackend();
  BackendMoeModel model(*cpu, testing::TinyConfig());
  EXPECT_FALSE(model.ConsumesMx());  // without expert groups the router would be FP8 too
  MoeConfig eg = testing::TinyConfig();
  eg.expert_group = true;
  BackendMoeModel grouped(*cpu, eg);
  MoeGpt ref(eg);
  EXPECT_TRUE(grouped.ConsumesMx());
  for (int g = 0; g < grouped.num_groups(); ++g)
    EXPECT_EQ(grouped.GroupConsumesMx(g), ref.GroupConsumesMx(g)) << "group " << g;
  DenseParams p(model, DType::kF32, DType::kBF16);
  p.Init(1);
  std::vector<int32_t> tok(8, 1), tgt(8, 2);
  model.SetBatch(tok.data(), tgt.data(), 1, 8);
  for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, p.Weights(g));
  try {
    model.Backward(model.num_groups() - 1, p.Weights(model.num_groups() - 1),
                   p.Grads(model.num_groups() - 1), GradWrite::kOverwrite);
    ADD_FAILURE() << "bf16 gradients accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--reduce fp32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sshsdp
