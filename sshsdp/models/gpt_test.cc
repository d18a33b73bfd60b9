// Tests of the reference GPT against its own contract (model.h, gpt.h):
// * finite-difference gradient checks per runtime group (embedding, a block, the head) in
//   fp32: directional derivatives of every runtime parameter and single elements, with
//   central differences at two step sizes combined by Richardson extrapolation (the
//   "double-checked" difference), on a tiny config with weights large enough that the
//   gradients stand well above fp32 noise;
// * kOverwrite writes every element of NaN-prefilled gradient views (zeros for rows of
//   tokens that did not occur and positions beyond T), kAccumulate adds (twice = 2×);
// * the QKV update parts tile the packed runtime parameter, per head, in Q/K/V order;
// * bf16 weights and gradients track the fp32 model; execution order is enforced;
// * a few steps of plain SGD on synthetic data lower the loss;
// * packed_qkv = false (per-part QKV runtime parameters, per-part GEMMs): finite-difference
//   gradients of its block groups, the same loss and gradients as the packed model on the same
//   weights (fp32 and bf16), the same update names and init values.
#include "sshsdp/models/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/models/testing/grad_check.h"

namespace sshsdp {
namespace {

using testing::Batch;
using testing::RandomBatch;
using testing::RandomizeWeights;
using testing::Richardson;
using testing::RunBackward;
using testing::RunForward;

GptConfig TinyConfig() {
  GptConfig c;
  c.vocab = 32;
  c.seq_len = 8;
  c.d_model = 16;
  c.n_head = 2;
  c.n_layer = 2;
  return c;
}

// Central difference of the loss along direction `dir` of parameter (g, i), combining
// steps h and h/2 by Richardson extrapolation.
double NumericDirectional(Gpt& m, DenseParams& p, const Batch& b, int g, int i,
                          const std::vector<float>& dir, double h) {
  std::vector<float> saved = p.master(g, i);
  double d = Richardson(
      [&](double eps) {
        for (size_t k = 0; k < saved.size(); ++k) p.master(g, i)[k] = saved[k] + eps * dir[k];
        p.SyncWeights();
        return RunForward(m, p, b);
      },
      h);
  p.master(g, i) = saved;
  p.SyncWeights();
  return d;
}

void CheckGroupGradients(int group, bool packed_qkv = true) {
  GptConfig c = TinyConfig();
  c.packed_qkv = packed_qkv;
  Gpt m(c);
  DenseParams p(m);
  RandomizeWeights(p, 11);
  Batch b = RandomBatch(2, 7, 24, 5);
  RunForward(m, p, b);
  RunBackward(m, p, GradWrite::kOverwrite);
  testing::CheckGroupGradients(
      p, group,
      [&](int i, const std::vector<float>& dir) {
        return NumericDirectional(m, p, b, group, i, dir, 1e-2);
      },
      /*require_nonzero=*/false);
}

TEST(GptGradients, EmbeddingGroup) { CheckGroupGradients(0); }
TEST(GptGradients, FirstBlock) { CheckGroupGradients(1); }
TEST(GptGradients, LastBlock) { CheckGroupGradients(2); }
TEST(GptGradients, HeadGroup) { CheckGroupGradients(3); }
TEST(GptGradients, PerPartQkvFirstBlock) { CheckGroupGradients(1, /*packed_qkv=*/false); }
TEST(GptGradients, PerPartQkvLastBlock) { CheckGroupGradients(2, /*packed_qkv=*/false); }

// Copies packed-model master weights into the per-part model's (the packed QKV parameter's
// parts, in order, are the per-part model's runtime parameters 1 .. 3H of a block group).
void CopyPackedToPerPart(DenseParams& packed, DenseParams& parts) {
  for (int g = 0; g < packed.num_groups(); ++g) {
    size_t j = 0;  // runtime parameter of `parts`
    for (size_t i = 0; i < packed.specs(g).size(); ++i) {
      const RuntimeParamSpec& s = packed.specs(g)[i];
      for (const UpdatePart& part : s.parts) {
        ASSERT_EQ(parts.specs(g)[j].name, s.parts.size() > 1 ? part.name : s.name);
        ASSERT_EQ(parts.specs(g)[j].parts.at(0).name, part.name);
        std::vector<float>& to = parts.master(g, static_cast<int>(j));
        const auto from = packed.master(g, static_cast<int>(i)).begin() + part.offset;
        std::copy(from, from + static_cast<std::ptrdiff_t>(to.size()), to.begin());
        ++j;
      }
    }
    ASSERT_EQ(j, parts.specs(g).size());
  }
  parts.SyncWeights();
}

// The per-part gradients, concatenated per packed runtime parameter.
std::vector<float> PackedGrad(const DenseParams& parts, int g, size_t first, size_t count) {
  std::vector<float> out;
  for (size_t j = first; j < first + count; ++j) {
    std::vector<float> v = parts.GradAsFloat(g, static_cast<int>(j));
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(Gpt, PerPartQkvComputesThePackedModel) {
  GptConfig c = TinyConfig();
  c.n_head = 4;
  Gpt packed(c);
  c.packed_qkv = false;
  Gpt per_part(c);
  EXPECT_FALSE(per_part.ConsumesMx());
  ASSERT_EQ(per_part.GroupParams(1).size(), 5u + 12u);
  EXPECT_EQ(per_part.GroupParams(1)[1].name, "blocks.0.attn.q.h0");
  EXPECT_EQ(per_part.GroupParams(1)[12].name, "blocks.0.attn.v.h3");
  EXPECT_EQ(per_part.GroupParams(1)[12].shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(per_part.NumParams(), packed.NumParams());
  EXPECT_DOUBLE_EQ(per_part.FlopsPerToken(), packed.FlopsPerToken());
  {
    // Same update names and FillInit values: init weights interoperate.
    DenseParams a(packed), b(per_part), a_in_b(per_part);
    a.Init(9);
    b.Init(9);
    CopyPackedToPerPart(a, a_in_b);
    for (int g = 0; g < b.num_groups(); ++g)
      for (size_t j = 0; j < b.specs(g).size(); ++j)
        EXPECT_EQ(b.master(g, static_cast<int>(j)), a_in_b.master(g, static_cast<int>(j)))
            << b.specs(g)[j].name;
  }
  // fp32 (summation order only) and bf16 weights and gradients (same roundings of the
  // operands; a gradient may land on the neighbouring bf16 value).
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    DenseParams a(packed, dt, dt), b(per_part, dt, dt);
    RandomizeWeights(a, 12);
    CopyPackedToPerPart(a, b);
    Batch batch = RandomBatch(2, 8, 32, 4);
    const double la = RunForward(packed, a, batch);
    RunBackward(packed, a, GradWrite::kOverwrite);
    const double lb = RunForward(per_part, b, batch);
    RunBackward(per_part, b, GradWrite::kOverwrite);
    EXPECT_NEAR(lb, la, (dt == DType::kF32 ? 1e-6 : 1e-4) * la);
    const double rel = dt == DType::kF32 ? 1e-5 : 1.0 / 64;
    for (int g = 0; g < packed.num_groups(); ++g) {
      size_t j = 0;
      for (size_t i = 0; i < a.specs(g).size(); ++i) {
        const size_t n = a.specs(g)[i].parts.size();
        std::vector<float> ga = a.GradAsFloat(g, static_cast<int>(i));
        std::vector<float> gb = PackedGrad(b, g, j, n);
        j += n;
        ASSERT_EQ(ga.size(), gb.size());
        double scale = 0;
        for (float v : ga) scale = std::max(scale, static_cast<double>(std::abs(v)));
        for (size_t k = 0; k < ga.size(); ++k)
          ASSERT_NEAR(gb[k], ga[k], rel * std::abs(ga[k]) + 1e-6 * scale)
              << a.specs(g)[i].name << "[" << k << "]";
      }
    }
    // Accumulate mode adds into the part's view (a K head: part 5 of 12).
    const std::vector<float> once = b.GradAsFloat(1, 6);
    RunBackward(per_part, b, GradWrite::kAccumulate);
    const std::vector<float> twice = b.GradAsFloat(1, 6);
    for (size_t k = 0; k < once.size(); ++k)
      EXPECT_NEAR(twice[k], 2.0 * once[k],
                  (dt == DType::kF32 ? 1e-6 : 1.0 / 128) * std::abs(once[k]));
  }
}

TEST(Gpt, QkvPartsTileThePackedParameterPerHead) {
  GptConfig c = TinyConfig();
  c.n_head = 4;
  Gpt m(c);
  ASSERT_EQ(m.num_groups(), c.n_layer + 2);
  for (int g = 0; g < m.num_groups(); ++g) {
    for (const RuntimeParamSpec& s : m.GroupParams(g)) ValidateSpec(s);
  }
  std::vector<RuntimeParamSpec> block = m.GroupParams(2);
  ASSERT_EQ(block.size(), 6u);
  const RuntimeParamSpec& qkv = block[1];
  EXPECT_EQ(qkv.name, "blocks.1.attn.qkv");
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{48, 16}));
  ASSERT_EQ(qkv.parts.size(), 12u);
  const char* kinds[] = {"q", "k", "v"};
  for (int j = 0; j < 12; ++j) {
    const UpdatePart& part = qkv.parts[j];
    EXPECT_EQ(part.name, fmt::format("blocks.1.attn.{}.h{}", kinds[j / 4], j % 4));
    EXPECT_EQ(part.shape, (std::vector<int64_t>{4, 16}));
    EXPECT_EQ(part.offset, j * 4 * 16);  // head j's rows [4j, 4j+4) of the [48, 16] matrix
    EXPECT_EQ(part.kind, UpdateKind::kMatrix);
  }
  EXPECT_EQ(block[0].parts[0].kind, UpdateKind::kVector);
  EXPECT_EQ(m.GroupParams(0)[0].parts[0].kind, UpdateKind::kEmbedding);
  EXPECT_EQ(m.GroupParams(3)[1].name, "lm_head");

  RuntimeParamSpec bad = qkv;
  bad.parts[3].offset += 1;
  EXPECT_THROW(ValidateSpec(bad), PlanError);
  bad = qkv;
  bad.parts.pop_back();
  EXPECT_THROW(ValidateSpec(bad), PlanError);
}

TEST(Gpt, OverwriteFillsEveryGradientElementAndAccumulateAdds) {
  for (DType gd : {DType::kF32, DType::kBF16}) {
    Gpt m(TinyConfig());
    DenseParams p(m, DType::kF32, gd);
    RandomizeWeights(p, 2);
    Batch b = RandomBatch(2, 6, 20, 9);  // tokens < 20: rows 20..31 unused; T=6 < seq_len=8
    RunForward(m, p, b);
    // NaN-prefill every gradient view.
    for (int g = 0; g < m.num_groups(); ++g) {
      for (size_t i = 0; i < p.specs(g).size(); ++i) {
        int64_t n = p.specs(g)[i].numel();
        TensorRef t = p.Grads(g)[i];
        if (gd == DType::kF32) {
          std::fill_n(static_cast<float*>(t.data), n, std::numeric_limits<float>::quiet_NaN());
        } else {
          std::fill_n(static_cast<bf16*>(t.data), n, bf16{0x7FC0});
        }
      }
    }
    RunBackward(m, p, GradWrite::kOverwrite);
    std::vector<std::vector<std::vector<float>>> first(m.num_groups());
    for (int g = 0; g < m.num_groups(); ++g) {
      for (size_t i = 0; i < p.specs(g).size(); ++i) {
        first[g].push_back(p.GradAsFloat(g, static_cast<int>(i)));
        for (float v : first[g].back()) ASSERT_TRUE(std::isfinite(v)) << p.specs(g)[i].name;
      }
    }
    const int d = 16;
    for (int tok = 20; tok < 32; ++tok) {
      for (int k = 0; k < d; ++k) EXPECT_EQ(first[0][0][tok * d + k], 0.0f) << "wte row " << tok;
    }
    for (int t = 6; t < 8; ++t) {
      for (int k = 0; k < d; ++k) EXPECT_EQ(first[0][1][t * d + k], 0.0f) << "wpe row " << t;
    }
    // Backward again with accumulate (the activations are unchanged): every gradient doubles.
    RunBackward(m, p, GradWrite::kAccumulate);
    for (int g = 0; g < m.num_groups(); ++g) {
      for (size_t i = 0; i < p.specs(g).size(); ++i) {
        std::vector<float> twice = p.GradAsFloat(g, static_cast<int>(i));
        for (size_t k = 0; k < twice.size(); ++k) {
          // bf16: 2x is exact, but the second contribution is rounded once more.
          double tol = gd == DType::kF32 ? 1e-6 * std::abs(first[g][i][k])
                                         : 1.0 / 128 * std::abs(first[g][i][k]);
          ASSERT_NEAR(twice[k], 2.0 * first[g][i][k], tol)
              << p.specs(g)[i].name << "[" << k << "] " << DTypeName(gd);
        }
      }
    }
  }
}

TEST(Gpt, Bf16WeightsAndGradientsTrackFp32) {
  Gpt m(TinyConfig());
  DenseParams p32(m), p16(m, DType::kBF16, DType::kBF16);
  RandomizeWeights(p16, 4);
  testing::CopyRoundedToBf16(p16, p32);  // same (bf16-representable) weights in fp32
  Batch b = RandomBatch(2, 8, 32, 6);
  double l32 = RunForward(m, p32, b);
  RunBackward(m, p32, GradWrite::kOverwrite);
  double l16 = RunForward(m, p16, b);
  RunBackward(m, p16, GradWrite::kOverwrite);
  EXPECT_NEAR(l16, l32, 2e-2 * l32);
  testing::ExpectGradientsAligned(p32, p16, 0.98);
}

// GptConfig::bf16_attention: with bf16 QKV weights attention runs on bf16 operands (the
// loss moves, within bf16 steps of the fp32-attention model's), with fp32 weights it changes
// no bit. The kernel itself is kernels_attention_bf16_test's.
TEST(Gpt, Bf16AttentionFollowsTheConfigAndTheQkvDtype) {
  Batch b = RandomBatch(2, 8, 32, 6);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    double loss[2];
    for (bool bf16_attention : {false, true}) {
      GptConfig c = TinyConfig();
      c.bf16_attention = bf16_attention;
      Gpt m(c);
      DenseParams p(m, dt, dt);
      RandomizeWeights(p, 4);
      loss[bf16_attention] = RunForward(m, p, b);
      RunBackward(m, p, GradWrite::kOverwrite);
    }
    SCOPED_TRACE(DTypeName(dt));
    if (dt == DType::kBF16) {
      EXPECT_NE(loss[0], loss[1]);
      EXPECT_NEAR(loss[1], loss[0], 1e-2 * loss[0]);
    } else {
      EXPECT_EQ(loss[0], loss[1]);
    }
  }
}

// With bf16 weights the linear layers' inputs come rounded from their producers (RMSNorm,
// GELU, the loss's backward) or are rounded once for both backward products, so the only
// fp32 activation a product still rounds is the attention output (proj's input: forward and
// weight gradient), 2·L·B·T·d elements per forward + backward; fp32 weights round nothing.
// That each piece has the bits of rounding inside the product is matmul_test's and
// layers_test's; cli_backend_test runs the whole model on --backend cpu against the host
// engine (AdamW, bf16 weights, 2 ranks). A Backward with views
// of other dtypes than its Forward's is refused (it would read the stored inputs as the
// wrong type).
TEST(Gpt, Bf16LinearInputsAreRoundedOnce) {
  const int B = 2, T = 8;
  for (bool packed : {true, false}) {
    GptConfig c = TinyConfig();
    c.packed_qkv = packed;
    Gpt m(c);
    Batch b = RandomBatch(B, T, 32, 6);
    for (DType dt : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(::testing::Message() << "packed " << packed << " " << DTypeName(dt));
      DenseParams p(m, dt, dt);
      RandomizeWeights(p, 4);
      const int64_t before = kernels::LinearRoundedElements();
      RunForward(m, p, b);
      RunBackward(m, p, GradWrite::kOverwrite);
      const int64_t want = dt == DType::kBF16 ? 2LL * c.n_layer * B * T * c.d_model : 0;
      EXPECT_EQ(kernels::LinearRoundedElements() - before, want);
    }
    DenseParams p16(m, DType::kBF16, DType::kF32), p32(m);
    RunForward(m, p16, b);
    const int last = m.num_groups() - 1;
    EXPECT_THROW(m.Backward(last, p32.Weights(last), p32.Grads(last), GradWrite::kOverwrite),
                 PlanError);
  }
}

TEST(Gpt, EnforcesExecutionOrderAndValidatesInput) {
  Gpt m(TinyConfig());
  DenseParams p(m);
  p.Init(1);
  Batch b = RandomBatch(1, 4, 32, 2);
  EXPECT_THROW(m.Forward(0, p.Weights(0)), PlanError);  // no batch yet
  m.SetBatch(b.tokens.data(), b.targets.data(), 1, 4);
  EXPECT_THROW(m.Forward(1, p.Weights(1)), PlanError);
  EXPECT_THROW(m.Backward(3, p.Weights(3), p.Grads(3), GradWrite::kOverwrite), PlanError);
  EXPECT_THROW(m.Loss(), PlanError);
  EXPECT_THROW(m.Forward(0, p.Weights(1)), PlanError);  // wrong number of views
  for (int g = 0; g < m.num_groups(); ++g) m.Forward(g, p.Weights(g));
  EXPECT_NEAR(m.Loss(), std::log(32.0), 0.1);  // small init: near uniform
  EXPECT_THROW(m.Backward(2, p.Weights(2), p.Grads(2), GradWrite::kOverwrite), PlanError);
  b.tokens[0] = 32;
  EXPECT_THROW(m.SetBatch(b.tokens.data(), b.targets.data(), 1, 4), ConfigError);
  EXPECT_THROW(m.SetBatch(b.tokens.data(), b.targets.data(), 1, 9), ConfigError);
  EXPECT_THROW(GptConfig::Preset("huge"), ConfigError);
  GptConfig bad = TinyConfig();
  bad.n_head = 3;
  EXPECT_THROW(Gpt{bad}, ConfigError);
}

TEST(Gpt, PresetsAndFlops) {
  GptConfig s = GptConfig::Preset("small");
  EXPECT_EQ(s.d_model, 128);
  EXPECT_EQ(s.n_layer, 4);
  EXPECT_EQ(s.seq_len, 128);
  Gpt m(s);
  const double d = 128, L = 4, V = 256, T = 128;
  const double n_gemm = L * 12 * d * d + V * d;
  EXPECT_DOUBLE_EQ(m.FlopsPerToken(), 6 * n_gemm + 12 * L * d * T);
  EXPECT_EQ(m.NumParams(), static_cast<int64_t>(n_gemm + V * d + T * d + (2 * L + 1) * d));
  EXPECT_EQ(GptConfig::Preset("base").n_head, 8);
}

// A GPT-2-style padded vocabulary (llm.c's 50,257 -> 50,304, here 40 -> 64): the tables
// have padded rows that start at zero, the padded logits take no probability mass (the loss
// does not depend on those rows at all), and their gradients are exactly zero.
TEST(Gpt, PaddedVocabularyRowsStayZeroAndTakeNoGradient) {
  GptConfig c = TinyConfig();
  c.vocab = 40;
  c.vocab_multiple = 64;
  EXPECT_EQ(c.padded_vocab(), 64);
  EXPECT_EQ(GptConfig{}.padded_vocab(), 256);  // bytes: no padding
  GptConfig gpt2;
  gpt2.vocab = 50257;
  EXPECT_EQ(gpt2.padded_vocab(), 50304);
  Gpt m(c);
  const int64_t d = c.d_model, V = c.vocab, Vp = 64;
  const RuntimeParamSpec wte = m.GroupParams(0)[0], head = m.GroupParams(c.n_layer + 1)[1];
  ASSERT_EQ(wte.shape, (std::vector<int64_t>{Vp, d}));
  ASSERT_EQ(head.shape, (std::vector<int64_t>{Vp, d}));
  DenseParams p(m);
  p.Init(3);
  for (const auto& [g, i] : {std::pair{0, 0}, std::pair{c.n_layer + 1, 1}}) {
    const std::vector<float>& t = p.master(g, i);
    for (int64_t k = V * d; k < Vp * d; ++k)
      ASSERT_EQ(t[k], 0.0f) << "padded row " << k / d << " initialised";
    EXPECT_NE(t[(V - 1) * d], 0.0f);  // the last real row is drawn
  }
  Batch b = RandomBatch(2, 7, 40, 9);
  const double loss = RunForward(m, p, b);
  const float* probs = m.Probs();
  ASSERT_EQ(m.ProbsStride(), Vp);
  for (int r = 0; r < 14; ++r) {
    double sum = 0;
    for (int64_t v = 0; v < Vp; ++v) {
      if (v >= V) {
        ASSERT_EQ(probs[r * Vp + v], 0.0f);
      }
      sum += probs[r * Vp + v];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  // Large values in the padded LM-head rows change nothing.
  for (int64_t k = V * d; k < Vp * d; ++k) p.master(c.n_layer + 1, 1)[k] = 3.0f;
  p.SyncWeights();
  EXPECT_EQ(RunForward(m, p, b), loss);
  RunBackward(m, p, GradWrite::kOverwrite);
  for (const auto& [g, i] : {std::pair{0, 0}, std::pair{c.n_layer + 1, 1}}) {
    const std::vector<float> grad = p.GradAsFloat(g, i);
    for (int64_t k = V * d; k < Vp * d; ++k)
      ASSERT_EQ(grad[k], 0.0f) << "gradient of row " << k / d;
  }
  // The batch check names the real vocabulary.
  b.tokens[3] = 40;
  EXPECT_THROW(m.SetBatch(b.tokens.data(), b.targets.data(), b.B, b.T), ConfigError);
}

TEST(Gpt, FillInitIsIndependentOfSharding) {
  UpdatePart part{"blocks.0.attn.q.h1",
                  {64, 32},
                  0,
                  UpdateKind::kMatrix,
                  InitSpec{InitSpec::Kind::kNormal, 0.02f}};
  std::vector<float> whole(2048), pieces(2048);
  FillInit(part, 5, 0, 2048, whole.data());
  FillInit(part, 5, 0, 700, pieces.data());
  FillInit(part, 5, 700, 1348, pieces.data() + 700);
  EXPECT_EQ(whole, pieces);
  double s2 = 0;
  for (float v : whole) s2 += v * v;
  EXPECT_NEAR(std::sqrt(s2 / 2048), 0.02, 0.002);
  std::vector<float> other(2048);
  FillInit(part, 6, 0, 2048, other.data());
  EXPECT_NE(whole, other);
}

TEST(Gpt, SgdLowersLossOnSyntheticData) {
  GptConfig c = TinyConfig();
  c.seq_len = 16;
  c.d_model = 32;
  Gpt m(c);
  DenseParams p(m);
  p.Init(1);
  testing::ExpectSgdLowersLoss(m, p, c.vocab, [&] { return m.Loss(); });
}

// A trunk for a model that replaces some blocks' MLP (MoeGpt) holds MLP activations for the
// other blocks only, and refuses to run a block without one as a whole.
TEST(Gpt, TrunkHoldsMlpActivationsOnlyForBlocksWithOne) {
  const GptConfig c = GptConfig::Preset("tiny");  // L = 2, d_ff = 256
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  Gpt full(c, *cpu), trunk(c, *cpu, {false, true});
  const int B = 2, T = 8;
  const std::vector<int32_t> tok(B * T, 3);
  full.SetBatch(tok.data(), tok.data(), B, T);
  trunk.SetBatch(tok.data(), tok.data(), B, T);
  const int64_t fch = int64_t{B} * T * c.ff() * 4;  // one block's fc1 output, in bytes
  EXPECT_EQ(full.ActivationBytes() - trunk.ActivationBytes(), 2 * fch);  // fch and fch_gelu
  DenseParams p(full);
  p.Init(1);
  trunk.ForwardEmbedding(p.Weights(0));
  try {
    trunk.ForwardBlock(0, p.Weights(1));
    ADD_FAILURE() << "a block without its MLP ran whole";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("has no dense MLP"), std::string::npos) << e.what();
  }
  trunk.ForwardAttention(0, p.Weights(1));  // its attention half runs
}

}  // namespace
}  // namespace sshsdp
