// Test helpers shared by the model tests (gpt_test, moe_*test): random token batches, weights
// with O(1) activations, forward/backward over every group of DenseParams, finite-difference
// gradient checks (central differences at two step sizes combined by Richardson
// extrapolation), plain SGD, and bf16-vs-fp32 comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sshsdp/models/data.h"
#include "sshsdp/numerics/dtype.h"
#include "sshsdp/params/model.h"

namespace sshsdp::testing {

struct Batch {
  int B, T;
  std::vector<int32_t> tokens, targets;
};

// Tokens drawn from the first `vocab_used` ids (so some embedding rows get no gradient);
// token 1 repeats token 0.
inline Batch RandomBatch(int B, int T, int vocab_used, uint32_t seed) {
  Batch b{B, T, std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
  std::mt19937 rng(seed);
  for (int i = 0; i < B * T; ++i) {
    b.tokens[i] = static_cast<int32_t>(rng() % vocab_used);
    b.targets[i] = static_cast<int32_t>(rng() % vocab_used);
  }
  b.tokens[1] = b.tokens[0];  // a repeated token
  return b;
}

// Weights with O(1) activations: matrices N(0, 0.35²), gains 1 + N(0, 0.2²).
inline void RandomizeWeights(DenseParams& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int g = 0; g < p.num_groups(); ++g) {
    for (size_t i = 0; i < p.specs(g).size(); ++i) {
      bool gain = p.specs(g)[i].shape.size() == 1;
      for (float& v : p.master(g, i)) v = gain ? 1.0f + 0.2f * n(rng) : 0.35f * n(rng);
    }
  }
  p.SyncWeights();
}

// `to`'s master weights := `from`'s rounded to bf16 (the same bf16-representable weights).
inline void CopyRoundedToBf16(DenseParams& from, DenseParams& to) {
  for (int g = 0; g < from.num_groups(); ++g) {
    for (size_t i = 0; i < from.specs(g).size(); ++i) {
      to.master(g, i) = from.master(g, i);
      for (float& v : to.master(g, i)) v = RoundToBf16(v);
    }
  }
  to.SyncWeights();
}

inline double RunForward(Model& m, DenseParams& p, const Batch& b) {
  m.SetBatch(b.tokens.data(), b.targets.data(), b.B, b.T);
  for (int g = 0; g < m.num_groups(); ++g) m.Forward(g, p.Weights(g));
  return m.Loss();
}

inline void RunBackward(Model& m, DenseParams& p, GradWrite mode) {
  for (int g = m.num_groups() - 1; g >= 0; --g) m.Backward(g, p.Weights(g), p.Grads(g), mode);
}

// Plain SGD on every master weight from the gradients of the last backward.
inline void SgdUpdate(DenseParams& p, float lr) {
  for (int g = 0; g < p.num_groups(); ++g) {
    for (size_t i = 0; i < p.specs(g).size(); ++i) {
      std::vector<float> gr = p.GradAsFloat(g, static_cast<int>(i));
      for (size_t k = 0; k < gr.size(); ++k) p.master(g, i)[k] -= lr * gr[k];
    }
  }
  p.SyncWeights();
}

// 60 steps of SGD (lr 1) on synthetic tokens of `vocab` ids (3-grams, branching 2), B = 8,
// T = 16, from p's current weights: the first `loss()` is near uniform (log vocab), the mean of
// the last five lies 0.5 below it and not below the data's optimal loss.
inline void ExpectSgdLowersLoss(Model& m, DenseParams& p, int vocab,
                                const std::function<double()>& loss) {
  SyntheticTokens data(vocab, 3, /*branching=*/2);
  const int B = 8, T = 16;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  double first = 0, last = 0;
  const int steps = 60;
  for (int step = 0; step < steps; ++step) {
    data.Batch(static_cast<int64_t>(step) * B, B, T, tok.data(), tgt.data());
    m.SetBatch(tok.data(), tgt.data(), B, T);
    for (int g = 0; g < m.num_groups(); ++g) m.Forward(g, p.Weights(g));
    if (step == 0) first = loss();
    if (step >= steps - 5) last += loss() / 5;
    RunBackward(m, p, GradWrite::kOverwrite);
    SgdUpdate(p, 1.0f);
  }
  EXPECT_NEAR(first, std::log(static_cast<double>(vocab)), 0.1);
  EXPECT_LT(last, first - 0.5) << "optimal " << data.OptimalLoss();
  EXPECT_GT(last, data.OptimalLoss() - 0.05);
}

// Central difference of `loss_at(eps)` at 0, steps h and h/2 combined by Richardson
// extrapolation.
inline double Richardson(const std::function<double(double eps)>& loss_at, double h) {
  double d1 = (loss_at(h) - loss_at(-h)) / (2 * h);
  double d2 = (loss_at(h / 2) - loss_at(-h / 2)) / h;
  return (4 * d2 - d1) / 3;
}

// The numeric derivative of the loss along `dir` of parameter i of the checked group.
using NumericDerivative = std::function<double(int i, const std::vector<float>& dir)>;

// For every parameter of `group` (gradients from the last backward): the directional
// derivative along a random ±1 direction, then the three largest-magnitude elements one at a
// time, against `numeric` (step 1e-2 by convention of the callers). `require_nonzero`: an
// all-zero gradient is a fatal failure.
inline void CheckGroupGradients(DenseParams& p, int group, const NumericDerivative& numeric,
                                bool require_nonzero) {
  std::mt19937 rng(3);
  for (size_t i = 0; i < p.specs(group).size(); ++i) {
    const std::string& name = p.specs(group)[i].name;
    const std::vector<float> grad = p.GradAsFloat(group, static_cast<int>(i));
    // Directional derivative along a random ±1 direction.
    std::vector<float> dir(grad.size());
    double analytic = 0.0, scale = 0.0;
    for (size_t k = 0; k < dir.size(); ++k) {
      dir[k] = (rng() & 1) ? 1.0f : -1.0f;
      analytic += static_cast<double>(dir[k]) * grad[k];
      scale += std::abs(grad[k]);
    }
    if (require_nonzero) {
      ASSERT_GT(scale, 0.0) << name << " has an all-zero gradient";
    }
    double num = numeric(static_cast<int>(i), dir);
    EXPECT_NEAR(num, analytic, 2e-4 * scale + 1e-6) << name << " directional";
    // The three largest-magnitude elements, one at a time.
    std::vector<size_t> idx(grad.size());
    std::iota(idx.begin(), idx.end(), 0);
    const size_t top = std::min<size_t>(3, idx.size());
    std::partial_sort(idx.begin(), idx.begin() + top, idx.end(),
                      [&](size_t a, size_t c) { return std::abs(grad[a]) > std::abs(grad[c]); });
    for (size_t j = 0; j < top; ++j) {
      std::vector<float> e(grad.size(), 0.0f);
      e[idx[j]] = 1.0f;
      double n = numeric(static_cast<int>(i), e);
      EXPECT_NEAR(n, grad[idx[j]], 2e-3 * std::abs(grad[idx[j]]) + 1e-5)
          << name << " element " << idx[j];
    }
  }
}

// Every parameter's gradient in `b` points the way of its gradient in `a`: cosine > min_cos.
inline void ExpectGradientsAligned(const DenseParams& a, const DenseParams& b, double min_cos) {
  for (int g = 0; g < a.num_groups(); ++g) {
    for (size_t i = 0; i < a.specs(g).size(); ++i) {
      auto x = a.GradAsFloat(g, static_cast<int>(i));
      auto y = b.GradAsFloat(g, static_cast<int>(i));
      double dot = 0, nx = 0, ny = 0;
      for (size_t k = 0; k < x.size(); ++k) {
        dot += static_cast<double>(x[k]) * y[k];
        nx += static_cast<double>(x[k]) * x[k];
        ny += static_cast<double>(y[k]) * y[k];
      }
      EXPECT_GT(dot / std::sqrt(nx * ny + 1e-300), min_cos) << b.specs(g)[i].name;
    }
  }
}

}  // namespace sshsdp::testing
