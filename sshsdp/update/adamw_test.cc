// AdamW kernel against a scalar double-precision transcription of PyTorch's AdamW
// (decoupled decay first, bias correction), over several steps and spans.
#include "sshsdp/update/adamw.h"

#include <gtest/gtest.h>

#include <cmath>

namespace sshsdp {
namespace {

TEST(AdamW, MatchesScalarReferenceOverSteps) {
  AdamWConfig cfg;
  cfg.lr = 0.01f;
  cfg.weight_decay = 0.1f;
  const int n = 7;
  std::vector<float> w(n), g(n), m(n, 0), v(n, 0);
  std::vector<double> rw(n), rm(n, 0), rv(n, 0);
  for (int i = 0; i < n; ++i) w[i] = rw[i] = 0.1f * (i - 3);
  const float scale = 0.25f;
  for (int t = 1; t <= 5; ++t) {
    for (int i = 0; i < n; ++i) g[i] = std::sin(1.0f * i + t);
    AdamWStep({{w.data(), g.data(), m.data(), v.data(), 4, cfg.weight_decay},
               {w.data() + 4, g.data() + 4, m.data() + 4, v.data() + 4, 3, 0.0f}},
              cfg, t, scale);
    for (int i = 0; i < n; ++i) {
      double wd = i < 4 ? cfg.weight_decay : 0.0;
      double gi = double(g[i]) * scale;
      rw[i] *= 1.0 - double(cfg.lr) * wd;
      rm[i] = cfg.beta1 * rm[i] + (1 - double(cfg.beta1)) * gi;
      rv[i] = cfg.beta2 * rv[i] + (1 - double(cfg.beta2)) * gi * gi;
      double mh = rm[i] / (1 - std::pow(double(cfg.beta1), t));
      double vh = rv[i] / (1 - std::pow(double(cfg.beta2), t));
      rw[i] -= cfg.lr * mh / (std::sqrt(vh) + cfg.eps);
      EXPECT_NEAR(w[i], rw[i], 1e-6) << "t=" << t << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace sshsdp
