// MXFP8 quantization tests: hand-computed bytes for small weight (32x32) and activation
// (1x32) blocks under both scale rules (with partial edge blocks, zero, NaN and Inf blocks),
// the scale rule on its boundaries, agreement of the exact ceil rule with the fp32
// reciprocal formulation GPU libraries use, and properties on random matrices: per-element
// dequantization error bound, no saturation under the ceil rule, W and Wᵀ sharing scales,
// and band-by-band quantization of a sharded matrix being bit-identical to the whole.
#include "sshsdp/numerics/mx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/numerics/fp8.h"

namespace sshsdp {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
const MxOptions kCeil{DType::kE4M3, MxScaleRule::kCeil};
const MxOptions kFloor{DType::kE4M3, MxScaleRule::kOcpFloor};

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// Activation [2, 40]: two 1x32 blocks per row, the second partial (8 columns).
std::vector<float> HandActivation() {
  std::vector<float> x(2 * 40, 0.0f);
  x[0] = 100.0f;  // block (0,0): amax 100 = 1.5625·2^6
  x[1] = -0.5f;
  x[2] = 0.3f;
  x[3] = 1.0f;
  x[31] = -100.0f;
  x[32] = 500.0f;  // block (0,1): amax 500 = 1.953125·2^8 (mantissa above 1.75)
  x[33] = 3.0f;
  x[40 + 5] = -0.0f;  // block (1,0): zero block
  x[40 + 32] = 5.0f;  // block (1,1): NaN block
  x[40 + 39] = kNaN;
  return x;
}

TEST(MxActivation, HandComputedCeilRule) {
  const std::vector<float> x = HandActivation();
  std::vector<uint8_t> q(80, 0xAA), s(4, 0xAA);
  MxQuantizeActivation(x.data(), 2, 40, q.data(), s.data(), kCeil);
  // e = ceil(log2(100/448)) = -2 -> 125; ceil(log2(500/448)) = 1 -> 128; zero -> 0; NaN -> 0xFF.
  EXPECT_EQ(s, (std::vector<uint8_t>{125, 128, 0, 0xFF}));
  std::vector<uint8_t> want(80, 0x00);
  want[0] = 0x7C;   // 400 = 1.5625·2^8, tie between 384 (m=100, even) and 416: 384
  want[1] = 0xC0;   // -2
  want[2] = 0x3A;   // 0.3·4 = 1.2 -> 1.25
  want[3] = 0x48;   // 4
  want[31] = 0xFC;  // -384
  want[32] = 0x78;  // 500/2 = 250 = 1.953125·2^7 -> 2^8
  want[33] = 0x3C;  // 1.5
  want[40 + 5] = 0x80;
  for (int c = 32; c < 40; ++c) want[40 + c] = 0x7F;
  EXPECT_EQ(q, want);

  std::vector<float> y(80);
  MxDequantizeActivation(q.data(), s.data(), 2, 40, y.data(), kCeil);
  EXPECT_EQ(y[0], 96.0f);
  EXPECT_EQ(y[1], -0.5f);
  EXPECT_EQ(y[2], 0.3125f);
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[31], -96.0f);
  EXPECT_EQ(y[32], 512.0f);
  EXPECT_EQ(y[33], 3.0f);
  EXPECT_EQ(Bits(y[40 + 5]), 0x80000000u);  // -0 survives the zero block
  EXPECT_EQ(Bits(y[40]), 0u);
  for (int c = 32; c < 40; ++c) EXPECT_TRUE(std::isnan(y[40 + c]));
}

TEST(MxActivation, HandComputedOcpFloorRuleSaturates) {
  const std::vector<float> x = HandActivation();
  std::vector<uint8_t> q(80), s(4);
  MxQuantizeActivation(x.data(), 2, 40, q.data(), s.data(), kFloor);
  // floor(log2(100)) - 8 = -2 -> 125; floor(log2(500)) - 8 = 0 -> 127.
  EXPECT_EQ(s, (std::vector<uint8_t>{125, 127, 0, 0xFF}));
  EXPECT_EQ(q[0], 0x7C);
  EXPECT_EQ(q[32], 0x7E);  // 500 saturates to 448
  EXPECT_EQ(q[33], 0x44);  // 3.0
}

// Weight [33, 40]: a 2x2 grid of 32x32 blocks, the right and bottom ones partial.
TEST(MxWeight, HandComputed32x32Blocks) {
  const int64_t rows = 33, cols = 40;
  std::vector<float> w(rows * cols, 0.0f);
  auto at = [&](int64_t r, int64_t c) -> float& { return w[r * cols + c]; };
  at(0, 0) = 1.0f;  // block (0,0): amax 7 = 1.75·2^2 -> e = ceil(log2(7/448)) = -6 -> 121
  at(31, 31) = -7.0f;
  at(10, 10) = 1e-5f;        // ·64 = 6.4e-4 < 2^-10: rounds to 0
  at(10, 11) = 0.02f;        // ·64 = 1.28 -> 1.25
  at(10, 12) = -0.0234375f;  // ·64 = -1.5
  at(5, 33) = 0.001f;        // block (0,1): 1.024·2^-10 -> e = -18 -> 109; ·2^18 = 262.1 -> 256
  at(32, 3) = -0.0f;         // block (1,0): zero block
  at(32, 32) = 5.0f;         // block (1,1): NaN block
  at(32, 39) = kNaN;
  std::vector<uint8_t> q(rows * cols, 0xAA), s(MxWeightScaleCount(rows, cols), 0xAA);
  ASSERT_EQ(s.size(), 4u);
  MxQuantizeWeight(w.data(), rows, cols, q.data(), s.data(), kCeil);
  EXPECT_EQ(s, (std::vector<uint8_t>{121, 109, 0, 0xFF}));
  std::vector<uint8_t> want(rows * cols, 0x00);
  auto wq = [&](int64_t r, int64_t c) -> uint8_t& { return want[r * cols + c]; };
  wq(0, 0) = 0x68;  // 64
  wq(31, 31) = 0xFE;
  wq(10, 11) = 0x3A;
  wq(10, 12) = 0xBC;
  wq(5, 33) = 0x78;
  wq(32, 3) = 0x80;
  for (int64_t c = 32; c < 40; ++c) wq(32, c) = 0x7F;
  EXPECT_EQ(q, want);

  std::vector<float> y(rows * cols);
  MxDequantizeWeight(q.data(), s.data(), rows, cols, y.data(), kCeil);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[31 * cols + 31], -7.0f);
  EXPECT_EQ(y[10 * cols + 11], 1.25f / 64);
  EXPECT_EQ(y[5 * cols + 33], 0.0009765625f);
  EXPECT_TRUE(std::isnan(y[32 * cols + 35]));
}

TEST(MxWeight, InfBlockIsNaNBlock) {
  std::vector<float> w(32 * 32, 1.0f);
  w[77] = -kInf;
  std::vector<uint8_t> q(32 * 32), s(1);
  for (const MxOptions& opt : {kCeil, kFloor}) {
    MxQuantizeWeight(w.data(), 32, 32, q.data(), s.data(), opt);
    EXPECT_EQ(s[0], 0xFF);
    for (uint8_t c : q) EXPECT_EQ(c, 0x7F);
  }
  MxOptions e5{DType::kE5M2, MxScaleRule::kCeil};
  MxQuantizeWeight(w.data(), 32, 32, q.data(), s.data(), e5);
  EXPECT_EQ(s[0], 0xFF);
  for (uint8_t c : q) EXPECT_EQ(c, kE5M2NaN);
}

TEST(MxScale, RuleBoundaries) {
  auto code = [](float amax, const MxOptions& o) { return MxScaleCode(Bits(amax), o); };
  const float next448 = std::nextafter(448.0f, kInf);
  EXPECT_EQ(code(448.0f, kCeil), 127);  // amax = max_elem·2^0 exactly: e = 0
  EXPECT_EQ(code(next448, kCeil), 128);
  EXPECT_EQ(code(std::nextafter(448.0f, 0.0f), kCeil), 127);
  EXPECT_EQ(code(448.0f * 8, kCeil), 130);
  EXPECT_EQ(code(1.0f, kCeil), 119);  // ceil(log2(1/448)) = -8
  EXPECT_EQ(code(1.75f, kCeil), 119);
  EXPECT_EQ(code(std::nextafter(1.75f, kInf), kCeil), 120);
  EXPECT_EQ(code(std::nextafter(1.75f, kInf), kFloor), 119);
  EXPECT_EQ(code(1.999f, kFloor), 119);  // floor(log2(1.999)) - 8
  EXPECT_EQ(code(448.0f, kFloor), 127);
  EXPECT_EQ(code(511.0f, kFloor), 127);
  EXPECT_EQ(code(512.0f, kFloor), 128);
  // Clamps: tiny (fp32 subnormal) amax -> 2^-127; the largest fp32 stays far below 2^127.
  EXPECT_EQ(code(1e-40f, kCeil), 0);
  EXPECT_EQ(code(std::ldexp(1.75f, -119), kCeil), 0);  // e = -127 exactly
  EXPECT_EQ(code(std::ldexp(1.875f, -119), kCeil), 1);
  EXPECT_EQ(code(std::numeric_limits<float>::max(), kCeil), 247);  // e = 120
  EXPECT_EQ(code(std::numeric_limits<float>::max(), kFloor), 246);
  // Specials.
  EXPECT_EQ(code(0.0f, kCeil), 0);
  EXPECT_EQ(MxScaleCode(0x80000000u, kCeil), 0);  // -0 (sign ignored)
  EXPECT_EQ(code(kInf, kCeil), 0xFF);
  EXPECT_EQ(code(kNaN, kFloor), 0xFF);
  // E5M2 elements: max 57344 = 1.75·2^15.
  const MxOptions e5{DType::kE5M2, MxScaleRule::kCeil};
  EXPECT_EQ(code(57344.0f, e5), 127);
  EXPECT_EQ(code(1.0f, e5), 112);
  EXPECT_EQ(code(1.0f, MxOptions{DType::kE5M2, MxScaleRule::kOcpFloor}), 112);
}

// Transformer Engine computes the ceil rule as ceil_pow2(amax · fl(1/max_elem)) in fp32. The
// exact rule agrees for every mantissa of several binades (normal products only).
TEST(MxScale, ExactCeilRuleMatchesFp32ReciprocalFormulation) {
  for (const MxOptions& opt : {kCeil, MxOptions{DType::kE5M2, MxScaleRule::kCeil}}) {
    const float rcp = 1.0f / (opt.elem == DType::kE4M3 ? kE4M3Max : kE5M2Max);
    for (int e : {-100, 0, 8, 127}) {
      int mismatches = 0;
      for (uint32_t m = 0; m < (1u << 23); ++m) {
        const uint32_t a = (static_cast<uint32_t>(e + 127) << 23) | m;
        const uint32_t t = Bits(std::bit_cast<float>(a) * rcp);
        const int ceil_exp = static_cast<int>(t >> 23) - 127 + ((t & 0x7FFFFFu) != 0 ? 1 : 0);
        mismatches += (ceil_exp + 127 != MxScaleCode(a, opt));
      }
      EXPECT_EQ(mismatches, 0) << "binade 2^" << e << " elem " << DTypeName(opt.elem);
    }
  }
}

// Random matrix whose 32x32 blocks have wildly different magnitudes (2^-30 .. 2^30), with
// some zero blocks and tiny (fp32-subnormal) values mixed in.
std::vector<float> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> expo(-30, 30);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rb = MxBlocks(rows), cb = MxBlocks(cols);
  std::vector<float> block_scale(rb * cb);
  for (auto& b : block_scale) b = (rng() % 11 == 0) ? 0.0f : std::ldexp(1.0f, expo(rng));
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng) * block_scale[(r / 32) * cb + c / 32];
      if (rng() % 97 == 0) v = std::ldexp(normal(rng), -140);
      w[r * cols + c] = v;
    }
  }
  return w;
}

TEST(MxWeight, DequantErrorBoundAndNoSaturationUnderCeilRule) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{70, 45}, {64, 64}, {1, 1}, {33, 97}}) {
    for (const MxOptions& opt : {kCeil, MxOptions{DType::kE5M2, MxScaleRule::kCeil}}) {
      const auto w = RandomMatrix(rows, cols, static_cast<uint32_t>(rows * 1000 + cols));
      std::vector<uint8_t> q(w.size()), s(MxWeightScaleCount(rows, cols));
      std::vector<float> y(w.size());
      MxQuantizeWeight(w.data(), rows, cols, q.data(), s.data(), opt);
      MxDequantizeWeight(q.data(), s.data(), rows, cols, y.data(), opt);
      const bool e4 = opt.elem == DType::kE4M3;
      const double max_elem = e4 ? 448.0 : 57344.0;
      const int mbits = e4 ? 3 : 2;
      const int sub_exp = e4 ? -9 : -16;  // subnormal quantum 2^sub_exp
      const int64_t cb = MxBlocks(cols);
      std::vector<double> amax(s.size(), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const size_t b = (r / 32) * cb + c / 32;
          const double x = w[r * cols + c];
          amax[b] = std::max(amax[b], std::fabs(x));
          const double scale = std::ldexp(1.0, s[b] - 127);
          EXPECT_LE(std::fabs(x) / scale, max_elem) << "ceil rule saturated at " << r << "," << c;
          const double bound =
              std::ldexp(std::fabs(x), -(mbits + 1)) + std::ldexp(scale, sub_exp - 1);
          EXPECT_LE(std::fabs(static_cast<double>(y[r * cols + c]) - x), bound) << r << "," << c;
        }
      }
      for (size_t b = 0; b < s.size(); ++b) {
        if (amax[b] == 0.0) {
          EXPECT_EQ(s[b], 0);
        } else if (s[b] > 0) {  // the smallest scale that does not saturate
          EXPECT_GT(amax[b] / std::ldexp(1.0, s[b] - 127), max_elem / 2) << b;
        }
      }
    }
  }
}

TEST(MxWeight, OcpFloorRuleSaturatesOnlyAboveMax) {
  const int64_t rows = 256, cols = 128;  // 32 blocks: some have amax mantissa > 1.8125
  const auto w = RandomMatrix(rows, cols, 5);
  std::vector<uint8_t> q(w.size()), s(MxWeightScaleCount(rows, cols));
  std::vector<float> y(w.size());
  MxQuantizeWeight(w.data(), rows, cols, q.data(), s.data(), kFloor);
  MxDequantizeWeight(q.data(), s.data(), rows, cols, y.data(), kFloor);
  int saturated = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double scale = std::ldexp(1.0, s[(r / 32) * MxBlocks(cols) + c / 32] - 127);
      const double x = w[r * cols + c], v = std::fabs(x) / scale;
      EXPECT_LT(v, 512.0);
      if (v >= 464.0) {
        EXPECT_EQ(std::fabs(static_cast<double>(y[r * cols + c])), 448.0 * scale);
        ++saturated;
      } else {
        EXPECT_LE(std::fabs(y[r * cols + c] - x),
                  std::ldexp(std::fabs(x), -4) + std::ldexp(scale, -10));
      }
    }
  }
  EXPECT_GT(saturated, 0);  // random blocks do hit the (448, 512) range
}

TEST(MxWeight, WAndTransposeShareScales) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{70, 45}, {32, 96}, {5, 33}}) {
    const auto w = RandomMatrix(rows, cols, 11);
    std::vector<float> wt(w.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) wt[c * rows + r] = w[r * cols + c];
    }
    std::vector<uint8_t> q(w.size()), s(MxWeightScaleCount(rows, cols));
    std::vector<uint8_t> qt(w.size()), st(MxWeightScaleCount(cols, rows));
    MxQuantizeWeight(w.data(), rows, cols, q.data(), s.data());
    MxQuantizeWeight(wt.data(), cols, rows, qt.data(), st.data());
    const int64_t rb = MxBlocks(rows), cb = MxBlocks(cols);
    for (int64_t i = 0; i < rb; ++i) {
      for (int64_t j = 0; j < cb; ++j) EXPECT_EQ(st[j * rb + i], s[i * cb + j]);
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(qt[c * rows + r], q[r * cols + c]);
    }
    // The dgrad operand dequantized straight from W's codes equals dequantized Wᵀ.
    std::vector<float> a(w.size()), b(w.size());
    MxDequantizeWeightTransposed(q.data(), s.data(), rows, cols, a.data());
    MxDequantizeWeight(qt.data(), st.data(), cols, rows, b.data());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(Bits(a[i]), Bits(b[i]));
  }
}

TEST(MxActivation, RowsAreIndependent) {
  const int64_t rows = 7, cols = 70;
  const auto x = RandomMatrix(rows, cols, 3);
  std::vector<uint8_t> q(x.size()), s(MxActivationScaleCount(rows, cols));
  MxQuantizeActivation(x.data(), rows, cols, q.data(), s.data());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<uint8_t> q1(cols), s1(MxBlocks(cols));
    MxQuantizeActivation(x.data() + r * cols, 1, cols, q1.data(), s1.data());
    EXPECT_TRUE(std::equal(q1.begin(), q1.end(), q.begin() + r * cols));
    EXPECT_TRUE(std::equal(s1.begin(), s1.end(), s.begin() + r * MxBlocks(cols)));
  }
}

TEST(MxBands, Geometry) {
  const MxBand b = MxWeightBand(100, 70, 3);
  EXPECT_EQ(b.row_begin, 96);
  EXPECT_EQ(b.row_end, 100);
  EXPECT_EQ(b.elem_begin, 96 * 70);
  EXPECT_EQ(b.elem_end, 100 * 70);
  EXPECT_EQ(b.scale_begin, 9);
  EXPECT_EQ(b.scale_end, 12);
  EXPECT_EQ(MxNumBands(100), 4);
  EXPECT_THROW(MxWeightBand(100, 70, 4), NumericsError);
  int64_t f, l;
  MxBandsTouching(100, 70, 0, 1, &f, &l);
  EXPECT_EQ(f, 0);
  EXPECT_EQ(l, 1);
  MxBandsTouching(100, 70, 32 * 70 - 1, 32 * 70 + 1, &f, &l);  // straddles bands 0 and 1
  EXPECT_EQ(f, 0);
  EXPECT_EQ(l, 2);
  MxBandsTouching(100, 70, 32 * 70, 64 * 70, &f, &l);  // exactly band 1
  EXPECT_EQ(f, 1);
  EXPECT_EQ(l, 2);
  MxBandsTouching(100, 70, 50, 50, &f, &l);
  EXPECT_EQ(f, l);
  EXPECT_THROW(MxBandsTouching(100, 70, 0, 100 * 70 + 1, &f, &l), NumericsError);
}

// The G stage on a sharded matrix: ranks own arbitrary flat ranges (cuts inside bands, empty
// shards, a shard spanning several bands). Each band's owner gathers the band's fragments,
// quantizes the band, and returns FP8 fragments to their owners; scales go to the band
// owner. Reassembled, everything equals quantizing the unsharded matrix.
TEST(MxBands, ShardedBandQuantizationIsBitIdentical) {
  const int64_t rows = 100, cols = 70, n = rows * cols;
  const auto w = RandomMatrix(rows, cols, 21);
  std::vector<uint8_t> q_ref(n), s_ref(MxWeightScaleCount(rows, cols));
  MxQuantizeWeight(w.data(), rows, cols, q_ref.data(), s_ref.data());

  const std::vector<std::vector<int64_t>> cut_sets = {
      {0, 1000, 1000, 2300, 4481, 7000},      // empty shard, cuts mid-band
      {0, 2240, 4480, 6720, 7000},            // cuts exactly on band boundaries
      {0, 17, 6999, 7000},                    // one shard spans every band
      {0, 1, 2, 3, 2239, 2241, 5000, 7000}};  // tiny shards
  for (const auto& cuts : cut_sets) {
    const size_t ranks = cuts.size() - 1;
    std::vector<std::vector<float>> shard(ranks);
    std::vector<std::vector<uint8_t>> q_shard(ranks);
    for (size_t r = 0; r < ranks; ++r) {
      shard[r].assign(w.begin() + cuts[r], w.begin() + cuts[r + 1]);
      q_shard[r].assign(shard[r].size(), 0xAA);
    }
    std::vector<uint8_t> scales(s_ref.size(), 0xAA);
    for (int64_t band = 0; band < MxNumBands(rows); ++band) {
      const MxBand b = MxWeightBand(rows, cols, band);
      std::vector<float> gathered(b.elem_end - b.elem_begin);
      for (size_t r = 0; r < ranks; ++r) {  // gather fragments
        const int64_t lo = std::max(cuts[r], b.elem_begin), hi = std::min(cuts[r + 1], b.elem_end);
        for (int64_t e = lo; e < hi; ++e) gathered[e - b.elem_begin] = shard[r][e - cuts[r]];
      }
      std::vector<uint8_t> q_band(gathered.size());
      MxQuantizeWeightBand(gathered.data(), rows, cols, band, q_band.data(),
                           scales.data() + b.scale_begin);
      for (size_t r = 0; r < ranks; ++r) {  // return fragments
        const int64_t lo = std::max(cuts[r], b.elem_begin), hi = std::min(cuts[r + 1], b.elem_end);
        for (int64_t e = lo; e < hi; ++e) q_shard[r][e - cuts[r]] = q_band[e - b.elem_begin];
      }
    }
    std::vector<uint8_t> q_all;
    for (size_t r = 0; r < ranks; ++r) {
      int64_t f, l;
      MxBandsTouching(rows, cols, cuts[r], cuts[r + 1], &f, &l);
      if (cuts[r] < cuts[r + 1]) {
        EXPECT_EQ(f, cuts[r] / (32 * cols));
        EXPECT_EQ(l, (cuts[r + 1] - 1) / (32 * cols) + 1);
      }
      q_all.insert(q_all.end(), q_shard[r].begin(), q_shard[r].end());
    }
    EXPECT_EQ(q_all, q_ref);
    EXPECT_EQ(scales, s_ref);
  }
}

TEST(Mx, RejectsBadOptions) {
  std::vector<float> w(32 * 32, 1.0f);
  std::vector<uint8_t> q(w.size()), s(1);
  EXPECT_THROW(MxQuantizeWeight(w.data(), 32, 32, q.data(), s.data(), MxOptions{DType::kBF16}),
               NumericsError);
  EXPECT_THROW(MxQuantizeWeight(w.data(), -1, 32, q.data(), s.data()), NumericsError);
  EXPECT_THROW(MxDequantizeWeight(q.data(), s.data(), 32, 32, w.data(), MxOptions{DType::kF32}),
               NumericsError);
}

}  // namespace
}  // namespace sshsdp
