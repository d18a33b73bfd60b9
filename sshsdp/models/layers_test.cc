// The vectorised GELU forward/backward against the scalar reference (FastTanh, libm expf) and
// against double precision, over a sweep of the fp32 range (odd lengths, so the vector loops'
// remainders run too), with saturation, zeros, and NaN kept NaN; the softmax cross-entropy
// against a double-precision evaluation on odd vocabularies; and every threaded kernel
// (RMSNorm, GELU, SwiGLU, cross-entropy) giving the same bits on 1 and 3 threads; SwiGLU
// against double precision.
#include "sshsdp/models/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/parallel.h"

namespace sshsdp::layers {
namespace {

double GeluRef(double v) {
  return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}
double GeluGradRef(double v) {
  const double u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) +
         0.5 * v * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
}

// n draws of N(0, stddev²) per call, from one seeded stream.
struct Normals {
  Normals(uint32_t seed, float stddev) : rng(seed), nd(0.0f, stddev) {}
  std::vector<float> operator()(int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = nd(rng);
    return v;
  }
  std::mt19937 rng;
  std::normal_distribution<float> nd;
};

std::vector<float> Sweep() {
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.00731f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 30.0f, -30.0f, 1e4f, -1e4f}) x.push_back(v);
  x.push_back(0.5f);  // odd length
  return x;
}

TEST(Gelu, VectorisedMatchesTheScalarReferenceAndDoublePrecision) {
  const std::vector<float> x = Sweep();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size()), dy(x.size(), 1.0f);
  GeluForward(x.data(), y.data(), n);
  GeluBackwardInPlace(x.data(), dy.data(), n);
  double worst_fwd = 0, worst_bwd = 0, ref_fwd = 0, ref_bwd = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    if (std::abs(v) > 1e3f) {  // saturated: identity for large v, 0 for very negative v
      EXPECT_EQ(y[i], v > 0 ? v : 0.0f) << v;
      EXPECT_EQ(dy[i], v > 0 ? 1.0f : 0.0f) << v;
      continue;
    }
    // The scalar reference of the same formula (libm expf).
    const float ref = 0.5f * v * (1.0f + FastTanh(kGeluC * (v + 0.044715f * v * v * v)));
    const double scale = 1.0 + std::abs(static_cast<double>(v));
    EXPECT_NEAR(y[i], ref, 3e-7 * scale) << "x = " << v;
    worst_fwd = std::max(worst_fwd, std::abs(y[i] - GeluRef(v)) / scale);
    worst_bwd = std::max(worst_bwd, std::abs(dy[i] - GeluGradRef(v)) / scale);
    // The scalar reference's own error, for the bound below.
    const float t = FastTanh(kGeluC * (v + 0.044715f * v * v * v));
    const float dref =
        0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
    ref_fwd = std::max(ref_fwd, std::abs(ref - GeluRef(v)) / scale);
    ref_bwd = std::max(ref_bwd, std::abs(dref - GeluGradRef(v)) / scale);
  }
  // No less accurate than the scalar reference (both are fp32 evaluations of the formula).
  EXPECT_LT(worst_fwd, 2 * ref_fwd + 1e-7) << "reference " << ref_fwd;
  EXPECT_LT(worst_bwd, 2 * ref_bwd + 1e-7) << "reference " << ref_bwd;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float yn = 0, dn = 1;
  GeluForward(&nan, &yn, 1);
  GeluBackwardInPlace(&nan, &dn, 1);
  EXPECT_TRUE(std::isnan(yn));
  EXPECT_TRUE(std::isnan(dn));
}

TEST(SoftmaxCrossEntropy, MatchesDoublePrecisionOnOddVocabularies) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 4.0f);
  for (int64_t V : {1, 7, 61, 257, 1031}) {
    const int64_t rows = 5;
    std::vector<float> logits(rows * V);
    for (float& z : logits) z = d(rng);
    logits[3] = 80.0f;  // a dominant logit: other probabilities underflow towards 0
    std::vector<int32_t> targets(rows);
    for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 37) % V);
    std::vector<float> p = logits, losses(rows);
    const double total =
        SoftmaxCrossEntropyForward(p.data(), targets.data(), losses.data(), rows, V, V);
    double want_total = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* z = logits.data() + r * V;
      double mx = z[0], sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
      const double lse = mx + std::log(sum);
      const double loss = lse - z[targets[r]];
      want_total += loss;
      EXPECT_NEAR(losses[r], loss, 1e-5 * (1 + std::abs(loss))) << "V=" << V << " row " << r;
      double psum = 0;
      for (int64_t v = 0; v < V; ++v) {
        // 1e-6 absolute, plus 2e-6 relative: a build that cannot vectorise the fp32 sum of the
        // exponentials (the sanitizer build) sums ~1000 terms in one lane (seen: 1.15e-6 off
        // on a probability of 0.75).
        const double want_p = std::exp(z[v] - lse);
        EXPECT_NEAR(p[r * V + v], want_p, 1e-6 + 2e-6 * want_p) << "V=" << V << " v=" << v;
        psum += p[r * V + v];
      }
      EXPECT_NEAR(psum, 1.0, 1e-5);
    }
    EXPECT_NEAR(total, want_total, 1e-5 * (1 + std::abs(want_total)));
  }
}

// A vocabulary padded to ld columns (gpt.h): the padded logits, however large, take no
// probability mass and get zero gradient; the real columns are exactly the unpadded result.
TEST(SoftmaxCrossEntropy, PaddedColumnsTakeNoMass) {
  const int64_t rows = 5, V = 257, ld = 384;
  std::vector<float> dense(rows * V), padded(rows * ld, 1e4f);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) {
    targets[r] = static_cast<int32_t>((r * 91) % V);
    for (int64_t v = 0; v < V; ++v)
      dense[r * V + v] = padded[r * ld + v] = static_cast<float>(std::sin(0.37 * (r * V + v)) * 4);
  }
  std::vector<float> l_dense(rows), l_padded(rows);
  const double t_dense =
      SoftmaxCrossEntropyForward(dense.data(), targets.data(), l_dense.data(), rows, V, V);
  const double t_padded =
      SoftmaxCrossEntropyForward(padded.data(), targets.data(), l_padded.data(), rows, V, ld);
  EXPECT_EQ(t_dense, t_padded);
  std::vector<float> d_dense(rows * V), d_padded(rows * ld, 7.0f);
  SoftmaxCrossEntropyBackward(dense.data(), targets.data(), d_dense.data(), rows, V, 0.5f);
  SoftmaxCrossEntropyBackward(padded.data(), targets.data(), d_padded.data(), rows, ld, 0.5f);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(l_dense[r], l_padded[r]);
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_EQ(dense[r * V + v], padded[r * ld + v]) << r << "," << v;
      ASSERT_EQ(d_dense[r * V + v], d_padded[r * ld + v]) << r << "," << v;
    }
    for (int64_t v = V; v < ld; ++v) {
      ASSERT_EQ(padded[r * ld + v], 0.0f) << "padded probability " << r << "," << v;
      ASSERT_EQ(d_padded[r * ld + v], 0.0f) << "padded gradient " << r << "," << v;
    }
  }
}

// SwiGLU (one vectorised exp per element) against double precision over the fp32 sweep,
// with saturation at both ends, and its backward with da aliasing dh1 (the MoE experts'
// in-place call).
TEST(Swiglu, MatchesDoublePrecisionAndSaturates) {
  const std::vector<float> z = Sweep();
  const int64_t n = static_cast<int64_t>(z.size());
  std::vector<float> h3(n), a(n), dh1(n), dh3(n);
  for (int64_t i = 0; i < n; ++i) h3[i] = 0.5f + static_cast<float>(i % 7) * 0.25f;
  SwigluForward(z.data(), h3.data(), a.data(), n);
  for (int64_t i = 0; i < n; ++i) dh1[i] = 1.0f - static_cast<float>(i % 5) * 0.3f;  // = da
  const std::vector<float> da = dh1;
  SwigluBackward(z.data(), h3.data(), dh1.data(), dh1.data(), dh3.data(), n);
  double worst_a = 0, worst_d1 = 0, worst_d3 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = z[i], s = 1.0 / (1.0 + std::exp(-v));
    const double want_a = v * s * h3[i];
    const double want_d1 = da[i] * h3[i] * s * (1.0 + v * (1.0 - s));
    const double want_d3 = da[i] * v * s;
    worst_a = std::max(worst_a, std::abs(a[i] - want_a) / std::max(1.0, std::abs(want_a)));
    worst_d1 = std::max(worst_d1, std::abs(dh1[i] - want_d1) / std::max(1.0, std::abs(want_d1)));
    worst_d3 = std::max(worst_d3, std::abs(dh3[i] - want_d3) / std::max(1.0, std::abs(want_d3)));
  }
  EXPECT_LT(worst_a, 1e-6);
  EXPECT_LT(worst_d1, 1e-6);
  EXPECT_LT(worst_d3, 1e-6);
  const float big[] = {-1e4f, 1e4f}, one[] = {1.0f, 1.0f};
  float out[2];
  SwigluForward(big, one, out, 2);
  EXPECT_LT(std::abs(out[0]), 1e-30f);  // σ(−1e4) = 1/(1 + e^88) at the clamp: −6e-35
  EXPECT_EQ(out[1], 1e4f);
}

// Threads decide which thread computes a row or an element, never how: 1 and 3 threads give
// the same bits (shapes large enough that 3 threads split them).
TEST(Threads, KernelsGiveTheSameBitsAtAnyThreadCount) {
  const int64_t rows = 1000, V = 90, ld = 96;
  const int d = 67;
  Normals random(5, 1.0f);
  const std::vector<float> x = random(rows * d), g = random(d), dy = random(rows * d);
  const std::vector<float> gx = random(100003), logits = random(rows * ld);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 37) % V);

  struct Out {
    std::vector<float> y, rstd, dx, dg, gelu, dgelu, probs, losses, dlogits, sw, dsw1, dsw3;
    double loss = 0;
  };
  const int before = kernels::KernelThreads();
  auto run = [&](int threads) {
    kernels::SetKernelThreads(threads);
    Out o{std::vector<float>(rows * d),
          std::vector<float>(rows),
          std::vector<float>(rows * d, 0.5f),
          std::vector<float>(d),
          std::vector<float>(gx.size()),
          std::vector<float>(gx.size(), 1.5f),
          logits,
          std::vector<float>(rows),
          std::vector<float>(rows * ld)};
    RmsNormForward(x.data(), g.data(), o.y.data(), o.rstd.data(), rows, d);
    RmsNormBackward(dy.data(), x.data(), g.data(), o.rstd.data(), o.dx.data(), o.dg.data(), rows, d,
                    /*accumulate_dx=*/true);
    GeluForward(gx.data(), o.gelu.data(), static_cast<int64_t>(gx.size()));
    GeluBackwardInPlace(gx.data(), o.dgelu.data(), static_cast<int64_t>(gx.size()));
    o.loss =
        SoftmaxCrossEntropyForward(o.probs.data(), targets.data(), o.losses.data(), rows, V, ld);
    SoftmaxCrossEntropyBackward(o.probs.data(), targets.data(), o.dlogits.data(), rows, ld, 0.25f);
    const int64_t m = static_cast<int64_t>(gx.size());
    o.sw.resize(m);
    o.dsw1.resize(m);
    o.dsw3.resize(m);
    SwigluForward(gx.data(), o.gelu.data(), o.sw.data(), m);
    SwigluBackward(gx.data(), o.gelu.data(), o.dgelu.data(), o.dsw1.data(), o.dsw3.data(), m);
    kernels::SetKernelThreads(before);
    return o;
  };
  const Out one = run(1), three = run(3);
  EXPECT_EQ(one.y, three.y);
  EXPECT_EQ(one.rstd, three.rstd);
  EXPECT_EQ(one.dx, three.dx);
  EXPECT_EQ(one.dg, three.dg);
  EXPECT_EQ(one.gelu, three.gelu);
  EXPECT_EQ(one.dgelu, three.dgelu);
  EXPECT_EQ(one.probs, three.probs);
  EXPECT_EQ(one.losses, three.losses);
  EXPECT_EQ(one.loss, three.loss);
  EXPECT_EQ(one.dlogits, three.dlogits);
  EXPECT_EQ(one.sw, three.sw);
  EXPECT_EQ(one.dsw1, three.dsw1);
  EXPECT_EQ(one.dsw3, three.dsw3);
}

// The bf16-output kernels (a bf16 linear layer's inputs) equal the fp32 kernel followed by
// CastToBf16, bit for bit, on odd sizes across the per-thread buffer's tiles, at 1 and 3
// threads; GELU's backward leaves its dy alone.
TEST(Bf16Outputs, EqualTheFp32KernelThenOneRounding) {
  Normals random(9, 2.0f);
  auto cast = [](const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    kernels::CastToBf16(v.data(), reinterpret_cast<bf16*>(out.data()),
                        static_cast<int64_t>(v.size()));
    return out;
  };
  const int before = kernels::KernelThreads();
  for (int threads : {1, 3}) {
    kernels::SetKernelThreads(threads);
    for (const int64_t rows : {1, 7, 1031}) {
      for (const int d : {1, 67, 2049}) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, " << rows << "x" << d);
        const auto x = random(rows * d), g = random(d);
        std::vector<float> y(rows * d), rstd(rows), rstd16(rows);
        std::vector<uint16_t> y16(rows * d);
        RmsNormForward(x.data(), g.data(), y.data(), rstd.data(), rows, d);
        kernels::RmsNormForwardBf16(x.data(), g.data(), reinterpret_cast<bf16*>(y16.data()),
                                    rstd16.data(), rows, d);
        EXPECT_EQ(cast(y), y16);
        EXPECT_EQ(rstd, rstd16);
        // The loss's backward: rows of ld logits, targets in the first V.
        const auto probs = random(rows * d);
        std::vector<int32_t> targets(rows);
        for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 13) % d);
        std::vector<float> dl(rows * d);
        std::vector<uint16_t> dl16(rows * d);
        SoftmaxCrossEntropyBackward(probs.data(), targets.data(), dl.data(), rows, d, 0.37f);
        kernels::SoftmaxCrossEntropyBackwardBf16(
            probs.data(), targets.data(), reinterpret_cast<bf16*>(dl16.data()), rows, d, 0.37f);
        EXPECT_EQ(cast(dl), dl16);
      }
    }
    for (const int64_t n : {1, 2047, 2049, 40001}) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, n " << n);
      const auto x = random(n), dy = random(n);
      std::vector<float> y(n), dx = dy;
      std::vector<uint16_t> y16(n), dx16(n);
      GeluForward(x.data(), y.data(), n);
      kernels::GeluForwardBf16(x.data(), reinterpret_cast<bf16*>(y16.data()), n);
      EXPECT_EQ(cast(y), y16);
      GeluBackwardInPlace(x.data(), dx.data(), n);
      const auto dy_before = dy;
      kernels::GeluBackwardBf16(x.data(), dy.data(), reinterpret_cast<bf16*>(dx16.data()), n);
      EXPECT_EQ(cast(dx), dx16);
      EXPECT_EQ(dy, dy_before);
    }
  }
  kernels::SetKernelThreads(before);
}

}  // namespace
}  // namespace sshsdp::layers
