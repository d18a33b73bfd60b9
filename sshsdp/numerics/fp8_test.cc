// Bit-exact tests of fp32 <-> FP8 (E4M3, E5M2) and UE8M0 on hand-computed values: exact
// values, ties to even in both directions, subnormals, max and overflow in both modes, Inf,
// NaN, ±0; exhaustive round trip of all 256 codes of each format; the fast MX encoder
// against the reference encoder; the reference encoder against a brute-force nearest-value
// search.
#include "sshsdp/numerics/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

constexpr Fp8Overflow kSat = Fp8Overflow::kSaturate;
constexpr Fp8Overflow kNonSat = Fp8Overflow::kNonSaturating;

float F(uint32_t bits) { return std::bit_cast<float>(bits); }
float Next(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float Prev(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }

// Both modes agree (no overflow involved).
void ExpectE4M3(float f, uint8_t code) {
  EXPECT_EQ(FloatToE4M3(f, kSat), code) << "E4M3 sat of " << f;
  EXPECT_EQ(FloatToE4M3(f, kNonSat), code) << "E4M3 nonsat of " << f;
}
void ExpectE5M2(float f, uint8_t code) {
  EXPECT_EQ(FloatToE5M2(f, kSat), code) << "E5M2 sat of " << f;
  EXPECT_EQ(FloatToE5M2(f, kNonSat), code) << "E5M2 nonsat of " << f;
}

TEST(E4M3, ExactValues) {
  ExpectE4M3(1.0f, 0x38);    // 0.0111.000
  ExpectE4M3(-2.0f, 0xC0);   // 1.1000.000
  ExpectE4M3(3.25f, 0x45);   // 1.625·2^1 = 0.1000.101
  ExpectE4M3(240.0f, 0x77);  // 1.875·2^7: mantissa 111 is a number below exponent 1111
  ExpectE4M3(256.0f, 0x78);  // 0.1111.000
  ExpectE4M3(448.0f, 0x7E);  // max 0.1111.110
  ExpectE4M3(-448.0f, 0xFE);
  ExpectE4M3(0.015625f, 0x08);  // 2^-6, smallest normal
  EXPECT_EQ(E4M3ToFloat(0x45), 3.25f);
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0xFE), -448.0f);
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4M3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));
}

TEST(E4M3, RoundingAndTies) {
  ExpectE4M3(3.3f, 0x45);     // 1.65·2 -> 1.625 (nearer than 1.75)
  ExpectE4M3(1.0625f, 0x38);  // halfway 1.0 (m=000, even) / 1.125: down
  ExpectE4M3(1.1875f, 0x3A);  // halfway 1.125 (m=001, odd) / 1.25 (m=010): up
  ExpectE4M3(Next(1.0625f), 0x39);
  ExpectE4M3(Prev(1.1875f), 0x39);
  ExpectE4M3(-1.0625f, 0xB8);
  ExpectE4M3(-1.1875f, 0xBA);
  ExpectE4M3(15.5f, 0x58);   // halfway 15 (1.111·2^3, odd) / 16: up, carries into the exponent
  ExpectE4M3(416.0f, 0x7D);  // 1.625·2^8 exact: 0.1111.101
  ExpectE4M3(400.0f, 0x7C);  // halfway 384 (m=100, even) / 416 (m=101): down to 384
  ExpectE4M3(432.0f, 0x7E);  // halfway 416 (m=101, odd) / 448 (m=110): up to max
}

TEST(E4M3, Subnormals) {
  const float q = std::ldexp(1.0f, -9);  // subnormal quantum
  ExpectE4M3(q, 0x01);
  ExpectE4M3(-q, 0x81);
  ExpectE4M3(0.5f * q, 0x00);   // halfway 0 (even) / q: 0
  ExpectE4M3(-0.5f * q, 0x80);  // ... keeping the sign
  ExpectE4M3(Next(0.5f * q), 0x01);
  ExpectE4M3(1.5f * q, 0x02);               // halfway 1 (odd) / 2: up
  ExpectE4M3(2.5f * q, 0x02);               // halfway 2 (even) / 3: down
  ExpectE4M3(7.0f * q, 0x07);               // largest subnormal
  ExpectE4M3(7.5f * q, 0x08);               // halfway 7 (odd) / 2^-6 (smallest normal): up
  ExpectE4M3(std::ldexp(1.0f, -30), 0x00);  // far below
  ExpectE4M3(F(0x00000001u), 0x00);         // fp32 subnormal
  ExpectE4M3(F(0x80000001u), 0x80);
}

TEST(E4M3, OverflowBothModes) {
  ExpectE4M3(464.0f, 0x7E);  // halfway 448 (m=110, even) / 480: rounds to 448, no overflow
  EXPECT_EQ(FloatToE4M3(Next(464.0f), kSat), 0x7E);
  EXPECT_EQ(FloatToE4M3(Next(464.0f), kNonSat), 0x7F);
  EXPECT_EQ(FloatToE4M3(480.0f, kSat), 0x7E);
  EXPECT_EQ(FloatToE4M3(480.0f, kNonSat), 0x7F);
  EXPECT_EQ(FloatToE4M3(-1000.0f, kSat), 0xFE);
  EXPECT_EQ(FloatToE4M3(-1000.0f, kNonSat), 0xFF);
  EXPECT_EQ(FloatToE4M3(3.0e38f, kSat), 0x7E);
  EXPECT_EQ(FloatToE4M3(3.0e38f, kNonSat), 0x7F);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToE4M3(inf, kSat), 0x7E);
  EXPECT_EQ(FloatToE4M3(-inf, kSat), 0xFE);
  EXPECT_EQ(FloatToE4M3(inf, kNonSat), 0x7F);
  EXPECT_EQ(FloatToE4M3(-inf, kNonSat), 0xFF);
}

TEST(E4M3, NaNAndZero) {
  ExpectE4M3(std::numeric_limits<float>::quiet_NaN(), 0x7F);
  ExpectE4M3(F(0xFFC00000u), 0xFF);  // negative NaN keeps its sign
  ExpectE4M3(F(0x7F800001u), 0x7F);  // payload only in low bits
  ExpectE4M3(0.0f, 0x00);
  ExpectE4M3(-0.0f, 0x80);
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0xFF)));
  EXPECT_TRUE(std::signbit(E4M3ToFloat(0x80)));
  EXPECT_EQ(E4M3ToFloat(0x80), 0.0f);
}

TEST(E5M2, ExactRoundingSubnormals) {
  ExpectE5M2(1.0f, 0x3C);      // 0.01111.00
  ExpectE5M2(-1.5f, 0xBE);     // 1.01111.10
  ExpectE5M2(57344.0f, 0x7B);  // max 0.11110.11
  ExpectE5M2(1.125f, 0x3C);    // halfway 1.0 (m=00, even) / 1.25: down
  ExpectE5M2(1.375f, 0x3E);    // halfway 1.25 (m=01, odd) / 1.5: up
  ExpectE5M2(-1.375f, 0xBE);
  ExpectE5M2(Next(1.125f), 0x3D);
  const float q = std::ldexp(1.0f, -16);
  ExpectE5M2(q, 0x01);
  ExpectE5M2(0.5f * q, 0x00);  // tie to even: 0
  ExpectE5M2(1.5f * q, 0x02);  // tie: up to 2
  ExpectE5M2(3.0f * q, 0x03);  // largest subnormal
  ExpectE5M2(3.5f * q, 0x04);  // tie with 2^-14, smallest normal (0.00001.00): up
  ExpectE5M2(std::ldexp(1.0f, -14), 0x04);
  EXPECT_EQ(E5M2ToFloat(0x01), q);
  EXPECT_EQ(E5M2ToFloat(0x7B), 57344.0f);
}

TEST(E5M2, OverflowInfNaN) {
  ExpectE5M2(Prev(61440.0f), 0x7B);              // below halfway: max
  EXPECT_EQ(FloatToE5M2(61440.0f, kSat), 0x7B);  // halfway 57344 (odd) / 65536: overflow
  EXPECT_EQ(FloatToE5M2(61440.0f, kNonSat), 0x7C);
  EXPECT_EQ(FloatToE5M2(-1e6f, kSat), 0xFB);
  EXPECT_EQ(FloatToE5M2(-1e6f, kNonSat), 0xFC);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToE5M2(inf, kNonSat), 0x7C);
  EXPECT_EQ(FloatToE5M2(-inf, kNonSat), 0xFC);
  EXPECT_EQ(FloatToE5M2(inf, kSat), 0x7B);
  EXPECT_EQ(FloatToE5M2(-inf, kSat), 0xFB);
  ExpectE5M2(std::numeric_limits<float>::quiet_NaN(), 0x7E);
  ExpectE5M2(F(0xFF800001u), 0xFE);
  ExpectE5M2(0.0f, 0x00);
  ExpectE5M2(-0.0f, 0x80);
  EXPECT_EQ(E5M2ToFloat(0x7C), inf);
  EXPECT_EQ(E5M2ToFloat(0xFC), -inf);
  for (uint8_t c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) EXPECT_TRUE(std::isnan(E5M2ToFloat(c)));
}

// Independent decoder: (-1)^s · 2^(e-bias) · (1 + m/2^mbits), or subnormal m·2^(1-bias-mbits).
double RefDecode(uint8_t c, int mbits, int bias) {
  const int ebits = 7 - mbits;
  const int e = (c >> mbits) & ((1 << ebits) - 1);
  const int m = c & ((1 << mbits) - 1);
  const double mag =
      e == 0 ? std::ldexp(m, 1 - bias - mbits) : std::ldexp(1.0 + std::ldexp(m, -mbits), e - bias);
  return (c & 0x80) ? -mag : mag;
}

TEST(Fp8, ExhaustiveRoundTripE4M3) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float f = E4M3ToFloat(code);
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_EQ(FloatToE4M3(f, kSat) & 0x7F, 0x7F);
      ++nans;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), RefDecode(code, 3, 7)) << c;
    EXPECT_EQ(FloatToE4M3(f, kSat), code) << c;
    EXPECT_EQ(FloatToE4M3(f, kNonSat), code) << c;
  }
  EXPECT_EQ(nans, 2);
}

TEST(Fp8, ExhaustiveRoundTripE5M2) {
  int specials = 0;
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float f = E5M2ToFloat(code);
    if ((c & 0x7C) == 0x7C) {  // exponent 11111
      ++specials;
      if ((c & 0x03) == 0) {
        EXPECT_TRUE(std::isinf(f));
        EXPECT_EQ(FloatToE5M2(f, kNonSat), code);
      } else {
        EXPECT_TRUE(std::isnan(f));
        EXPECT_TRUE(std::isnan(E5M2ToFloat(FloatToE5M2(f, kNonSat))));
      }
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), RefDecode(code, 2, 15)) << c;
    EXPECT_EQ(FloatToE5M2(f, kSat), code) << c;
    EXPECT_EQ(FloatToE5M2(f, kNonSat), code) << c;
  }
  EXPECT_EQ(specials, 8);
}

// Brute force: the finite code nearest to x, ties to the even code (even mantissa); values
// beyond max + half an ulp are overflow (-1).
int BruteForceNearest(float x, int mbits, int bias, int max_code) {
  const double ax = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_err = ax;
  for (int c = 1; c <= max_code; ++c) {
    const double err = std::fabs(RefDecode(static_cast<uint8_t>(c), mbits, bias) - ax);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  const double max = RefDecode(static_cast<uint8_t>(max_code), mbits, bias);
  const double half_ulp = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(max))) - mbits - 1);
  // At max + half_ulp the tie goes to the even neighbour: max (E4M3: m=110) or the next
  // power of two (E5M2: max has m=11, odd).
  if (ax > max + half_ulp || (ax == max + half_ulp && (max_code & 1))) return -1;
  return best;
}

TEST(Fp8, ReferenceEncoderMatchesBruteForce) {
  std::mt19937 rng(7);
  std::vector<float> xs;
  // Every midpoint between neighbouring finite codes, its fp32 neighbours, and the overflow
  // thresholds (max + half an ulp).
  for (int c = 0; c < 0x7E; ++c) {
    const float mid =
        0.5f * (E4M3ToFloat(static_cast<uint8_t>(c)) + E4M3ToFloat(static_cast<uint8_t>(c + 1)));
    for (float m : {mid, Next(mid), Prev(mid)}) xs.push_back(m);
  }
  for (int c = 0; c < 0x7B; ++c) {
    const float mid =
        0.5f * (E5M2ToFloat(static_cast<uint8_t>(c)) + E5M2ToFloat(static_cast<uint8_t>(c + 1)));
    for (float m : {mid, Next(mid), Prev(mid)}) xs.push_back(m);
  }
  for (float m : {464.0f, 61440.0f}) {
    for (float v : {m, Next(m), Prev(m)}) xs.push_back(v);
  }
  std::uniform_real_distribution<float> expo(-20.0f, 17.0f);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::exp2(expo(rng)) * ((i & 1) ? -1.0f : 1.0f));
  for (float x : xs) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const int e4 = BruteForceNearest(x, 3, 7, 0x7E);
    EXPECT_EQ(FloatToE4M3(x, kSat), e4 < 0 ? (sign | 0x7E) : (sign | e4)) << x;
    EXPECT_EQ(FloatToE4M3(x, kNonSat), e4 < 0 ? (sign | 0x7F) : (sign | e4)) << x;
    const int e5 = BruteForceNearest(x, 2, 15, 0x7B);
    EXPECT_EQ(FloatToE5M2(x, kSat), e5 < 0 ? (sign | 0x7B) : (sign | e5)) << x;
    EXPECT_EQ(FloatToE5M2(x, kNonSat), e5 < 0 ? (sign | 0x7C) : (sign | e5)) << x;
  }
}

// The branch-free encoder used by MX quantization equals the reference on every finite input
// it can see: a dense strided sweep of all fp32 patterns up to 2^17, every midpoint
// neighbourhood, and huge values (saturation).
TEST(Fp8, FastSaturatingEncoderMatchesReference) {
  auto check = [](uint32_t bits) {
    for (uint32_t s : {0u, 0x80000000u}) {
      const float f = F(bits | s);
      ASSERT_EQ(fp8_internal::EncodeE4M3SatFinite(f), FloatToE4M3(f, kSat)) << std::hex << bits;
      ASSERT_EQ(fp8_internal::EncodeE5M2SatFinite(f), FloatToE5M2(f, kSat)) << std::hex << bits;
    }
  };
  for (uint32_t bits = 0; bits < 0x48000000u; bits += 251) check(bits);
  for (int c = 0; c < 128; ++c) {
    for (const auto* table : {&fp8_internal::kE4M3Table, &fp8_internal::kE5M2Table}) {
      const float a = (*table)[c], b = (*table)[c + 1];
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const uint32_t mid = std::bit_cast<uint32_t>(0.5f * (a + b));
      for (uint32_t d = 0; d < 64; ++d) check(mid - 32 + d);
    }
  }
  for (uint32_t bits : {0x7F7FFFFFu, 0x7F000000u, 0x50000000u, 0x00000001u, 0x007FFFFFu}) {
    check(bits);
  }
}

TEST(Ue8m0, Values) {
  EXPECT_EQ(Ue8m0ToFloat(127), 1.0f);
  EXPECT_EQ(Ue8m0ToFloat(130), 8.0f);
  EXPECT_EQ(Ue8m0ToFloat(126), 0.5f);
  EXPECT_EQ(Ue8m0ToFloat(0), std::ldexp(1.0f, -127));  // an fp32 subnormal
  EXPECT_EQ(Ue8m0ToFloat(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(Ue8m0ToFloat(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(Ue8m0ToFloat(0xFF)));
  for (int e = -127; e <= 127; ++e) {
    EXPECT_EQ(Ue8m0ToFloat(Ue8m0FromExponent(e)), std::ldexp(1.0f, e));
  }
  EXPECT_THROW(Ue8m0FromExponent(128), NumericsError);
  EXPECT_THROW(Ue8m0FromExponent(-128), NumericsError);
}

TEST(Fp8, BulkMatchesScalar) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          -3.3f,
                          500.0f,
                          1e-5f,
                          70000.0f,
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::infinity()};
  std::vector<uint8_t> q(x.size());
  std::vector<float> back(x.size());
  for (Fp8Overflow mode : {kSat, kNonSat}) {
    FloatToE4M3(x.data(), q.data(), x.size(), mode);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(q[i], FloatToE4M3(x[i], mode));
    E4M3ToFloat(q.data(), back.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(E4M3ToFloat(q[i])));
    }
    FloatToE5M2(x.data(), q.data(), x.size(), mode);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(q[i], FloatToE5M2(x[i], mode));
    E5M2ToFloat(q.data(), back.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(E5M2ToFloat(q[i])));
    }
  }
}

}  // namespace
}  // namespace sshsdp
