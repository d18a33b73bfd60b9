// Routing and forward-value tests of the reference MoE GPT (model.h, moe.h): what the router,
// the token permutation and the grouped expert GEMMs compute, checked from outside:
// * the forward pass equals an independent naive per-token implementation (router, top-k,
//   gates, experts, shared expert, aux loss) for softmax/sigmoid gating, renormalised or
//   not, SwiGLU/GELU experts, top-1/top-2/top-3 — so the permutation and grouped GEMMs
//   compute the intended function, not merely a self-consistent one;
// * routing edge cases, forced through the router weights and checked through Routing():
//   experts that receive no tokens (NaN-prefilled gradient slices come out exactly zero in
//   overwrite mode, sentinel-filled ones stay untouched in accumulate mode), all tokens to
//   one expert, ties (equal logits → lower expert index), top-k = 1 and 2;
// * kOverwrite writes every element, kAccumulate adds (twice = 2×), fp32 and bf16 gradients.
#include "sshsdp/models/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/models/testing/grad_check.h"
#include "sshsdp/models/testing/moe_fixtures.h"

namespace sshsdp {
namespace {

using testing::Batch;
using testing::RandomBatch;
using testing::RandomizeWeights;
using testing::RunBackward;
using testing::RunForward;
using testing::TinyConfig;

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

}  // namespace
}  // namespace sshsdp
