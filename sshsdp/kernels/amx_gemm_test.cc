// amx::GemmBf16 against exact integer products: small integers are exact in bf16 and their
// sums exact in fp32 in any order, so every element must match bit for bit. Shapes cover
// whole and partial tiles and blocks in m, n and k (odd k, k past one 512-element block,
// n past one 512-column panel), every transpose, padded strides whose padding holds NaN (the
// product must not read it), sentinels in C's padding columns (which must stay), alpha and
// accumulate. Then, on random bf16 data: bit-identical results at 1 and 3 threads and for a
// row range computed alone, and an accumulated product equal to the overwritten one added
// afterwards; a tall product deeper than one k block keeps bounded scratch and the same bits.
// Reports skipped (77) where the CPU has no AMX-BF16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/amx_pairs.h"
#include "sshsdp/kernels/parallel.h"

namespace sshsdp::kernels {
namespace {

constexpr float kSentinel = -12345.0f;
const bf16 kNanBf16{0x7FC1};

// A stored matrix of `rows` × `cols` (row stride cols + 3, NaN in the padding).
struct Stored {
  int64_t rows, cols, ld;
  std::vector<bf16> v;
  Stored(int64_t r, int64_t c)
      : rows(r), cols(c), ld(c + 3), v(static_cast<size_t>(r * (c + 3) + 1), kNanBf16) {}
  bf16& at(int64_t r, int64_t c) { return v[static_cast<size_t>(r * ld + c)]; }
};

using Case = std::tuple<int, int, int, int>;  // m, n, k, transposes (bit 0: A, bit 1: B)

class AmxGemmTest : public ::testing::TestWithParam<Case> {};

TEST_P(AmxGemmTest, MatchesExactIntegerProducts) {
  const auto [m, n, k, tr] = GetParam();
  const bool ta = tr & 1, tb = tr & 2;
  std::mt19937 rng(static_cast<uint32_t>(m * 7919 + n * 131 + k * 17 + tr));
  std::uniform_int_distribution<int> val(-8, 8);
  std::vector<int> ai(static_cast<size_t>(m * k)), bi(static_cast<size_t>(k * n)),
      c0(static_cast<size_t>(m * n));
  for (int& x : ai) x = val(rng);
  for (int& x : bi) x = val(rng);
  for (int& x : c0) x = val(rng) * 64;
  Stored A(ta ? k : m, ta ? m : k), B(tb ? n : k, tb ? k : n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const bf16 x = FloatToBf16(static_cast<float>(ai[i * k + p]));
      (ta ? A.at(p, i) : A.at(i, p)) = x;
    }
  }
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t j = 0; j < n; ++j) {
      const bf16 x = FloatToBf16(static_cast<float>(bi[p * n + j]));
      (tb ? B.at(j, p) : B.at(p, j)) = x;
    }
  }
  const int64_t ldc = n + 5;
  for (const float alpha : {1.0f, 0.5f}) {
    for (const bool acc : {false, true}) {
      std::vector<float> c(static_cast<size_t>(m * ldc), kSentinel);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j)
          c[i * ldc + j] = acc ? static_cast<float>(c0[i * n + j]) : std::nanf("");
      }
      amx::GemmBf16(ta, tb, m, n, k, A.v.data(), A.ld, B.v.data(), B.ld, c.data(), ldc, alpha, acc);
      int64_t bad = 0;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          float want = kSentinel;
          if (j < n) {
            int64_t s = 0;
            for (int64_t p = 0; p < k; ++p) s += int64_t{ai[i * k + p]} * bi[p * n + j];
            want = alpha * static_cast<float>(s) + (acc ? static_cast<float>(c0[i * n + j]) : 0.0f);
          }
          const float got = c[i * ldc + j];
          if (std::memcmp(&got, &want, 4) != 0 && bad++ < 5) {
            ADD_FAILURE() << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
                          << " alpha=" << alpha << " acc=" << acc << ": C[" << i << "][" << j
                          << "] = " << got << ", want " << want;
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AmxGemmTest,
                         ::testing::Combine(::testing::Values(1, 16, 17, 33, 70),
                                            ::testing::Values(1, 15, 32, 33, 530),
                                            ::testing::Values(0, 1, 2, 31, 33, 64, 513, 1024, 1100),
                                            ::testing::Values(0, 1, 2, 3)));

std::vector<bf16> RandomBf16(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<bf16> v(count);
  for (bf16& x : v) x = FloatToBf16(d(rng));
  return v;
}

// x·wᵀ as the forward runs it, on random values, two k blocks deep (x's rows load as tiles
// straight from x): the same bits at any thread count, for any row range computed alone, and
// an accumulating product (alpha 0.5) equal to the overwriting one added afterwards.
TEST(AmxGemm, ResultsDoNotDependOnTheSplit) {
  const int64_t m = 100, n = 77, k = 1536;
  const auto x = RandomBf16(m * k, 1), w = RandomBf16(n * k, 2);
  auto run = [&](int64_t rows, int64_t row0, int threads, bool acc, std::vector<float> c) {
    const int saved = KernelThreads();
    SetKernelThreads(threads);
    amx::GemmBf16(false, true, rows, n, k, x.data() + row0 * k, k, w.data(), k, c.data(), n, 0.5f,
                  acc);
    SetKernelThreads(saved);
    return c;
  };
  const std::vector<float> one = run(m, 0, 1, false, std::vector<float>(m * n));
  EXPECT_EQ(0, std::memcmp(one.data(), run(m, 0, 3, false, std::vector<float>(m * n)).data(),
                           one.size() * 4));
  const std::vector<float> tail = run(m - 37, 37, 1, false, std::vector<float>((m - 37) * n));
  EXPECT_EQ(0, std::memcmp(one.data() + 37 * n, tail.data(), tail.size() * 4));
  std::vector<float> c0(m * n);
  for (size_t i = 0; i < c0.size(); ++i) c0[i] = 0.25f * static_cast<float>(i % 13) - 1.0f;
  const std::vector<float> accumulated = run(m, 0, 2, true, c0);
  for (size_t i = 0; i < c0.size(); ++i) {
    const float want = c0[i] + one[i];
    ASSERT_EQ(0, std::memcmp(&accumulated[i], &want, 4)) << "element " << i;
  }
}

// An A whose row stride is a multiple of 2 KiB is packed, any other loads straight from its
// rows: both give the exact integer products.
TEST(AmxGemm, RowStridesOfTwoKibAndOthersAgree) {
  const int64_t m = 64, n = 40, k = 512;
  for (const int64_t lda : {int64_t{1024}, int64_t{1000}}) {
    std::vector<bf16> a(m * lda, kNanBf16), b(k * n);
    std::vector<int64_t> want(m * n, 0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t p = 0; p < k; ++p)
        a[i * lda + p] = FloatToBf16(static_cast<float>((i + 3 * p) % 7 - 3));
    }
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t j = 0; j < n; ++j)
        b[p * n + j] = FloatToBf16(static_cast<float>((p * j) % 5 - 2));
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t p = 0; p < k; ++p)
          want[i * n + j] += ((i + 3 * p) % 7 - 3) * ((p * j) % 5 - 2);
      }
    }
    std::vector<float> c(m * n, std::nanf(""));
    amx::GemmBf16(false, false, m, n, k, a.data(), lda, b.data(), n, c.data(), n, 1.0f, false);
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_EQ(c[i], static_cast<float>(want[i])) << "lda " << lda << " element " << i;
    }
  }
}

// The LM head's weight gradient (dyᵀ·x: m = the vocabulary, k = the tokens) past one k block:
// the partial sums between k blocks stay within one 4 MiB pass of rows (here three passes and
// two panels), and the result is the same bits as row ranges computed alone in one pass each.
TEST(AmxGemm, TallDeepProductsKeepBoundedScratch) {
  const int64_t m = 4136, n = 520, k = 1100;
  const auto dy = RandomBf16(k * m, 3), x = RandomBf16(k * n, 4);  // dy stored [k, m]
  std::vector<float> whole(m * n, std::nanf(""));
  amx::GemmBf16(true, false, m, n, k, dy.data(), m, x.data(), n, whole.data(), n, 1.0f, false);
  EXPECT_LE(amx::GemmBf16ScratchBytes(), int64_t{6} << 20)
      << "partial sums of a tall product must stay within one pass (4 MiB)";
  for (int64_t row0 = 0; row0 < m; row0 += 517) {
    const int64_t rows = std::min<int64_t>(517, m - row0);
    std::vector<float> part(rows * n, std::nanf(""));
    amx::GemmBf16(true, false, rows, n, k, dy.data() + row0, m, x.data(), n, part.data(), n, 1.0f,
                  false);
    ASSERT_EQ(0, std::memcmp(part.data(), whole.data() + row0 * n, part.size() * 4))
        << "rows " << row0 << ".." << row0 + rows;
  }
}

TEST(AmxGemm, CountsCallsThatMultiply) {
  const int64_t before = amx::GemmBf16Calls();
  std::vector<bf16> a(64, FloatToBf16(1.0f));
  std::vector<float> c(64, 5.0f);
  amx::GemmBf16(false, false, 0, 8, 8, a.data(), 8, a.data(), 8, c.data(), 8, 1.0f, false);
  amx::GemmBf16(false, false, 8, 8, 0, a.data(), 8, a.data(), 8, c.data(), 8, 1.0f, false);
  EXPECT_EQ(amx::GemmBf16Calls(), before);
  EXPECT_EQ(c[0], 0.0f);
  EXPECT_EQ(c[63], 0.0f);  // k = 0 overwrites with zeros
  amx::GemmBf16(false, false, 8, 8, 8, a.data(), 8, a.data(), 8, c.data(), 8, 1.0f, false);
  EXPECT_EQ(amx::GemmBf16Calls(), before + 1);
  EXPECT_EQ(c[63], 8.0f);
}

}  // namespace
}  // namespace sshsdp::kernels
