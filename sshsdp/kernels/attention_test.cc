// The fused causal attention against its oracle (testing/attention_reference.h: the whole
// score matrix per head, scalar softmax) on odd shapes — T not a multiple of the block,
// blocks smaller and larger than T, one-row sequences, odd head sizes, several chunks — and
// the properties the models rely on: outputs overwritten, lse the softmax denominator, the
// gradient of a causal row blind to later positions.
#include "sshsdp/kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/parallel.h"
#include "sshsdp/kernels/testing/attention_reference.h"
#include "sshsdp/kernels/testing/gemm_data.h"

namespace sshsdp::kernels {
namespace {

struct Shape {
  int B, T, H, dh, block;
};

class AttentionTest : public ::testing::TestWithParam<Shape> {};

// Largest |a - b| relative to the largest |b| (1 when b is all zero).
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

TEST_P(AttentionTest, MatchesReference) {
  const Shape s = GetParam();
  const int64_t d = static_cast<int64_t>(s.H) * s.dh, BT = static_cast<int64_t>(s.B) * s.T;
  std::vector<float> qkv = testing::Random(static_cast<size_t>(BT * 3 * d), 11);
  for (float& x : qkv) x *= 1.5f;  // sharper softmax rows than unit normals give
  const std::vector<float> dout = testing::Random(static_cast<size_t>(BT * d), 12);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  // Reference.
  std::vector<float> att(static_cast<size_t>(s.B) * s.H * s.T * s.T), ref_out(BT * d);
  std::vector<float> ref_dqkv(BT * 3 * d), dp(static_cast<size_t>(s.T) * s.T);
  testing::ReferenceAttentionForward(qkv.data(), att.data(), ref_out.data(), s.B, s.T, s.H, s.dh);
  testing::ReferenceAttentionBackward(dout.data(), qkv.data(), att.data(), ref_dqkv.data(),
                                      dp.data(), s.B, s.T, s.H, s.dh);

  // Fused, into NaN-filled outputs and scratch: every element must be written.
  std::vector<float> scratch(AttentionScratchFloats(s.B, s.T, s.H, s.block), nan);
  std::vector<float> out(BT * d, nan), lse(static_cast<size_t>(s.B) * s.H * s.T, nan);
  std::vector<float> dqkv(BT * 3 * d, nan);
  CausalAttentionForward(qkv.data(), out.data(), lse.data(), scratch.data(), s.B, s.T, s.H, s.dh,
                         s.block);
  CausalAttentionBackward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                          scratch.data(), s.B, s.T, s.H, s.dh, s.block);
  EXPECT_LT(MaxRelDiff(out, ref_out), 2e-6);
  EXPECT_LT(MaxRelDiff(dqkv, ref_dqkv), 2e-5);

  // lse is log Σ_u≤t e^(s_u), s = q·k/√dh, evaluated in double.
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.dh));
  double worst = 0.0;
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      for (int t = 0; t < s.T; ++t) {
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          double dot = 0.0;
          for (int c = 0; c < s.dh; ++c) {
            dot += static_cast<double>(qkv[(b * s.T + t) * 3 * d + h * s.dh + c]) *
                   qkv[(b * s.T + u) * 3 * d + d + h * s.dh + c];
          }
          sc[u] = dot * scale;
          mx = std::max(mx, sc[u]);
        }
        double sum = 0.0;
        for (double v : sc) sum += std::exp(v - mx);
        const double want = mx + std::log(sum);
        const float got = lse[(b * s.H + h) * s.T + t];
        ASSERT_TRUE(std::isfinite(got)) << b << " " << h << " " << t;
        worst = std::max(worst, std::abs(got - want) / std::max(1.0, std::abs(want)));
      }
    }
  }
  EXPECT_LT(worst, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(OddShapes, AttentionTest,
                         ::testing::Values(Shape{1, 1, 1, 1, 64},    // one position
                                           Shape{2, 37, 3, 5, 64},   // T < block, odd everything
                                           Shape{2, 37, 3, 5, 16},   // 3 blocks, the last partial
                                           Shape{3, 64, 2, 8, 64},   // T = block
                                           Shape{1, 65, 2, 8, 64},   // one row in the last block
                                           Shape{2, 100, 4, 32, 7},  // many small blocks
                                           Shape{3, 129, 4, 16, 64}, Shape{4, 256, 8, 32, 64}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           const Shape& s = info.param;
                           return "B" + std::to_string(s.B) + "T" + std::to_string(s.T) + "H" +
                                  std::to_string(s.H) + "dh" + std::to_string(s.dh) + "blk" +
                                  std::to_string(s.block);
                         });

// Several chunks of sequences: a shape whose scores exceed one chunk (16 MiB) runs the batch
// in pieces (2 + 2 + 1 sequences here, two query blocks each, so dK / dV are overwritten and
// then accumulated in every chunk) and must give what one sequence at a time gives (to the
// rounding a different oneDNN batch split may bring).
TEST(Attention, ChunkedBatchEqualsPerSequence) {
  const int B = 5, T = 1024, H = 4, dh = 8, block = 512;  // 4·512·1024 floats per sequence
  const int64_t d = H * dh;
  const std::vector<float> qkv = testing::Random(static_cast<size_t>(B) * T * 3 * d, 21);
  const std::vector<float> dout = testing::Random(static_cast<size_t>(B) * T * d, 22);
  std::vector<float> scratch(AttentionScratchFloats(B, T, H, block));
  std::vector<float> out(B * T * d), lse(B * H * T), dqkv(B * T * 3 * d);
  CausalAttentionForward(qkv.data(), out.data(), lse.data(), scratch.data(), B, T, H, dh, block);
  CausalAttentionBackward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                          scratch.data(), B, T, H, dh, block);
  for (int b = 0; b < B; ++b) {
    std::vector<float> s1(AttentionScratchFloats(1, T, H, block)), o1(T * d), l1(H * T),
        g1(T * 3 * d);
    const float* q = qkv.data() + b * T * 3 * d;
    CausalAttentionForward(q, o1.data(), l1.data(), s1.data(), 1, T, H, dh, block);
    CausalAttentionBackward(dout.data() + b * T * d, q, o1.data(), l1.data(), g1.data(), s1.data(),
                            1, T, H, dh, block);
    const std::vector<float> ob(out.begin() + b * T * d, out.begin() + (b + 1) * T * d);
    const std::vector<float> gb(dqkv.begin() + b * T * 3 * d, dqkv.begin() + (b + 1) * T * 3 * d);
    EXPECT_LT(MaxRelDiff(ob, o1), 1e-6) << "sequence " << b;
    EXPECT_LT(MaxRelDiff(gb, g1), 1e-6) << "sequence " << b;
  }
}

// Causality: the output of position t, and so the gradient flowing from it, does not depend
// on keys or values after t.
TEST(Attention, LaterPositionsDoNotReachEarlierOutputs) {
  const int B = 1, T = 50, H = 2, dh = 4, block = 16;
  const int64_t d = H * dh;
  std::vector<float> qkv = testing::Random(static_cast<size_t>(T) * 3 * d, 31);
  std::vector<float> scratch(AttentionScratchFloats(B, T, H, block));
  std::vector<float> a(T * d), b(T * d), lse(H * T);
  CausalAttentionForward(qkv.data(), a.data(), lse.data(), scratch.data(), B, T, H, dh, block);
  for (int64_t i = 20 * 3 * d; i < T * 3 * d; ++i) qkv[i] += 3.0f;  // positions 20..49
  CausalAttentionForward(qkv.data(), b.data(), lse.data(), scratch.data(), B, T, H, dh, block);
  for (int64_t i = 0; i < 20 * d; ++i) ASSERT_EQ(a[i], b[i]) << i;
  bool later_changed = false;
  for (int64_t i = 20 * d; i < T * d; ++i) later_changed |= a[i] != b[i];
  EXPECT_TRUE(later_changed);
}

// dh = 0: every score is 0, so each row's softmax is uniform over its t + 1 keys.
TEST(Attention, EmptyHeadsGiveUniformRows) {
  const int B = 2, T = 5, H = 3;
  std::vector<float> scratch(AttentionScratchFloats(B, T, H)), lse(B * H * T, -1.0f), x(1);
  CausalAttentionForward(x.data(), x.data(), lse.data(), scratch.data(), B, T, H, 0);
  for (int i = 0; i < B * H * T; ++i) {
    EXPECT_FLOAT_EQ(lse[i], std::log(static_cast<float>(i % T + 1))) << i;
  }
  CausalAttentionBackward(x.data(), x.data(), x.data(), lse.data(), x.data(), scratch.data(), B, T,
                          H, 0);
}

// Causality of the backward: query t's gradient depends on dout at t only, so changing dout at
// positions >= 30 changes nothing of dQ at positions < 30.
TEST(Attention, LaterGradientsDoNotReachEarlierQueries) {
  const int B = 1, T = 50, H = 2, dh = 4, block = 16;
  const int64_t d = H * dh;
  const std::vector<float> qkv = testing::Random(static_cast<size_t>(T) * 3 * d, 51);
  std::vector<float> dout = testing::Random(static_cast<size_t>(T) * d, 52);
  std::vector<float> scratch(AttentionScratchFloats(B, T, H, block)), out(T * d), lse(H * T);
  std::vector<float> a(T * 3 * d), b(T * 3 * d);
  CausalAttentionForward(qkv.data(), out.data(), lse.data(), scratch.data(), B, T, H, dh, block);
  CausalAttentionBackward(dout.data(), qkv.data(), out.data(), lse.data(), a.data(), scratch.data(),
                          B, T, H, dh, block);
  for (int64_t i = 30 * d; i < T * d; ++i) dout[i] += 1.0f;
  CausalAttentionBackward(dout.data(), qkv.data(), out.data(), lse.data(), b.data(), scratch.data(),
                          B, T, H, dh, block);
  for (int t = 0; t < 30; ++t) {
    for (int64_t c = 0; c < d; ++c) ASSERT_EQ(a[t * 3 * d + c], b[t * 3 * d + c]) << t << " " << c;
  }
  bool later_changed = false;
  for (int t = 30; t < T; ++t) later_changed |= a[t * 3 * d] != b[t * 3 * d];
  EXPECT_TRUE(later_changed);
}

// Threads: the softmax planes and the D rows go to threads (parallel.h), the batched GEMMs to
// oneDNN's threads; 1 and 3 threads must agree (bit for bit where oneDNN splits the products
// over rows and columns only, as it does for these shapes; a tolerance keeps the test honest
// on a oneDNN that splits over k).
TEST(Attention, ThreadCountsAgree) {
  const int B = 3, T = 130, H = 4, dh = 16, block = 64;
  const int64_t d = H * dh;
  const std::vector<float> qkv = testing::Random(static_cast<size_t>(B) * T * 3 * d, 41);
  const std::vector<float> dout = testing::Random(static_cast<size_t>(B) * T * d, 42);
  const int before = KernelThreads();
  auto run = [&](int threads, std::vector<float>& out, std::vector<float>& dqkv) {
    SetKernelThreads(threads);
    std::vector<float> scratch(AttentionScratchFloats(B, T, H, block)), lse(B * H * T);
    out.assign(B * T * d, 0.0f);
    dqkv.assign(B * T * 3 * d, 0.0f);
    CausalAttentionForward(qkv.data(), out.data(), lse.data(), scratch.data(), B, T, H, dh, block);
    CausalAttentionBackward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                            scratch.data(), B, T, H, dh, block);
    SetKernelThreads(before);
  };
  std::vector<float> o1, g1, o3, g3;
  run(1, o1, g1);
  run(3, o3, g3);
  EXPECT_LT(MaxRelDiff(o3, o1), 1e-6);
  EXPECT_LT(MaxRelDiff(g3, g1), 1e-6);
}

TEST(Attention, RejectsBadShapes) {
  std::vector<float> x(16);
  EXPECT_THROW(CausalAttentionForward(x.data(), x.data(), x.data(), x.data(), 1, 1, 1, 1, 0),
               NumericsError);
  EXPECT_THROW(AttentionScratchFloats(-1, 4, 1), NumericsError);
}

TEST(Attention, EmptyBatchWritesNothing) {
  std::vector<float> x(4, 7.0f);
  CausalAttentionForward(x.data(), x.data(), x.data(), x.data(), 0, 8, 2, 2);
  CausalAttentionBackward(x.data(), x.data(), x.data(), x.data(), x.data(), x.data(), 2, 0, 2, 2);
  for (float v : x) EXPECT_EQ(v, 7.0f);
}

}  // namespace
}  // namespace sshsdp::kernels
