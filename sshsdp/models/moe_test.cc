// Tests of the reference MoE GPT against its contract (model.h, moe.h):
// * the forward pass equals an independent naive per-token implementation (router, top-k,
//   gates, experts, shared expert, aux loss) for softmax/sigmoid gating, renormalised or
//   not, SwiGLU/GELU experts, top-1/top-2 — so the permutation and grouped GEMMs compute the
//   intended function, not merely a self-consistent one;
// * finite-difference gradient checks per runtime group (embedding, a dense block, an MoE
//   block with router and aux loss, head) in fp32, with central differences at two step
//   sizes combined by Richardson extrapolation, taken only where routing does not change
//   (top-k selection is piecewise constant): the step shrinks until routing is stable;
// * routing edge cases, forced through the router weights and checked through Routing():
//   experts that receive no tokens (NaN-prefilled gradient slices come out exactly zero in
//   overwrite mode, sentinel-filled ones stay untouched in accumulate mode), all tokens to
//   one expert, ties (equal logits → lower expert index), top-k = 1 and 2;
// * kOverwrite writes every element, kAccumulate adds (twice = 2×), fp32 and bf16 gradients;
// * packed layout: one runtime parameter per matrix kind, per-expert kMatrix update parts;
//   the router is kept off Muon; moe_every / moe_layers select the MoE blocks;
// * bf16 weights track fp32; a few SGD steps on synthetic data lower the loss; presets and
//   FlopsPerToken (active experts only);
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
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/testing/grad_check.h"
#include "sshsdp/numerics/mx.h"
#include "sshsdp/numerics/scale_layout.h"

namespace sshsdp {
namespace {

using testing::Batch;
using testing::RandomBatch;
using testing::RandomizeWeights;
using testing::Richardson;
using testing::RunBackward;
using testing::RunForward;

// Block 0 dense, block 1 MoE (4 experts of width 12, top-2, shared expert of width 8).
MoeConfig TinyConfig() {
  MoeConfig c;
  c.trunk.vocab = 32;
  c.trunk.seq_len = 8;
  c.trunk.d_model = 16;
  c.trunk.n_head = 2;
  c.trunk.n_layer = 2;
  c.n_expert = 4;
  c.top_k = 2;
  c.d_expert = 12;
  c.moe_every = 2;
  c.shared_expert = true;
  c.d_shared = 8;
  c.aux_loss_weight = 0.1f;  // large enough that its gradient is well above fp32 noise
  return c;
}

int ParamIndex(const DenseParams& p, int g, const std::string& suffix) {
  for (size_t i = 0; i < p.specs(g).size(); ++i) {
    const std::string& n = p.specs(g)[i].name;
    if (n.size() >= suffix.size() &&
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      return static_cast<int>(i);
  }
  ADD_FAILURE() << "no parameter ending in " << suffix << " in group " << g;
  return 0;
}

std::vector<std::vector<int32_t>> AllRouting(const MoeGpt& m) {
  std::vector<std::vector<int32_t>> r;
  for (int l = 0; l < m.config().trunk.n_layer; ++l) {
    if (m.config().IsMoeLayer(l)) r.push_back(m.Routing(l));
  }
  return r;
}

// Central difference of the loss along `dir` of parameter (g, i), steps h and h/2 combined
// by Richardson extrapolation; the step shrinks until no evaluation changes the routing.
double NumericDirectional(MoeGpt& m, DenseParams& p, const Batch& b, int g, int i,
                          const std::vector<float>& dir, double h) {
  RunForward(m, p, b);
  const auto routing = AllRouting(m);
  std::vector<float> saved = p.master(g, i);
  for (int attempt = 0; attempt < 5; ++attempt, h /= 4) {
    bool stable = true;
    const double d = Richardson(
        [&](double eps) {
          for (size_t k = 0; k < saved.size(); ++k) p.master(g, i)[k] = saved[k] + eps * dir[k];
          p.SyncWeights();
          double loss = RunForward(m, p, b);
          stable = stable && AllRouting(m) == routing;
          return loss;
        },
        h);
    p.master(g, i) = saved;
    p.SyncWeights();
    if (stable) return d;
  }
  ADD_FAILURE() << p.specs(g)[i].name << ": routing changes at every step size";
  return std::numeric_limits<double>::quiet_NaN();
}

void CheckGroupGradients(const MoeConfig& c, int group, uint32_t seed = 11) {
  MoeGpt m(c);
  DenseParams p(m);
  RandomizeWeights(p, seed);
  Batch b = RandomBatch(2, 7, 24, 5);
  RunForward(m, p, b);
  RunBackward(m, p, GradWrite::kOverwrite);
  testing::CheckGroupGradients(
      p, group,
      [&](int i, const std::vector<float>& dir) {
        return NumericDirectional(m, p, b, group, i, dir, 1e-2);
      },
      /*require_nonzero=*/true);
}

TEST(MoeGradients, EmbeddingGroup) { CheckGroupGradients(TinyConfig(), 0); }
TEST(MoeGradients, DenseBlock) { CheckGroupGradients(TinyConfig(), 1); }
TEST(MoeGradients, HeadGroup) { CheckGroupGradients(TinyConfig(), 3); }
// MoE block: router (through the gates and the aux loss), packed experts, shared expert.
TEST(MoeGradients, MoeBlockSoftmaxRenormSwigluShared) { CheckGroupGradients(TinyConfig(), 2); }
TEST(MoeGradients, MoeBlockSigmoidGeluNoRenormLargeAux) {
  MoeConfig c = TinyConfig();
  c.gating = Gating::kSigmoid;
  c.renormalize = false;
  c.expert_mlp = ExpertMlp::kGelu;
  c.shared_expert = false;
  c.aux_loss_weight = 1.0f;
  CheckGroupGradients(c, 2);
}
TEST(MoeGradients, MoeBlockTop1Softmax) {
  MoeConfig c = TinyConfig();
  c.top_k = 1;
  c.renormalize = false;
  CheckGroupGradients(c, 2);
}
// Top-1 renormalised: the gate is identically 1, so the router learns only from the aux loss.
TEST(MoeGradients, MoeBlockTop1SigmoidRenormAuxOnlyRouter) {
  MoeConfig c = TinyConfig();
  c.top_k = 1;
  c.gating = Gating::kSigmoid;
  CheckGroupGradients(c, 2);
}
// Every block MoE (the MoE block's gradient flows into the one below it).
TEST(MoeGradients, FirstOfTwoMoeBlocks) {
  MoeConfig c = TinyConfig();
  c.moe_every = 1;
  CheckGroupGradients(c, 1);
}

// ---- Naive reference forward: per token, no permutation, no GEMM library. ----

std::vector<float> RmsNorm(const std::vector<float>& x, const float* g, int d) {
  std::vector<float> y(x.size());
  for (size_t r = 0; r < x.size() / d; ++r) {
    double ss = 0;
    for (int i = 0; i < d; ++i) ss += double(x[r * d + i]) * x[r * d + i];
    double s = 1.0 / std::sqrt(ss / d + 1e-5);
    for (int i = 0; i < d; ++i) y[r * d + i] = static_cast<float>(x[r * d + i] * s * g[i]);
  }
  return y;
}

// y[out] = W[out, in] · x[in] for one row.
std::vector<double> MatVec(const float* w, const float* x, int out, int in) {
  std::vector<double> y(out, 0.0);
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) y[o] += double(w[o * in + i]) * x[i];
  return y;
}

double Act(ExpertMlp kind, double h1, double h3) {
  if (kind == ExpertMlp::kSwiGLU) return h1 / (1 + std::exp(-h1)) * h3;
  return 0.5 * h1 * (1 + std::tanh(0.7978845608028654 * (h1 + 0.044715 * h1 * h1 * h1)));
}

// One-block model whose attention weights are zero (so the block input reaches ln2 as is).
double NaiveLoss(const MoeConfig& c, DenseParams& p, const Batch& b, double* aux_out) {
  const int d = c.trunk.d_model, V = c.trunk.vocab, E = c.n_expert, k = c.top_k;
  const int f = c.expert_ff(), fs = c.shared_ff(), N = b.B * b.T;
  const bool swiglu = c.expert_mlp == ExpertMlp::kSwiGLU;
  std::vector<float> x(N * d);
  for (int t = 0; t < N; ++t)
    for (int i = 0; i < d; ++i)
      x[t * d + i] = p.master(0, 0)[b.tokens[t] * d + i] + p.master(0, 1)[(t % b.T) * d + i];
  const std::vector<float> ln2 = RmsNorm(x, p.master(1, 3).data(), d);
  const float* wr = p.master(1, 4).data();
  const float* w1 = p.master(1, 5).data();
  const float* w2 = p.master(1, 6).data();
  const float* w3 = swiglu ? p.master(1, 7).data() : nullptr;
  std::vector<int> count(E, 0);
  std::vector<double> pmean(E, 0.0);
  std::vector<float> h(x);
  for (int t = 0; t < N; ++t) {
    const float* xt = ln2.data() + t * d;
    std::vector<double> z = MatVec(wr, xt, E, d);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int c2) { return z[a] > z[c2]; });
    std::vector<double> s(E), q(E);
    double zmax = *std::max_element(z.begin(), z.end()), sum = 0;
    for (int e = 0; e < E; ++e) {
      s[e] = c.gating == Gating::kSoftmax ? std::exp(z[e] - zmax) : 1 / (1 + std::exp(-z[e]));
      sum += s[e];
    }
    for (int e = 0; e < E; ++e) {
      if (c.gating == Gating::kSoftmax) s[e] /= sum;
      q[e] = c.gating == Gating::kSoftmax ? s[e] : s[e] / sum;
      pmean[e] += q[e] / N;
    }
    double gsum = 0;
    for (int j = 0; j < k; ++j) gsum += s[order[j]];
    for (int j = 0; j < k; ++j) {
      const int e = order[j];
      count[e]++;
      const double gate = c.renormalize ? s[e] / gsum : s[e];
      std::vector<double> h1 = MatVec(w1 + e * f * d, xt, f, d);
      std::vector<double> h3 = swiglu ? MatVec(w3 + e * f * d, xt, f, d) : h1;
      std::vector<float> a(f);
      for (int u = 0; u < f; ++u) a[u] = static_cast<float>(Act(c.expert_mlp, h1[u], h3[u]));
      std::vector<double> y = MatVec(w2 + e * d * f, a.data(), d, f);
      for (int i = 0; i < d; ++i) h[t * d + i] += static_cast<float>(gate * y[i]);
    }
    if (c.shared_expert) {
      const int base = swiglu ? 8 : 7;
      std::vector<double> h1 = MatVec(p.master(1, base).data(), xt, fs, d);
      std::vector<double> h3 = swiglu ? MatVec(p.master(1, base + 2).data(), xt, fs, d) : h1;
      std::vector<float> a(fs);
      for (int u = 0; u < fs; ++u) a[u] = static_cast<float>(Act(c.expert_mlp, h1[u], h3[u]));
      std::vector<double> y = MatVec(p.master(1, base + 1).data(), a.data(), d, fs);
      for (int i = 0; i < d; ++i) h[t * d + i] += static_cast<float>(y[i]);
    }
  }
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += double(count[e]) / (N * k) * pmean[e];
  aux *= c.aux_loss_weight * E;
  *aux_out = aux;
  const std::vector<float> lnf = RmsNorm(h, p.master(2, 0).data(), d);
  double ce = 0;
  for (int t = 0; t < N; ++t) {
    std::vector<double> logits = MatVec(p.master(2, 1).data(), lnf.data() + t * d, V, d);
    double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (double v : logits) sum += std::exp(v - mx);
    ce += mx + std::log(sum) - logits[b.targets[t]];
  }
  return ce / N + aux;
}

TEST(Moe, ForwardMatchesNaivePerTokenReference) {
  struct Variant {
    Gating gating;
    bool renorm;
    ExpertMlp mlp;
    int k;
    bool shared;
  };
  const Variant variants[] = {{Gating::kSoftmax, true, ExpertMlp::kSwiGLU, 2, true},
                              {Gating::kSoftmax, false, ExpertMlp::kGelu, 1, false},
                              {Gating::kSigmoid, true, ExpertMlp::kGelu, 2, true},
                              {Gating::kSigmoid, false, ExpertMlp::kSwiGLU, 3, false}};
  for (const Variant& v : variants) {
    MoeConfig c = TinyConfig();
    c.trunk.n_layer = 1;
    c.moe_every = 1;
    c.gating = v.gating;
    c.renormalize = v.renorm;
    c.expert_mlp = v.mlp;
    c.top_k = v.k;
    c.shared_expert = v.shared;
    MoeGpt m(c);
    DenseParams p(m);
    RandomizeWeights(p, 21);
    std::fill(p.master(1, 1).begin(), p.master(1, 1).end(), 0.0f);  // qkv
    std::fill(p.master(1, 2).begin(), p.master(1, 2).end(), 0.0f);  // attn.proj
    p.SyncWeights();
    Batch b = RandomBatch(3, 8, 32, 8);
    const double loss = RunForward(m, p, b);
    double aux = 0;
    const double want = NaiveLoss(c, p, b, &aux);
    SCOPED_TRACE(fmt::format("{} renorm={} {} k={} shared={}", GatingName(v.gating), v.renorm,
                             ExpertMlpName(v.mlp), v.k, v.shared));
    EXPECT_NEAR(loss, want, 2e-5 * want);
    EXPECT_NEAR(m.AuxLoss(), aux, 1e-6 * aux + 1e-9);
    EXPECT_DOUBLE_EQ(m.Loss(), m.CrossEntropy() + m.AuxLoss());
    // Several experts are in use and token counts add up to N·k.
    std::vector<int64_t> n = m.ExpertTokens(0);
    EXPECT_EQ(std::accumulate(n.begin(), n.end(), int64_t{0}), 24 * v.k);
    EXPECT_GE(std::count_if(n.begin(), n.end(), [](int64_t x) { return x > 0; }), 2);
  }
}

// ---- Routing edge cases, forced through the router. ----

// Makes coordinate 0 dominate every block's input (a large constant in the token
// embeddings) and sets router column 0 to `col0` (other columns scaled down), so block l's
// logits order the experts like col0 for every token (ln2 gains stay positive).
void ForceRouting(DenseParams& p, int group, const std::vector<float>& col0) {
  const int64_t d = p.specs(0)[0].shape[1];
  for (size_t r = 0; r < p.master(0, 0).size() / d; ++r) p.master(0, 0)[r * d] = 30.0f;
  std::vector<float>& ln2 = p.master(group, 3);
  for (float& g : ln2) g = std::abs(g);
  std::vector<float>& wr = p.master(group, 4);
  for (size_t e = 0; e < col0.size(); ++e) {
    for (int64_t i = 1; i < d; ++i) wr[e * d + i] *= 0.01f;
    wr[e * d] = col0[e];
  }
  p.SyncWeights();
}

void ExpectRouting(const MoeGpt& m, int l, const std::vector<int32_t>& per_token) {
  const std::vector<int32_t> r = m.Routing(l);
  const size_t k = per_token.size();
  ASSERT_EQ(r.size() % k, 0u);
  for (size_t t = 0; t < r.size() / k; ++t) {
    for (size_t j = 0; j < k; ++j) ASSERT_EQ(r[t * k + j], per_token[j]) << "token " << t;
  }
}

TEST(MoeRouting, AllTokensToOneExpertTop1) {
  MoeConfig c = TinyConfig();
  c.top_k = 1;
  MoeGpt m(c);
  DenseParams p(m);
  RandomizeWeights(p, 3);
  ForceRouting(p, 2, {-1.0f, 2.0f, -1.0f, -3.0f});
  Batch b = RandomBatch(2, 8, 32, 4);
  RunForward(m, p, b);
  ExpectRouting(m, 1, {1});
  EXPECT_EQ(m.ExpertTokens(1), (std::vector<int64_t>{0, 16, 0, 0}));
  // f = (0, 1, 0, 0): aux = α·E·P_1.
  EXPECT_GT(m.AuxLoss(), c.aux_loss_weight);
}

TEST(MoeRouting, TiesGoToTheLowerExpertIndex) {
  for (int k : {1, 2}) {
    MoeConfig c = TinyConfig();
    c.top_k = k;
    MoeGpt m(c);
    DenseParams p(m);
    RandomizeWeights(p, 5);
    // Experts 1 and 2 beat 0 and 3 with router rows (1, 0, ..., 0): their logits are the same
    // single product x_0·1 (every other term an exact zero), equal in any summation order.
    ForceRouting(p, 2, {-2.0f, 1.0f, 1.0f, -2.0f});
    std::vector<float>& wr = p.master(2, 4);
    const int d = c.trunk.d_model;
    for (int e : {1, 2}) std::fill(wr.begin() + e * d + 1, wr.begin() + (e + 1) * d, 0.0f);
    p.SyncWeights();
    Batch b = RandomBatch(2, 8, 32, 4);
    RunForward(m, p, b);
    if (k == 1) {
      ExpectRouting(m, 1, {1});
      EXPECT_EQ(m.ExpertTokens(1), (std::vector<int64_t>{0, 16, 0, 0}));
    } else {
      ExpectRouting(m, 1, {1, 2});
      EXPECT_EQ(m.ExpertTokens(1), (std::vector<int64_t>{0, 16, 16, 0}));
    }
  }
  // A zero router: all logits tie, so top-k = experts 0..k-1 and the aux loss is exactly α
  // (uniform P, f = 1/k on k experts).
  for (Gating gating : {Gating::kSoftmax, Gating::kSigmoid}) {
    MoeConfig c = TinyConfig();
    c.gating = gating;
    MoeGpt m(c);
    DenseParams p(m);
    RandomizeWeights(p, 6);
    std::fill(p.master(2, 4).begin(), p.master(2, 4).end(), 0.0f);
    p.SyncWeights();
    Batch b = RandomBatch(2, 8, 32, 4);
    RunForward(m, p, b);
    ExpectRouting(m, 1, {0, 1});
    EXPECT_NEAR(m.AuxLoss(), c.aux_loss_weight, 1e-7);
  }
}

void FillGrads(DenseParams& p, DType gd, float value) {
  for (int g = 0; g < p.num_groups(); ++g) {
    for (size_t i = 0; i < p.specs(g).size(); ++i) {
      const int64_t n = p.specs(g)[i].numel();
      TensorRef t = p.Grads(g)[i];
      if (gd == DType::kF32) {
        std::fill_n(static_cast<float*>(t.data), n, value);
      } else {
        std::fill_n(static_cast<bf16*>(t.data), n, FloatToBf16(value));
      }
    }
  }
}

// Experts without tokens: exact zeros in their packed-gradient slices in overwrite mode
// (NaN-prefilled views), untouched in accumulate mode; every other element is written, and
// accumulate adds (twice = 2×). fp32 and bf16 gradient views, top-1 and top-2.
TEST(MoeRouting, EmptyExpertsGetExplicitZerosAndAccumulateLeavesThemAlone) {
  for (DType gd : {DType::kF32, DType::kBF16}) {
    for (int k : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} top-{}", DTypeName(gd), k));
      MoeConfig c = TinyConfig();
      c.top_k = k;
      MoeGpt m(c);
      DenseParams p(m, DType::kF32, gd);
      RandomizeWeights(p, 7);
      ForceRouting(p, 2, {1.0f, -3.0f, 2.0f, -1.0f});  // every token: expert 2, then 0
      Batch b = RandomBatch(2, 6, 20, 9);              // T = 6 < seq_len, rows 20.. unused
      RunForward(m, p, b);
      ExpectRouting(m, 1, k == 1 ? std::vector<int32_t>{2} : std::vector<int32_t>{2, 0});
      const std::vector<bool> empty = k == 1 ? std::vector<bool>{true, true, false, true}
                                             : std::vector<bool>{false, true, false, true};

      FillGrads(p, gd, std::numeric_limits<float>::quiet_NaN());
      RunBackward(m, p, GradWrite::kOverwrite);
      std::vector<std::vector<std::vector<float>>> first(m.num_groups());
      for (int g = 0; g < m.num_groups(); ++g) {
        for (size_t i = 0; i < p.specs(g).size(); ++i) {
          first[g].push_back(p.GradAsFloat(g, static_cast<int>(i)));
          for (float v : first[g].back()) ASSERT_TRUE(std::isfinite(v)) << p.specs(g)[i].name;
        }
      }
      // Packed expert gradients of the MoE block (group 2): zero slices exactly where empty.
      const int w1 = ParamIndex(p, 2, "moe.w1"), w2 = ParamIndex(p, 2, "moe.w2"),
                w3 = ParamIndex(p, 2, "moe.w3");
      for (int wi : {w1, w2, w3}) {
        const RuntimeParamSpec& s = p.specs(2)[wi];
        ASSERT_EQ(s.parts.size(), 4u);
        for (int e = 0; e < 4; ++e) {
          const UpdatePart& part = s.parts[e];
          double sum = 0;
          for (int64_t q = 0; q < part.numel(); ++q) sum += std::abs(first[2][wi][part.offset + q]);
          if (empty[e]) {
            EXPECT_EQ(sum, 0.0) << part.name;
          } else {
            EXPECT_GT(sum, 0.0) << part.name;
          }
        }
      }
      // Accumulate: sentinel in the empty slices stays; everything else doubles.
      for (int wi : {w1, w2, w3}) {
        const RuntimeParamSpec& s = p.specs(2)[wi];
        for (int e = 0; e < 4; ++e) {
          if (!empty[e]) continue;
          const UpdatePart& part = s.parts[e];
          TensorRef t = p.Grads(2)[wi];
          for (int64_t q = 0; q < part.numel(); ++q) {
            if (gd == DType::kF32) {
              static_cast<float*>(t.data)[part.offset + q] = 7.0f;
            } else {
              static_cast<bf16*>(t.data)[part.offset + q] = FloatToBf16(7.0f);
            }
          }
        }
      }
      RunBackward(m, p, GradWrite::kAccumulate);
      for (int g = 0; g < m.num_groups(); ++g) {
        for (size_t i = 0; i < p.specs(g).size(); ++i) {
          std::vector<float> twice = p.GradAsFloat(g, static_cast<int>(i));
          // Scatter-adds (embedding rows, expert tokens) onto existing values round in another
          // order than onto zeros: allow fp32 summation error relative to the tensor's scale.
          double scale = 0;
          for (float v : first[g][i]) scale = std::max(scale, std::abs(static_cast<double>(v)));
          for (const UpdatePart& part : p.specs(g)[i].parts) {
            bool sentinel = false;
            if (g == 2 && (static_cast<int>(i) == w1 || static_cast<int>(i) == w2 ||
                           static_cast<int>(i) == w3)) {
              sentinel = empty[std::stoi(part.name.substr(part.name.rfind(".e") + 2))];
            }
            for (int64_t q = part.offset; q < part.offset + part.numel(); ++q) {
              if (sentinel) {
                ASSERT_EQ(twice[q], 7.0f) << part.name;
                continue;
              }
              double tol = gd == DType::kF32 ? 1e-6 * std::abs(first[g][i][q]) + 1e-7 * scale
                                             : 1.0 / 128 * std::abs(first[g][i][q]);
              ASSERT_NEAR(twice[q], 2.0 * first[g][i][q], tol) << part.name << "[" << q << "]";
            }
          }
        }
      }
    }
  }
}

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

TEST(Moe, GradScaleScalesGradientsIncludingAux) {
  MoeGpt m(TinyConfig());
  DenseParams p(m);
  RandomizeWeights(p, 8);
  Batch b = RandomBatch(1, 8, 32, 1);
  RunForward(m, p, b);
  RunBackward(m, p, GradWrite::kOverwrite);
  std::vector<float> r1 = p.GradAsFloat(2, 4), e1 = p.GradAsFloat(2, 5);
  m.SetGradScale(0.25);
  RunBackward(m, p, GradWrite::kOverwrite);
  std::vector<float> r2 = p.GradAsFloat(2, 4), e2 = p.GradAsFloat(2, 5);
  for (size_t k = 0; k < r1.size(); ++k) EXPECT_NEAR(r2[k], 0.25 * r1[k], 1e-6 * std::abs(r1[k]));
  for (size_t k = 0; k < e1.size(); ++k) EXPECT_NEAR(e2[k], 0.25 * e1[k], 1e-6 * std::abs(e1[k]));
}

TEST(Moe, Bf16WeightsAndGradientsTrackFp32) {
  MoeConfig c = TinyConfig();
  MoeGpt m(c);
  DenseParams p32(m), p16(m, DType::kBF16, DType::kBF16);
  RandomizeWeights(p16, 4);
  testing::CopyRoundedToBf16(p16, p32);
  Batch b = RandomBatch(2, 8, 32, 6);
  double l32 = RunForward(m, p32, b);
  auto route32 = AllRouting(m);
  RunBackward(m, p32, GradWrite::kOverwrite);
  double l16 = RunForward(m, p16, b);
  // The router computes in fp32 from the same bf16-representable weights; only bf16
  // activations upstream can move a near-tie, so at most a few assignments differ.
  const auto route16 = AllRouting(m);
  ASSERT_EQ(route16.size(), route32.size());
  int moved = 0;
  for (size_t l = 0; l < route16.size(); ++l)
    for (size_t i = 0; i < route16[l].size(); ++i) moved += route16[l][i] != route32[l][i];
  EXPECT_LE(moved, 2);
  RunBackward(m, p16, GradWrite::kOverwrite);
  EXPECT_NEAR(l16, l32, 2e-2 * l32);
  testing::ExpectGradientsAligned(p32, p16, 0.98);
}

TEST(Moe, SgdLowersLossOnSyntheticData) {
  MoeConfig c = TinyConfig();
  c.trunk.seq_len = 16;
  c.trunk.d_model = 32;
  c.moe_every = 1;
  c.d_expert = 32;
  c.aux_loss_weight = 0.01f;
  MoeGpt m(c);
  DenseParams p(m);
  p.Init(1);
  testing::ExpectSgdLowersLoss(m, p, c.trunk.vocab, [&] { return m.CrossEntropy(); });
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
