// Tests of the elementwise kernels, including the overwrite/accumulate helper on fp32 and
// bf16 destinations pre-filled with NaN.
#include "sshsdp/kernels/elementwise.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp::kernels {
namespace {

TEST(Elementwise, FillScaleAdd) {
  std::vector<float> x(37), y(37);
  Fill(x.data(), 37, 2.0f);
  Scale(x.data(), 37, 1.5f);
  for (float v : x) EXPECT_EQ(v, 3.0f);
  Fill(y.data(), 37, -5.0f);
  Add(x.data(), y.data(), y.data(), 37);
  for (float v : y) EXPECT_EQ(v, -2.0f);
  EXPECT_DOUBLE_EQ(SumSquares(y.data(), 37), 4.0 * 37);
}

TEST(Elementwise, WriteOrAccumulateFp32AndBf16) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> src = {1.0f, -2.5f, 0.0f, 3.0f};
  std::vector<float> d(4, nan);
  WriteOrAccumulate(src.data(), d.data(), DType::kF32, 4, false);
  EXPECT_EQ(d, src);
  WriteOrAccumulate(src.data(), d.data(), DType::kF32, 4, true);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d[i], 2 * src[i]);

  std::vector<bf16> b(4, FloatToBf16(nan));
  WriteOrAccumulate(src.data(), b.data(), DType::kBF16, 4, false);
  WriteOrAccumulate(src.data(), b.data(), DType::kBF16, 4, true);
  std::vector<float> back(4);
  ToFloat(b.data(), DType::kBF16, back.data(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], 2 * src[i]);

  uint8_t e4m3 = 0;
  EXPECT_THROW(WriteOrAccumulate(src.data(), &e4m3, DType::kE4M3, 1, false), NumericsError);
}

TEST(Elementwise, VectorisedBf16RoundingMatchesScalar) {
  // Special values plus a sweep of bit patterns (ties, NaN payloads, subnormals, overflow).
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                0x7F800001u, 0xFF800001u, 0x7F7FFFFFu, 0x7F7F8000u, 0x3F808000u,
                                0x3F818000u, 0x00008000u, 0x00018000u, 0x3F800001u};
  uint32_t x = 12345;
  for (int i = 0; i < 100000; ++i) bits.push_back(x = x * 1664525u + 1013904223u);
  std::vector<float> src(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) src[i] = BitsToFloat(bits[i]);
  std::vector<bf16> fast(src.size()), portable(src.size());
  CastToBf16(src.data(), fast.data(), static_cast<int64_t>(src.size()));
  CastToBf16Portable(src.data(), portable.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(fast[i].bits, FloatToBf16(src[i]).bits) << std::hex << bits[i];
    ASSERT_EQ(portable[i].bits, FloatToBf16(src[i]).bits) << std::hex << bits[i];
  }
  // Every length 0..40 at every start offset 0..3: the vector body, its masked tail, and no
  // write past the end (a guard element after the range keeps its value).
  for (int64_t n = 0; n <= 40; ++n) {
    for (int64_t off = 0; off < 4; ++off) {
      std::vector<bf16> got(static_cast<size_t>(n + off + 1), bf16{0x1234});
      CastToBf16(src.data() + off, got.data() + off, n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[off + i].bits, FloatToBf16(src[off + i]).bits) << n << " " << off;
      ASSERT_EQ(got[off + n].bits, 0x1234) << "wrote past " << n;
      if (off > 0) {
        ASSERT_EQ(got[off - 1].bits, 0x1234) << "wrote before " << off;
      }
    }
  }
  // The widened GEMM path's helpers: rounding kept in fp32 and widening are the same bits.
  std::vector<float> through(src.size()), wide(src.size());
  RoundThroughBf16(src.data(), through.data(), static_cast<int64_t>(src.size()));
  WidenBf16(fast.data(), wide.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size(); ++i) {
    const uint32_t want = static_cast<uint32_t>(FloatToBf16(src[i]).bits) << 16;
    ASSERT_EQ(FloatBits(through[i]), want) << std::hex << bits[i];
    ASSERT_EQ(FloatBits(wide[i]), want) << std::hex << bits[i];
  }
  RoundThroughBf16(src.data(), src.data(), static_cast<int64_t>(src.size()));  // in place
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(FloatBits(src[i]), FloatBits(through[i]));
}

}  // namespace
}  // namespace sshsdp::kernels
