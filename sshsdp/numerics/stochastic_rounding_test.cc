// BF16 stochastic rounding tests: the rule on hand-picked bit patterns; exact unbiasedness
// over all 2^16 draws; statistical unbiasedness E[SR(x)] = x with Philox draws (5-sigma
// bound from the Bernoulli variance) for negatives, subnormals and values next to powers of
// two; NaN/Inf/overflow handling; chunk-split invariance and agreement with the per-element
// draw; reproducibility and exact resume; the sum/accumulate helpers; typed errors.
#include "sshsdp/numerics/stochastic_rounding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

uint16_t SrBits(uint32_t f32_bits, uint16_t r) {
  return StochasticRoundBf16(std::bit_cast<float>(f32_bits), r).bits;
}

TEST(StochasticRounding, RuleByHand) {
  // 1 + 2^-9: bits 0x3F804000, low half 0x4000 -> rounds up iff r >= 0xC000.
  EXPECT_EQ(SrBits(0x3F804000u, 0x0000), 0x3F80);
  EXPECT_EQ(SrBits(0x3F804000u, 0xBFFF), 0x3F80);
  EXPECT_EQ(SrBits(0x3F804000u, 0xC000), 0x3F81);
  EXPECT_EQ(SrBits(0x3F804000u, 0xFFFF), 0x3F81);
  // Negative: acts on the magnitude (rounds away from zero with the same probability).
  EXPECT_EQ(SrBits(0xBF804000u, 0xBFFF), 0xBF80);
  EXPECT_EQ(SrBits(0xBF804000u, 0xC000), 0xBF81);
  // Exact bf16 values never move.
  EXPECT_EQ(SrBits(0x3F800000u, 0xFFFF), 0x3F80);
  EXPECT_EQ(SrBits(0x80000000u, 0xFFFF), 0x8000);
  // Carry into the exponent: 2 - 2^-8 (bf16 1.1111111·2^0 plus half an ulp).
  EXPECT_EQ(SrBits(0x3FFF8000u, 0x8000), 0x4000);
  // fp32 subnormal: rounds to 0 or the smallest bf16 subnormal.
  EXPECT_EQ(SrBits(0x00000001u, 0xFFFE), 0x0000);
  EXPECT_EQ(SrBits(0x00000001u, 0xFFFF), 0x0001);
}

TEST(StochasticRounding, NaNInfAndOverflow) {
  for (uint16_t r : {uint16_t{0}, uint16_t{1}, uint16_t{0x8000}, uint16_t{0xFFFF}}) {
    EXPECT_EQ(SrBits(0x7F800001u, r), 0x7FC0);  // NaN payload only in the low bits
    EXPECT_EQ(SrBits(0xFF80FFFFu, r), 0xFFC0);
    EXPECT_EQ(SrBits(0x7FC00000u, r), 0x7FC0);
    EXPECT_EQ(SrBits(0x7F800000u, r), 0x7F80);  // +Inf
    EXPECT_EQ(SrBits(0xFF800000u, r), 0xFF80);  // -Inf
    EXPECT_EQ(SrBits(0x7F7F0000u, r), 0x7F7F);  // bf16 max, exact
    EXPECT_EQ(SrBits(0x7F7F8000u, r), 0x7F7F);  // above bf16 max: clamped, never Inf
    EXPECT_EQ(SrBits(0x7F7FFFFFu, r), 0x7F7F);  // fp32 max
    EXPECT_EQ(SrBits(0xFF7FFFFFu, r), 0xFF7F);
  }
  EXPECT_TRUE(std::isnan(Bf16ToFloat(bf16{SrBits(0x7F800001u, 0xFFFF)})));
}

const std::vector<float>& TestValues() {
  static const std::vector<float> v = {
      1.0f / 3,
      -1.0f / 3,
      0.1f,
      -2.7182817f,
      1e-39f,
      -3e-40f,
      1.2e-38f,
      std::nextafter(2.0f, 0.0f),   // just below a power of two
      std::nextafter(1.0f, 2.0f),   // just above: P(up) = 1/2^16
      -std::nextafter(0.5f, 0.0f),  // negative, just below a power of two
      12345.678f,
      -6.02e23f,
      3.0e38f};
  return v;
}

// Over all 2^16 draws SR(x) is exactly unbiased: the round-up count is low16(x).
TEST(StochasticRounding, ExactlyUnbiasedOverAllDraws) {
  for (float x : TestValues()) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    double sum = 0;
    int ups = 0;
    for (uint32_t r = 0; r < 65536; ++r) {
      const bf16 h = StochasticRoundBf16(x, static_cast<uint16_t>(r));
      ups += h.bits != (u >> 16);
      sum += Bf16ToFloat(h);
    }
    EXPECT_EQ(ups, static_cast<int>(u & 0xFFFFu)) << x;
    EXPECT_EQ(sum / 65536.0, static_cast<double>(x)) << x;  // exact in double
  }
}

TEST(StochasticRounding, StatisticallyUnbiasedWithPhiloxDraws) {
  const size_t n = size_t{1} << 18;
  std::vector<float> src(n);
  std::vector<bf16> dst(n);
  uint32_t stream = 0;
  for (float x : TestValues()) {
    std::fill(src.begin(), src.end(), x);
    StochasticRoundBf16(src.data(), dst.data(), n, SrKey{42, 7, stream++}, 1000);
    const uint32_t u = std::bit_cast<uint32_t>(x);
    const double lo = Bf16ToFloat(bf16{static_cast<uint16_t>(u >> 16)});
    const double hi = Bf16ToFloat(bf16{static_cast<uint16_t>((u >> 16) + 1)});
    const double p = (u & 0xFFFFu) / 65536.0;
    double sum = 0;
    for (bf16 h : dst) {
      const double v = Bf16ToFloat(h);
      ASSERT_TRUE(v == lo || v == hi) << x;
      sum += v;
    }
    const double mean = sum / n;
    const double sigma = std::fabs(hi - lo) * std::sqrt(p * (1 - p) / n);
    EXPECT_LE(std::fabs(mean - x), 5 * sigma + 1e-300) << "x=" << x << " mean=" << mean;
  }
}

TEST(StochasticRounding, DrawsAreUniform16Bit) {
  const SrKey key{9, 1, 0};
  const int n = 1 << 18;
  double sum = 0;
  std::vector<int> bit_ones(16, 0);
  for (int i = 0; i < n; ++i) {
    const uint16_t r = SrDraw(key, static_cast<uint64_t>(i));
    sum += r;
    for (int b = 0; b < 16; ++b) bit_ones[b] += (r >> b) & 1;
  }
  const double sigma_mean = 65536.0 / std::sqrt(12.0 * n);
  EXPECT_LE(std::fabs(sum / n - 32767.5), 5 * sigma_mean);
  for (int b = 0; b < 16; ++b) EXPECT_LE(std::fabs(bit_ones[b] - n / 2.0), 5 * std::sqrt(n / 4.0));
}

std::vector<float> RandomValues(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(StochasticRounding, AnyChunkSplitGivesTheSameBits) {
  const size_t n = 10007;
  const uint64_t first = 12345;  // not a multiple of 8
  const SrKey key{0xDEADBEEFCAFEull, 123, 4};
  const auto src = RandomValues(n, 1);
  std::vector<bf16> whole(n);
  StochasticRoundBf16(src.data(), whole.data(), n, key, first);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(whole[i].bits, StochasticRoundBf16(src[i], SrDraw(key, first + i)).bits) << i;
  }
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    std::vector<bf16> chunks(n);
    size_t i = 0;
    while (i < n) {
      const size_t len = std::min<size_t>(n - i, rng() % 3 == 0 ? 1 + rng() % 9 : rng() % 1500);
      StochasticRoundBf16(src.data() + i, chunks.data() + i, len, key, first + i);
      i += len;
    }
    for (size_t j = 0; j < n; ++j) ASSERT_EQ(chunks[j].bits, whole[j].bits) << j;
  }
}

size_t CountDiffs(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += a[i].bits != b[i].bits;
  return d;
}

TEST(StochasticRounding, KeyedBySeedStepStream) {
  const size_t n = 4096;
  const auto src = RandomValues(n, 2);
  auto run = [&](SrKey k) {
    std::vector<bf16> out(n);
    StochasticRoundBf16(src.data(), out.data(), n, k, 0);
    return out;
  };
  const auto base = run({1, 10, 0});
  EXPECT_EQ(CountDiffs(base, run({1, 10, 0})), 0u);  // reproducible
  // Another seed, step or stream draws other bits: about half of the inexact values move.
  for (SrKey k : {SrKey{2, 10, 0}, SrKey{1, 11, 0}, SrKey{1, 10, 1}}) {
    EXPECT_GT(CountDiffs(base, run(k)), n / 4);
  }
}

// A run that accumulates SR-rounded partials for 10 steps, and the same run stopped after
// step 5 and resumed from its saved state (the bf16 buffer plus seed and step): identical.
TEST(StochasticRounding, ResumeIsExact) {
  const size_t n = 1000;
  const uint64_t seed = 777;
  auto step_fn = [&](std::vector<bf16>& acc, uint64_t step) {
    const auto grad = RandomValues(n, static_cast<uint32_t>(100 + step));
    StochasticRoundAccumulateBf16(acc.data(), grad.data(), n, SrKey{seed, step, 0}, 0);
  };
  std::vector<bf16> straight(n, bf16{0});
  for (uint64_t s = 0; s < 10; ++s) step_fn(straight, s);
  std::vector<bf16> first_half(n, bf16{0});
  for (uint64_t s = 0; s < 5; ++s) step_fn(first_half, s);
  const std::vector<bf16> saved = first_half;  // checkpoint: buffer, seed, next step = 5
  std::vector<bf16> resumed = saved;
  for (uint64_t s = 5; s < 10; ++s) step_fn(resumed, s);
  EXPECT_EQ(CountDiffs(straight, resumed), 0u);
}

TEST(StochasticRounding, SumAndAccumulateHelpers) {
  const size_t n = 777;
  const uint64_t first = 3;
  const SrKey key{5, 6, 7};
  const auto a = RandomValues(n, 10), b = RandomValues(n, 11), c = RandomValues(n, 12);
  const float* srcs[] = {a.data(), b.data(), c.data()};
  std::vector<bf16> out(n);
  StochasticRoundSumBf16(srcs, 3, out.data(), n, key, first);
  for (size_t i = 0; i < n; ++i) {
    const float s = (a[i] + b[i]) + c[i];
    ASSERT_EQ(out[i].bits, StochasticRoundBf16(s, SrDraw(key, first + i)).bits);
  }
  std::vector<bf16> ha(n), hb(n);
  FloatToBf16(a.data(), ha.data(), n);
  FloatToBf16(b.data(), hb.data(), n);
  const bf16* hsrcs[] = {ha.data(), hb.data()};
  StochasticRoundSumBf16(hsrcs, 2, out.data(), n, key, first);
  for (size_t i = 0; i < n; ++i) {
    const float s = Bf16ToFloat(ha[i]) + Bf16ToFloat(hb[i]);
    ASSERT_EQ(out[i].bits, StochasticRoundBf16(s, SrDraw(key, first + i)).bits);
  }
  std::vector<bf16> acc = ha;
  StochasticRoundAccumulateBf16(acc.data(), b.data(), n, key, first);
  for (size_t i = 0; i < n; ++i) {
    const float s = Bf16ToFloat(ha[i]) + b[i];
    ASSERT_EQ(acc[i].bits, StochasticRoundBf16(s, SrDraw(key, first + i)).bits);
  }
}

// Why SR: adding 1e-3 (below half a bf16 ulp at 1.0) a thousand times. Round-to-nearest
// stagnates at 1.0; SR tracks the exact sum 2.0 on average.
TEST(StochasticRounding, AccumulationTracksTheExactSum) {
  const size_t n = 1024;
  std::vector<bf16> sr(n, FloatToBf16(1.0f));
  std::vector<float> inc(n, 1e-3f);
  bf16 rne = FloatToBf16(1.0f);
  for (uint64_t step = 0; step < 1000; ++step) {
    StochasticRoundAccumulateBf16(sr.data(), inc.data(), n, SrKey{3, step, 0}, 0);
    rne = FloatToBf16(Bf16ToFloat(rne) + 1e-3f);
  }
  EXPECT_EQ(Bf16ToFloat(rne), 1.0f);
  double mean = 0;
  for (bf16 h : sr) mean += Bf16ToFloat(h);
  mean /= n;
  // Per-step variance <= ulp^2/4 with ulp <= 2^-7: sigma of the mean <= 2^-8·sqrt(1000/n).
  EXPECT_NEAR(mean, 1.0 + 1000 * static_cast<double>(1e-3f), 5 * std::ldexp(1.0, -8));
}

TEST(StochasticRounding, RejectsBadCalls) {
  std::vector<float> x(4, 1.0f);
  std::vector<bf16> y(4);
  EXPECT_THROW(StochasticRoundBf16(x.data(), y.data(), 4, SrKey{0, uint64_t{1} << 32, 0}, 0),
               NumericsError);
  EXPECT_THROW(StochasticRoundBf16(x.data(), y.data(), 4, SrKey{}, ~uint64_t{0} - 2),
               NumericsError);
  EXPECT_THROW(
      StochasticRoundSumBf16(static_cast<const float* const*>(nullptr), 0, y.data(), 4, SrKey{}, 0),
      NumericsError);
}

}  // namespace
}  // namespace sshsdp
