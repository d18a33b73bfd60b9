// Bit-exact tests of DType metadata and fp32 <-> bf16 conversion on hand-picked values:
// exact values, ties to even (both directions), subnormals, the bf16 maximum and overflow,
// infinities, NaN (including a NaN whose payload lives only in the low 16 bits).
#include "sshsdp/numerics/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

uint16_t ToBits(uint32_t f32_bits) { return FloatToBf16(BitsToFloat(f32_bits)).bits; }

TEST(DType, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kE4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kE5M2), 1u);
  EXPECT_EQ(DTypeSize(DType::kUE8M0), 1u);
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    EXPECT_EQ(ParseDType(DTypeName(t)), t);
  }
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBF16);
  EXPECT_THROW(ParseDType("fp16"), NumericsError);
  try {
    ParseDType("int8");
  } catch (const NumericsError& e) {
    EXPECT_NE(std::string(e.what()).find("int8"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos);
  }
}

TEST(Bf16, ExactValuesRoundTrip) {
  EXPECT_EQ(ToBits(0x3F800000u), 0x3F80);  // 1.0
  EXPECT_EQ(ToBits(0xC0490000u), 0xC049);  // -3.140625 (exactly representable)
  EXPECT_EQ(ToBits(0x00000000u), 0x0000);  // +0
  EXPECT_EQ(ToBits(0x80000000u), 0x8000);  // -0 keeps its sign
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu)) continue;  // NaNs checked separately
    EXPECT_EQ(FloatToBf16(Bf16ToFloat(bf16{static_cast<uint16_t>(h)})).bits, h);
  }
}

TEST(Bf16, TiesToEven) {
  // 1.0 + 2^-8 is halfway between 1.0 (even mantissa) and 1.0 + 2^-7: rounds down.
  EXPECT_EQ(ToBits(0x3F808000u), 0x3F80);
  // 1.0 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(ToBits(0x3F818000u), 0x3F82);
  // Just above / below the halfway point.
  EXPECT_EQ(ToBits(0x3F808001u), 0x3F81);
  EXPECT_EQ(ToBits(0x3F807FFFu), 0x3F80);
  // Negative ties behave symmetrically.
  EXPECT_EQ(ToBits(0xBF808000u), 0xBF80);
  EXPECT_EQ(ToBits(0xBF818000u), 0xBF82);
}

TEST(Bf16, Subnormals) {
  // Smallest fp32 subnormal rounds to zero; a subnormal tie rounds to even.
  EXPECT_EQ(ToBits(0x00000001u), 0x0000);
  EXPECT_EQ(ToBits(0x00008000u), 0x0000);  // tie, even -> 0
  EXPECT_EQ(ToBits(0x00018000u), 0x0002);  // tie, odd -> up
  EXPECT_EQ(ToBits(0x00010000u), 0x0001);  // smallest bf16 subnormal, exact
  EXPECT_EQ(Bf16ToFloat(bf16{0x0001}), std::ldexp(1.0f, -133));
  // Largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(ToBits(0x007FFFFFu), 0x0080);
}

TEST(Bf16, MaxOverflowAndInf) {
  EXPECT_EQ(ToBits(0x7F7F0000u), 0x7F7F);  // bf16 max, exact
  EXPECT_EQ(Bf16ToFloat(bf16{0x7F7F}), 3.38953139e38f);
  EXPECT_EQ(ToBits(0x7F7F7FFFu), 0x7F7F);  // below halfway: stays at max
  EXPECT_EQ(ToBits(0x7F7F8000u), 0x7F80);  // halfway past max, odd -> rounds to +Inf
  EXPECT_EQ(ToBits(0x7F7FFFFFu), 0x7F80);  // fp32 max -> +Inf
  EXPECT_EQ(ToBits(0xFF7FFFFFu), 0xFF80);  // -fp32 max -> -Inf
  EXPECT_EQ(ToBits(0x7F800000u), 0x7F80);  // +Inf
  EXPECT_EQ(ToBits(0xFF800000u), 0xFF80);  // -Inf
}

TEST(Bf16, NaNStaysNaN) {
  EXPECT_EQ(ToBits(0x7FC00000u), 0x7FC0);  // canonical quiet NaN
  EXPECT_EQ(ToBits(0xFFC00000u), 0xFFC0);  // sign kept
  // Payload only in the low 16 bits: truncation would give Inf; we must keep NaN.
  uint16_t h = ToBits(0x7F800001u);
  EXPECT_EQ(h & 0x7F80, 0x7F80);
  EXPECT_NE(h & 0x7F, 0);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(bf16{h})));
  // A NaN whose rounding would carry into the sign bit stays a positive NaN.
  EXPECT_EQ(ToBits(0x7FFFFFFFu), 0x7FFF);
}

TEST(Bf16, BulkMatchesScalar) {
  float src[5] = {1.0f, 1.00390625f, -2.5f, std::numeric_limits<float>::infinity(), 1e-40f};
  bf16 dst[5];
  FloatToBf16(src, dst, 5);
  float back[5];
  Bf16ToFloat(dst, back, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(dst[i].bits, FloatToBf16(src[i]).bits);
    EXPECT_EQ(FloatBits(back[i]), FloatBits(Bf16ToFloat(dst[i])));
  }
}

}  // namespace
}  // namespace sshsdp
