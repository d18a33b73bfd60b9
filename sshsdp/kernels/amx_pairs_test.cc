// amx::GemmPairs against exact integer products: small integers are exact in bf16 and their
// sums exact in fp32, so every element must match bit for bit. Shapes cover whole and
// partial tiles in every dimension (0 and odd sizes included); NaN bits fill every operand
// word the product must not use (pairs past kp in a row of A, B rows past kp, B's padding
// columns) and sentinels C's columns past N, which must stay. Reports skipped (77) where the
// CPU has no AMX-BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "sshsdp/kernels/amx_pairs.h"

namespace sshsdp::kernels {
namespace {

uint16_t Bf16Bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>(u >> 16);  // small integers: exact
}

constexpr uint32_t kNanPair = 0x7FC17FC1u;  // two quiet NaN bf16
constexpr float kSentinel = -12345.0f;

using Case = std::tuple<int, int, int>;  // M, N, kp

class AmxPairsTest : public ::testing::TestWithParam<Case> {};

void RunCase(int64_t M, int64_t N, int64_t kp, float alpha, bool acc) {
  std::mt19937 rng(static_cast<uint32_t>(M * 7919 + N * 131 + kp * 17 + acc));
  std::uniform_int_distribution<int> val(-8, 8);
  const int64_t lda = kp + 3, ldb = (N + 15) / 16 * 16 + 16, ldc = N + 5;
  // a[m][k], b[k][n] as integers; packed into pairs along k.
  std::vector<int> ai(M * 2 * kp), bi(2 * kp * N), c0(M * N);
  for (int& x : ai) x = val(rng);
  for (int& x : bi) x = val(rng);
  for (int& x : c0) x = val(rng) * 64;
  std::vector<uint32_t> a(M * lda, kNanPair), b((kp + 2) * ldb, kNanPair);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t p = 0; p < kp; ++p) {
      a[m * lda + p] = Bf16Bits(static_cast<float>(ai[m * 2 * kp + 2 * p])) |
                       uint32_t{Bf16Bits(static_cast<float>(ai[m * 2 * kp + 2 * p + 1]))} << 16;
    }
  }
  for (int64_t p = 0; p < kp; ++p) {
    for (int64_t n = 0; n < N; ++n) {
      b[p * ldb + n] = Bf16Bits(static_cast<float>(bi[2 * p * N + n])) |
                       uint32_t{Bf16Bits(static_cast<float>(bi[(2 * p + 1) * N + n]))} << 16;
    }
  }
  std::vector<float> c(M * ldc, kSentinel);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      c[m * ldc + n] = acc ? static_cast<float>(c0[m * N + n]) : std::nanf("");
    }
  }
  amx::GemmPairs(M, N, kp, a.data(), lda, b.data(), ldb, c.data(), ldc, alpha, acc);
  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < ldc; ++n) {
      float want = kSentinel;
      if (n < N) {
        int64_t s = 0;
        for (int64_t k = 0; k < 2 * kp; ++k) s += int64_t{ai[m * 2 * kp + k]} * bi[k * N + n];
        want = alpha * static_cast<float>(s) + (acc ? static_cast<float>(c0[m * N + n]) : 0.0f);
      }
      const float got = c[m * ldc + n];
      if (std::memcmp(&got, &want, 4) != 0 && bad++ < 5) {
        ADD_FAILURE() << "M=" << M << " N=" << N << " kp=" << kp << " alpha=" << alpha
                      << " acc=" << acc << ": C[" << m << "][" << n << "] = " << got << ", want "
                      << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(AmxPairsTest, MatchesExactIntegerProducts) {
  const auto [M, N, kp] = GetParam();
  for (const float alpha : {1.0f, 0.5f}) {
    for (const bool acc : {false, true}) RunCase(M, N, kp, alpha, acc);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AmxPairsTest,
                         ::testing::Combine(::testing::Values(0, 1, 15, 16, 17, 32, 33, 50),
                                            ::testing::Values(0, 1, 16, 17, 31, 33, 64),
                                            ::testing::Values(0, 1, 15, 16, 17, 40)));

}  // namespace
}  // namespace sshsdp::kernels
