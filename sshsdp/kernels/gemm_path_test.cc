// Tests of the bf16 GEMM paths (matmul.h): the widened path equals an fp32 product of the
// bf16 values bit for bit (same fp32 primitive, so any widening slip — a stride, a transposed
// operand, a batch, an unrounded activation — shows as a mismatch), the native path agrees
// with it to accumulation order where this CPU has one (skipped elsewhere), the probe's
// choice, and the errors for bad or impossible path requests.
//
// ctest also runs this binary with DNNL_MAX_CPU_ISA=AVX2 and SSHSDP_EXPECT_BF16_PATH=widened,
// so an AVX-512/AMX machine checks that the probe falls back where bf16 matmul is missing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/gemm_provider.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/testing/gemm_data.h"

namespace sshsdp::kernels {
namespace {

using testing::Random;
using testing::RoundedToBf16;
using testing::ToBf16;
using testing::Widened;

// Bitwise equality of two fp32 arrays (NaN patterns included).
void ExpectBitEqual(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
        << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

// Restores the path active when the test started.
class GemmPathTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = ActiveBf16GemmPath(); }
  void TearDown() override { SetBf16GemmPath(saved_); }
  Bf16GemmPath saved_ = Bf16GemmPath::kWidened;
};

struct Case {
  bool ta, tb;
  int64_t m, n, k, batch;
};
const Case kCases[] = {{false, false, 1, 1, 1, 1},   {false, true, 17, 33, 65, 1},
                       {true, false, 64, 48, 80, 1}, {true, true, 5, 130, 7, 1},
                       {false, true, 9, 12, 31, 3},  {true, false, 16, 16, 16, 2}};

TEST_F(GemmPathTest, WidenedGemmEqualsFp32ProductOfTheBf16Values) {
  SetBf16GemmPath(Bf16GemmPath::kWidened);
  for (const Case& c : kCases) {
    auto a = ToBf16(Random(c.batch * c.m * c.k, 1));
    auto b = ToBf16(Random(c.batch * c.k * c.n, 2));
    auto base = RoundedToBf16(Random(c.batch * c.m * c.n, 3));
    std::vector<float> prod(base.size(), NAN);  // overwrite product of the bf16 values
    Gemm(c.ta, c.tb, c.m, c.n, c.k, Widened(a).data(), Widened(b).data(), DType::kF32, prod.data(),
         DType::kF32, false, c.batch);
    for (bool acc : {false, true}) {
      const std::string what = fmt::format("ta={} tb={} m={} n={} k={} batch={} acc={}", c.ta, c.tb,
                                           c.m, c.n, c.k, c.batch, acc);
      std::vector<float> want = acc ? base : std::vector<float>(base.size(), NAN);
      std::vector<float> got = want;
      Gemm(c.ta, c.tb, c.m, c.n, c.k, Widened(a).data(), Widened(b).data(), DType::kF32,
           want.data(), DType::kF32, acc, c.batch);
      Gemm(c.ta, c.tb, c.m, c.n, c.k, a.data(), b.data(), DType::kBF16, got.data(), DType::kF32,
           acc, c.batch);
      ExpectBitEqual(got, want, what);
      // bf16 destination: the fp32 product (added to the bf16 values) rounded once.
      std::vector<bf16> got16 = ToBf16(acc ? base : std::vector<float>(base.size(), NAN));
      Gemm(c.ta, c.tb, c.m, c.n, c.k, a.data(), b.data(), DType::kBF16, got16.data(), DType::kBF16,
           acc, c.batch);
      std::vector<float> want16(prod.size());
      for (size_t i = 0; i < prod.size(); ++i) {
        want16[i] = RoundToBf16(acc ? base[i] + prod[i] : prod[i]);
      }
      ExpectBitEqual(Widened(got16), want16, "bf16 destination, " + what);
    }
  }
}

TEST_F(GemmPathTest, WidenedStridedSubBlocksEqualFp32) {
  SetBf16GemmPath(Bf16GemmPath::kWidened);
  // One head's 8 columns of a [T, 3·32] packed QKV times another's, with alpha: the widening
  // must honour the row strides and leave the rest of C alone.
  const int64_t T = 13, ld = 96, dh = 8;
  auto qkv = ToBf16(Random(T * ld, 4));
  // The reference multiplies dense fp32 copies of the two sub-blocks.
  std::vector<float> q(T * dh), k(T * dh);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < dh; ++j) {
      q[t * dh + j] = Bf16ToFloat(qkv[t * ld + 8 + j]);
      k[t * dh + j] = Bf16ToFloat(qkv[t * ld + 40 + j]);
    }
  }
  std::vector<float> want(T * (T + 3), 7.0f), got = want;  // ldc = T + 3: padding untouched
  GemmStrided(false, true, T, T, dh, q.data(), dh, k.data(), dh, DType::kF32, want.data(), T + 3,
              DType::kF32, false, 0.25f);
  GemmStrided(false, true, T, T, dh, qkv.data() + 8, ld, qkv.data() + 40, ld, DType::kBF16,
              got.data(), T + 3, DType::kF32, false, 0.25f);
  ExpectBitEqual(got, want, "strided");
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = T; j < T + 3; ++j) ASSERT_EQ(got[t * (T + 3) + j], 7.0f);
  }
}

TEST_F(GemmPathTest, WidenedLinearLayersRoundActivationsLikeTheNativePath) {
  SetBf16GemmPath(Bf16GemmPath::kWidened);
  const int64_t m = 37, n = 29, k = 70;
  auto x = Random(m * k, 5);
  auto dy = Random(m * n, 6);
  auto w = ToBf16(Random(n * k, 7));
  const auto xr = RoundedToBf16(x), dyr = RoundedToBf16(dy), wf = Widened(w);
  std::vector<float> want(m * n), got(m * n, NAN);
  LinearForward(xr.data(), wf.data(), DType::kF32, want.data(), m, n, k);
  LinearForward(x.data(), w.data(), DType::kBF16, got.data(), m, n, k);
  ExpectBitEqual(got, want, "forward");

  std::vector<float> dxw(m * k, 1.5f), dxg = dxw;
  LinearBackwardData(dyr.data(), wf.data(), DType::kF32, dxw.data(), m, n, k, true);
  LinearBackwardData(dy.data(), w.data(), DType::kBF16, dxg.data(), m, n, k, true);
  ExpectBitEqual(dxg, dxw, "backward data");

  std::vector<float> dww(n * k), dwg(n * k, NAN);
  LinearBackwardWeight(dyr.data(), xr.data(), DType::kF32, dww.data(), DType::kF32, m, n, k, false);
  LinearBackwardWeight(dy.data(), x.data(), DType::kBF16, dwg.data(), DType::kF32, m, n, k, false);
  ExpectBitEqual(dwg, dww, "backward weight");
}

TEST_F(GemmPathTest, NativeAgreesWithWidenedToAccumulationOrder) {
  if (!NativeBf16GemmSupported()) {
    GTEST_SKIP() << "no native bf16 matmul on this CPU (" << CpuIsaName() << ")";
  }
  const int64_t m = 64, n = 96, k = 200;
  auto x = Random(m * k, 8);
  auto w = ToBf16(Random(n * k, 9));
  std::vector<float> native(m * n), widened(m * n);
  SetBf16GemmPath(Bf16GemmPath::kNative);
  LinearForward(x.data(), w.data(), DType::kBF16, native.data(), m, n, k);
  SetBf16GemmPath(Bf16GemmPath::kWidened);
  LinearForward(x.data(), w.data(), DType::kBF16, widened.data(), m, n, k);
  for (int64_t i = 0; i < m * n; ++i) {
    ASSERT_NEAR(native[i], widened[i], 1e-4 * (1 + std::abs(widened[i]))) << "element " << i;
  }
}

TEST_F(GemmPathTest, ProbeChoiceAndExpectedPath) {
  // The probe's choice, checked against the ISA oneDNN reports (not against the probe
  // itself): native exactly where the CPU has bf16 instructions (AVX512-BF16, AMX), so an
  // AMX machine whose probe wrongly said "no" fails here.
  const Bf16GemmPath probed = ParseBf16GemmPath("auto");
  const std::string isa = CpuIsaName();
  const bool bf16_isa = isa == "avx512_core_bf16" || isa == "avx512_core_amx";
  EXPECT_EQ(probed == Bf16GemmPath::kNative, bf16_isa) << "ISA " << isa;
  if (bf16_isa) {
    EXPECT_TRUE(NativeBf16GemmSupported()) << "ISA " << isa;
  }
  if (const char* expect = std::getenv("SSHSDP_EXPECT_BF16_PATH")) {
    EXPECT_EQ(Bf16GemmPathName(probed), std::string(expect))
        << "ISA " << CpuIsaName() << ", DNNL_MAX_CPU_ISA="
        << (std::getenv("DNNL_MAX_CPU_ISA") ? std::getenv("DNNL_MAX_CPU_ISA") : "(unset)");
  }
  if (const char* forced = std::getenv("SSHSDP_BF16_GEMM"); forced && *forced) {
    EXPECT_EQ(saved_, ParseBf16GemmPath(forced)) << "SSHSDP_BF16_GEMM=" << forced << " ignored";
  }
  const std::string desc = GemmPathDescription(DType::kBF16);
  EXPECT_NE(desc.find(saved_ == Bf16GemmPath::kNative ? "bf16 native" : "bf16 widened to fp32"),
            std::string::npos)
      << desc;
  EXPECT_NE(GemmPathDescription(DType::kF32)
                .find(fmt::format("fp32 ({} ", GemmProviderLabel(ActiveGemmProvider()))),
            std::string::npos);
  if (const char* forced = std::getenv("SSHSDP_GEMM"); forced && *forced) {
    EXPECT_EQ(GemmProviderName(ActiveGemmProvider()), std::string_view(forced));
  }
  EXPECT_FALSE(CpuIsaName().empty());
}

TEST_F(GemmPathTest, BadOrImpossibleRequestsAreRefusedWithTheWayOut) {
  try {
    ParseBf16GemmPath("amx");
    FAIL() << "accepted 'amx'";
  } catch (const NumericsError& e) {
    EXPECT_NE(std::string(e.what()).find("auto, native, widened"), std::string::npos) << e.what();
  }
  if (NativeBf16GemmSupported()) {
    EXPECT_EQ(ParseBf16GemmPath("native"), Bf16GemmPath::kNative);
    return;
  }
  try {
    SetBf16GemmPath(Bf16GemmPath::kNative);
    FAIL() << "native accepted without a native bf16 matmul";
  } catch (const NumericsError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(CpuIsaName()), std::string::npos) << what;
    EXPECT_NE(what.find("AVX512-BF16 or AMX"), std::string::npos) << what;
    EXPECT_NE(what.find("widened"), std::string::npos) << what;
  }
  EXPECT_EQ(ActiveBf16GemmPath(), Bf16GemmPath::kWidened);  // a refused request changes nothing
}

TEST(GemmPeak, ProbeRunsTheActivePathAndCountsFlops) {
  GemmPeakProbe probe(DType::kBF16, 64);
  probe.Run(2);
  EXPECT_EQ(probe.FlopsPerProduct(), 2.0 * 64 * 64 * 64);
  EXPECT_THROW(GemmPeakProbe(DType::kE4M3, 64), NumericsError);
  EXPECT_THROW(GemmPeakProbe(DType::kF32, 0), NumericsError);
}

}  // namespace
}  // namespace sshsdp::kernels
