// Tests of the oneDNN GEMMs against a naive triple loop in double: odd shapes, fp32 and
// bf16 operands (bf16 compared against the naive loop on the same bf16-rounded operands,
// so the only difference is fp32 accumulation order), fp32 and bf16 destinations,
// transposes and batches, and the overwrite/accumulate contract (overwrite must replace a
// NaN-filled destination; accumulate must add to what is there).
#include "sshsdp/kernels/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/amx_pairs.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/gemm_provider.h"
#include "sshsdp/kernels/testing/gemm_data.h"

namespace sshsdp::kernels {
namespace {

using testing::Random;
using testing::RoundedToBf16;
using testing::ToBf16;

struct Shape {
  int64_t m, n, k;
};

// {33, 512, 9} and {40, 1024, 6}: n a multiple of 512, the padded-rows path of
// LinearBackwardWeight.
const Shape kShapes[] = {{1, 1, 1},     {3, 5, 7},    {17, 33, 65}, {64, 48, 80},
                         {130, 7, 257}, {33, 512, 9}, {40, 1024, 6}};

// Naive C = op(A)·op(B) in double; also returns Σ|a·b| per element (the error scale).
struct Ref {
  std::vector<double> c, abs;
};
Ref Naive(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const std::vector<float>& a,
          const std::vector<float>& b) {
  Ref r{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, s_abs = 0;
      for (int64_t p = 0; p < k; ++p) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
        s_abs += std::abs(av * bv);
      }
      r.c[i * n + j] = s;
      r.abs[i * n + j] = s_abs;
    }
  }
  return r;
}

// got[i] ≈ base[i] + ref.c[i] within fp32 accumulation error (relative to Σ|terms|).
void ExpectClose(const std::vector<float>& got, const Ref& ref, const std::vector<float>& base,
                 double rel, const char* what) {
  ASSERT_EQ(got.size(), ref.c.size());
  for (size_t i = 0; i < got.size(); ++i) {
    double want = ref.c[i] + (base.empty() ? 0.0 : base[i]);
    double scale = ref.abs[i] + (base.empty() ? 0.0 : std::abs(base[i]));
    ASSERT_NEAR(got[i], want, rel * scale + 1e-30) << what << " element " << i;
  }
}

TEST(Matmul, LinearForwardFp32AndBf16) {
  for (const Shape& s : kShapes) {
    auto x = Random(s.m * s.k, 1);
    auto w = Random(s.n * s.k, 2);
    std::vector<float> y(s.m * s.n, std::numeric_limits<float>::quiet_NaN());
    LinearForward(x.data(), w.data(), DType::kF32, y.data(), s.m, s.n, s.k);
    ExpectClose(y, Naive(false, true, s.m, s.n, s.k, x, w), {}, 1e-5, "fp32");

    auto wb = ToBf16(w);
    std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
    LinearForward(x.data(), wb.data(), DType::kBF16, y.data(), s.m, s.n, s.k);
    ExpectClose(y, Naive(false, true, s.m, s.n, s.k, RoundedToBf16(x), RoundedToBf16(w)), {}, 1e-5,
                "bf16");
  }
}

TEST(Matmul, LinearBackwardDataOverwriteAndAccumulate) {
  for (const Shape& s : kShapes) {
    auto dy = Random(s.m * s.n, 3);
    auto w = Random(s.n * s.k, 4);
    auto base = Random(s.m * s.k, 5);
    for (DType t : {DType::kF32, DType::kBF16}) {
      auto wb = ToBf16(w);
      const void* wp = t == DType::kF32 ? static_cast<const void*>(w.data()) : wb.data();
      Ref ref = t == DType::kF32
                    ? Naive(false, false, s.m, s.k, s.n, dy, w)
                    : Naive(false, false, s.m, s.k, s.n, RoundedToBf16(dy), RoundedToBf16(w));
      std::vector<float> dx(s.m * s.k, std::numeric_limits<float>::quiet_NaN());
      LinearBackwardData(dy.data(), wp, t, dx.data(), s.m, s.n, s.k, false);
      ExpectClose(dx, ref, {}, 1e-5, "overwrite");
      dx = base;
      LinearBackwardData(dy.data(), wp, t, dx.data(), s.m, s.n, s.k, true);
      ExpectClose(dx, ref, base, 1e-5, "accumulate");
    }
  }
}

TEST(Matmul, LinearBackwardWeightAllDtypes) {
  for (const Shape& s : kShapes) {
    auto dy = Random(s.m * s.n, 6);
    auto x = Random(s.m * s.k, 7);
    auto base = RoundedToBf16(Random(s.n * s.k, 8));  // representable in both dw dtypes
    for (DType compute : {DType::kF32, DType::kBF16}) {
      Ref ref = compute == DType::kF32
                    ? Naive(true, false, s.n, s.k, s.m, dy, x)
                    : Naive(true, false, s.n, s.k, s.m, RoundedToBf16(dy), RoundedToBf16(x));
      // fp32 destination.
      std::vector<float> dw(s.n * s.k, std::numeric_limits<float>::quiet_NaN());
      LinearBackwardWeight(dy.data(), x.data(), compute, dw.data(), DType::kF32, s.m, s.n, s.k,
                           false);
      ExpectClose(dw, ref, {}, 1e-5, "fp32 overwrite");
      dw = base;
      LinearBackwardWeight(dy.data(), x.data(), compute, dw.data(), DType::kF32, s.m, s.n, s.k,
                           true);
      ExpectClose(dw, ref, base, 1e-5, "fp32 accumulate");
      // bf16 destination: one rounding of the fp32 result (2^-8 relative) on top.
      std::vector<bf16> dwb(s.n * s.k, bf16{0x7FC0});  // NaN
      LinearBackwardWeight(dy.data(), x.data(), compute, dwb.data(), DType::kBF16, s.m, s.n, s.k,
                           false);
      std::vector<float> got(dwb.size());
      Bf16ToFloat(dwb.data(), got.data(), got.size());
      ExpectClose(got, ref, {}, 1e-5 + 1.0 / 256, "bf16 overwrite");
      dwb = ToBf16(base);
      LinearBackwardWeight(dy.data(), x.data(), compute, dwb.data(), DType::kBF16, s.m, s.n, s.k,
                           true);
      Bf16ToFloat(dwb.data(), got.data(), got.size());
      ExpectClose(got, ref, base, 1e-5 + 1.0 / 256, "bf16 accumulate");
    }
  }
}

// Bit patterns of an fp32 vector (NaN-safe equality).
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}
std::vector<bf16> Cast(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  CastToBf16(v.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}

// LinearInput: an activation handed over already rounded to bf16 gives the bits of the fp32
// activation rounded inside the call, in all three products, overwrite and accumulate, fp32
// and bf16 weight gradients, the padded-rows shapes included (the WIDENED variant runs the
// portable path); the call rounds nothing (LinearRoundedElements), and a rounded activation
// with a non-bf16 weight is refused.
TEST(Matmul, RoundedInputsGiveTheSameBitsAndAreNotRoundedAgain) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s.m << "x" << s.n << "x" << s.k);
    const auto x = Random(s.m * s.k, 11), dy = Random(s.m * s.n, 12);
    const auto w = ToBf16(Random(s.n * s.k, 13));
    const auto x16 = Cast(x), dy16 = Cast(dy);
    const auto base = Random(std::max(s.m * s.k, s.n * s.k), 14);
    int64_t before = LinearRoundedElements();
    std::vector<float> y32(s.m * s.n), y16(s.m * s.n);
    LinearForward(x.data(), w.data(), DType::kBF16, y32.data(), s.m, s.n, s.k);
    EXPECT_EQ(LinearRoundedElements() - before, s.m * s.k);
    before = LinearRoundedElements();
    LinearForward(x16.data(), w.data(), DType::kBF16, y16.data(), s.m, s.n, s.k);
    EXPECT_EQ(LinearRoundedElements(), before);
    EXPECT_EQ(Bits(y32), Bits(y16));
    for (bool acc : {false, true}) {
      std::vector<float> dx32(base.begin(), base.begin() + s.m * s.k), dx16 = dx32;
      LinearBackwardData(dy.data(), w.data(), DType::kBF16, dx32.data(), s.m, s.n, s.k, acc);
      before = LinearRoundedElements();
      LinearBackwardData(dy16.data(), w.data(), DType::kBF16, dx16.data(), s.m, s.n, s.k, acc);
      EXPECT_EQ(LinearRoundedElements(), before);
      EXPECT_EQ(Bits(dx32), Bits(dx16)) << "accumulate " << acc;
      // Weight gradient: each operand rounded or not, fp32 and bf16 destinations.
      const std::vector<float> dw0(base.begin(), base.begin() + s.n * s.k);
      std::vector<float> want = dw0;
      LinearBackwardWeight(dy.data(), x.data(), DType::kBF16, want.data(), DType::kF32, s.m, s.n,
                           s.k, acc);
      std::vector<bf16> want16 = Cast(dw0);
      LinearBackwardWeight(dy.data(), x.data(), DType::kBF16, want16.data(), DType::kBF16, s.m, s.n,
                           s.k, acc);
      const LinearInput dys[] = {dy.data(), dy16.data()}, xs[] = {x.data(), x16.data()};
      for (int mix = 1; mix < 4; ++mix) {
        const LinearInput a = dys[mix & 1], b = xs[mix >> 1];
        std::vector<float> got = dw0;
        before = LinearRoundedElements();
        LinearBackwardWeight(a, b, DType::kBF16, got.data(), DType::kF32, s.m, s.n, s.k, acc);
        const int64_t rounded = (mix & 1 ? 0 : s.m * s.n) + (mix >> 1 ? 0 : s.m * s.k);
        EXPECT_EQ(LinearRoundedElements() - before, rounded) << "mix " << mix;
        EXPECT_EQ(Bits(want), Bits(got)) << "mix " << mix << " accumulate " << acc;
        std::vector<bf16> got16 = Cast(dw0);
        LinearBackwardWeight(a, b, DType::kBF16, got16.data(), DType::kBF16, s.m, s.n, s.k, acc);
        for (size_t i = 0; i < got16.size(); ++i) ASSERT_EQ(want16[i].bits, got16[i].bits) << i;
      }
    }
  }
  const auto x16 = Cast(Random(6, 1));
  const auto w32 = Random(6, 2);
  std::vector<float> y(4);
  EXPECT_THROW(LinearForward(x16.data(), w32.data(), DType::kF32, y.data(), 2, 2, 3),
               NumericsError);
  EXPECT_THROW(LinearBackwardWeight(x16.data(), w32.data(), DType::kF32, y.data(), DType::kF32, 3,
                                    2, 2, false),
               NumericsError);
}

TEST(Matmul, GemmTransposesAndBatches) {
  const int64_t batch = 3, m = 9, n = 11, k = 13;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = Random(batch * m * k, 9);
      auto b = Random(batch * k * n, 10);
      std::vector<float> c(batch * m * n, std::numeric_limits<float>::quiet_NaN());
      Gemm(ta, tb, m, n, k, a.data(), b.data(), DType::kF32, c.data(), DType::kF32, false, batch);
      for (int64_t i = 0; i < batch; ++i) {
        std::vector<float> ai(a.begin() + i * m * k, a.begin() + (i + 1) * m * k);
        std::vector<float> bi(b.begin() + i * k * n, b.begin() + (i + 1) * k * n);
        std::vector<float> ci(c.begin() + i * m * n, c.begin() + (i + 1) * m * n);
        ExpectClose(ci, Naive(ta, tb, m, n, k, ai, bi), {}, 1e-5, "batched");
      }
      // bf16 operands and a bf16 destination with accumulate (the Newton–Schulz shape).
      auto ab = ToBf16(a), bb = ToBf16(b);
      std::vector<bf16> cb(batch * m * n, FloatToBf16(1.0f));
      Gemm(ta, tb, m, n, k, ab.data(), bb.data(), DType::kBF16, cb.data(), DType::kBF16, true,
           batch);
      auto ar = RoundedToBf16(a), br = RoundedToBf16(b);
      for (int64_t i = 0; i < batch; ++i) {
        std::vector<float> ai(ar.begin() + i * m * k, ar.begin() + (i + 1) * m * k);
        std::vector<float> bi(br.begin() + i * k * n, br.begin() + (i + 1) * k * n);
        std::vector<float> ci(m * n);
        Bf16ToFloat(cb.data() + i * m * n, ci.data(), m * n);
        ExpectClose(ci, Naive(ta, tb, m, n, k, ai, bi), std::vector<float>(m * n, 1.0f),
                    1e-5 + 1.0 / 256, "bf16 batched accumulate");
      }
    }
  }
}

TEST(Matmul, GemmStridedOnSubBlocksWithAlpha) {
  // A, B and C are column blocks of wider row-major arrays (like one head inside a packed
  // QKV activation); elements outside the blocks must stay untouched.
  const int64_t m = 7, n = 5, k = 6, lda = 20, ldb = 17, ldc = 11;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
      const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
      auto a_full = Random(a_rows * lda, 21);
      auto b_full = Random(b_rows * ldb, 22);
      std::vector<float> a(a_rows * a_cols), b(b_rows * b_cols);
      for (int64_t r = 0; r < a_rows; ++r) {
        for (int64_t c = 0; c < a_cols; ++c) a[r * a_cols + c] = a_full[r * lda + 3 + c];
      }
      for (int64_t r = 0; r < b_rows; ++r) {
        for (int64_t c = 0; c < b_cols; ++c) b[r * b_cols + c] = b_full[r * ldb + 2 + c];
      }
      Ref ref = Naive(ta, tb, m, n, k, a, b);
      for (double& v : ref.c) v *= 0.5;
      for (double& v : ref.abs) v *= 0.5;
      std::vector<float> c_full(m * ldc, 7.0f);
      GemmStrided(ta, tb, m, n, k, a_full.data() + 3, lda, b_full.data() + 2, ldb, DType::kF32,
                  c_full.data() + 4, ldc, DType::kF32, true, 0.5f);
      std::vector<float> c(m * n);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < ldc; ++j) {
          if (j >= 4 && j < 4 + n) {
            c[r * n + j - 4] = c_full[r * ldc + j];
          } else {
            ASSERT_EQ(c_full[r * ldc + j], 7.0f) << "outside the C block";
          }
        }
      }
      ExpectClose(c, ref, std::vector<float>(m * n, 7.0f), 1e-5, "strided accumulate");
      // bf16 destination through the fp32 fallback, overwriting NaN, strided.
      std::vector<bf16> cb(m * ldc, bf16{0x7FC0});
      GemmStrided(ta, tb, m, n, k, a_full.data() + 3, lda, b_full.data() + 2, ldb, DType::kF32,
                  cb.data() + 4, ldc, DType::kBF16, false, 0.5f);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < n; ++j) c[r * n + j] = Bf16ToFloat(cb[r * ldc + 4 + j]);
        EXPECT_EQ(cb[r * ldc].bits, 0x7FC0) << "outside the C block";
      }
      ExpectClose(c, ref, {}, 1e-5 + 1.0 / 256, "strided bf16");
    }
  }
  float x = 0;
  EXPECT_THROW(
      GemmStrided(false, false, 2, 2, 3, &x, 2, &x, 2, DType::kF32, &x, 2, DType::kF32, false),
      NumericsError);  // lda 2 < k 3
}

// A [2, 3] grid of strided products in one call equals each product done alone with
// GemmStrided (attention's layout: operands interleaved in packed rows, C dense), for every
// transpose, overwrite and accumulate, with alpha; k = 0 writes zeros; C strides of 0 on a
// dimension of several products are refused, naming the strides.
TEST(Matmul, GemmBatchedStridedEqualsEachProductAlone) {
  const int64_t O = 2, I = 3, m = 7, n = 5, k = 6, row = 3 * I * 8;  // packed rows, width 72
  const auto a = Random(O * 9 * row, 31), b = Random(O * 9 * row, 32);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool acc : {false, true}) {
        const GridStrides sa{9 * row, 8}, sb{9 * row, 8}, sc{I * m * n, m * n};
        std::vector<float> c(O * I * m * n, 0.5f), want = c;
        GemmBatchedStrided(ta, tb, O, I, m, n, k, a.data() + 1, row, sa, b.data() + 2, row, sb,
                           c.data(), n, sc, acc, 0.75f);
        for (int64_t o = 0; o < O; ++o) {
          for (int64_t i = 0; i < I; ++i) {
            GemmStrided(ta, tb, m, n, k, a.data() + 1 + o * sa.outer + i * sa.inner, row,
                        b.data() + 2 + o * sb.outer + i * sb.inner, row, DType::kF32,
                        want.data() + o * sc.outer + i * sc.inner, n, DType::kF32, acc, 0.75f);
          }
        }
        for (size_t i = 0; i < c.size(); ++i) {
          ASSERT_NEAR(c[i], want[i], 1e-5 * (1.0 + std::abs(want[i])))
              << "ta " << ta << " tb " << tb << " acc " << acc << " at " << i;
        }
      }
    }
  }
  std::vector<float> c(O * I * m * n, 7.0f);
  GemmBatchedStrided(false, false, O, I, m, n, 0, a.data(), row, {0, 0}, b.data(), row, {0, 0},
                     c.data(), n, {I * m * n, m * n}, false);
  for (float v : c) EXPECT_EQ(v, 0.0f);
  try {
    GemmBatchedStrided(false, false, O, I, m, n, k, a.data(), row, {0, 8}, b.data(), row, {0, 8},
                       c.data(), n, {0, m * n}, false);
    ADD_FAILURE() << "overlapping C accepted";
  } catch (const NumericsError& e) {
    EXPECT_NE(std::string(e.what()).find("grid strides"), std::string::npos) << e.what();
  }
}

TEST(Matmul, EmptyInnerDimensionWritesZerosOrKeeps) {
  std::vector<float> c(6, std::numeric_limits<float>::quiet_NaN());
  float dummy = 0;
  Gemm(false, false, 2, 3, 0, &dummy, &dummy, DType::kF32, c.data(), DType::kF32, false);
  for (float v : c) EXPECT_EQ(v, 0.0f);
  std::fill(c.begin(), c.end(), 2.0f);
  Gemm(false, false, 2, 3, 0, &dummy, &dummy, DType::kF32, c.data(), DType::kF32, true);
  for (float v : c) EXPECT_EQ(v, 2.0f);
}

TEST(Matmul, RejectsUnsupportedDtypes) {
  float x = 1, y = 0;
  uint8_t w = 0;
  EXPECT_THROW(LinearForward(&x, &w, DType::kE4M3, &y, 1, 1, 1), NumericsError);
  EXPECT_THROW(LinearBackwardWeight(&x, &x, DType::kF32, &w, DType::kE5M2, 1, 1, 1, false),
               NumericsError);
}

// The ctest entries that force a provider (SSHSDP_GEMM, kernels_matmul_test_mkl / _blis) run
// on it, not on oneDNN.
TEST(Matmul, ForcedProviderIsTheActiveOne) {
  const char* forced = std::getenv("SSHSDP_GEMM");
  if (!forced || !*forced || std::string_view(forced) == "auto") GTEST_SKIP() << "not forced";
  EXPECT_EQ(GemmProviderName(ActiveGemmProvider()), std::string_view(forced));
  EXPECT_NE(GemmPathDescription(DType::kF32).find(GemmProviderLabel(ActiveGemmProvider())),
            std::string::npos);
}

TEST(Matmul, PeakIsPositiveAndImplementationNamed) {
  double fp32 = MeasureGemmPeak(DType::kF32, 128, 3);
  double b16 = MeasureGemmPeak(DType::kBF16, 128, 3);
  EXPECT_GT(fp32, 1e8);
  EXPECT_GT(b16, 1e8);
  EXPECT_FALSE(GemmImplementation(false, true, 64, 64, 64, DType::kBF16, DType::kF32).empty());
}

// The native path's single products run on the kernel ActiveBf16GemmKernel names (this binary
// runs once as it is — AMX where the CPU has it — and once with SSHSDP_BF16_GEMM_KERNEL=onednn):
// the AMX kernel's call count moves with bf16 products exactly when it is the kernel; fp32 and
// batched products never move it; the header line names it, and 'amx' is refused where the CPU
// has no AMX-BF16.
TEST(Matmul, Bf16ProductsRunOnTheNamedKernel) {
  const bool amx = ActiveBf16GemmPath() == Bf16GemmPath::kNative &&
                   ActiveBf16GemmKernel() == Bf16GemmKernel::kAmx;
  const char* env = std::getenv("SSHSDP_BF16_GEMM_KERNEL");
  if (amx::Available() && ActiveBf16GemmPath() == Bf16GemmPath::kNative) {
    EXPECT_EQ(amx, !(env && std::string_view(env) == "onednn"));
  }
  auto x = Random(40 * 24, 1);
  auto w = ToBf16(Random(16 * 24, 2));
  std::vector<float> y(40 * 16), y32(40 * 16), wf(16 * 24, 0.5f);
  int64_t before = amx::GemmBf16Calls();
  LinearForward(x.data(), w.data(), DType::kBF16, y.data(), 40, 16, 24);
  LinearBackwardData(y.data(), w.data(), DType::kBF16, x.data(), 40, 16, 24, true);
  EXPECT_EQ(amx::GemmBf16Calls() - before, amx ? 2 : 0);
  before = amx::GemmBf16Calls();
  LinearForward(x.data(), wf.data(), DType::kF32, y32.data(), 40, 16, 24);
  Gemm(false, false, 4, 4, 4, w.data(), w.data(), DType::kBF16, y.data(), DType::kF32, false, 2);
  EXPECT_EQ(amx::GemmBf16Calls(), before);
  const std::string desc = GemmPathDescription(DType::kBF16);
  EXPECT_EQ(desc.find("AMX tiles") != std::string::npos, amx) << desc;
  if (!amx::Available()) {
    try {
      SetBf16GemmKernel(Bf16GemmKernel::kAmx);
      ADD_FAILURE() << "'amx' accepted on a CPU without AMX-BF16";
    } catch (const NumericsError& e) {
      EXPECT_NE(std::string(e.what()).find("no AMX-BF16"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace sshsdp::kernels
