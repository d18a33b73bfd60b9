// The bf16 causal attention (attention.h) on both of its paths — the AVX512-BF16 kernel where
// the CPU has it (skipped elsewhere) and the widened path everywhere — against a
// double-precision oracle of the same roundings (Q, K, V, dO, P, dS rounded to bf16, all else
// exact). The two paths and the oracle differ only in how fp32 sums are ordered, which can
// move a rounded probability by one bf16 step: each element is checked against a bound of
// 2^-7 (one bf16 step) times the sum of its terms' magnitudes, plus a 1e-5 share for the fp32
// sums; a dropped or doubled key on these short rows is several times that bound. Also: every
// output written, thread counts give the same bits, scratch too small or odd blocks refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/amx_pairs.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/parallel.h"
#include "sshsdp/kernels/testing/gemm_data.h"
#include "sshsdp/numerics/dtype.h"

namespace sshsdp::kernels {
namespace {

struct Shape {
  int B, T, H, dh, block;
};

double R(float x) { return RoundToBf16(x); }

// Expected values and per-element error bounds.
struct Oracle {
  std::vector<double> out, out_tol, out_tight, lse, dqkv, dqkv_tol, dqkv_tight;
};

// Forward from qkv; backward from dout and the kernel's own `out` (as the models run it).
Oracle Expected(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
                const std::vector<float>& out) {
  const int64_t d = int64_t{s.H} * s.dh, d3 = 3 * d, T = s.T;
  const double scale = s.dh > 0 ? 1.0 / std::sqrt(static_cast<float>(s.dh)) : 1.0;
  const double step = std::ldexp(1.0, -7), sums = 1e-5;
  Oracle o;
  o.out.assign(s.B * T * d, 0.0);
  o.out_tol = o.out_tight = o.out;
  o.lse.assign(int64_t{s.B} * s.H * T, 0.0);
  o.dqkv.assign(s.B * T * d3, 0.0);
  o.dqkv_tol = o.dqkv_tight = o.dqkv;
  std::vector<double> P(T * T), dS(T * T), dSerr(T * T);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      auto q = [&](int64_t t, int64_t c) { return qkv[(b * T + t) * d3 + h * s.dh + c]; };
      auto k = [&](int64_t t, int64_t c) { return qkv[(b * T + t) * d3 + d + h * s.dh + c]; };
      auto v = [&](int64_t t, int64_t c) { return qkv[(b * T + t) * d3 + 2 * d + h * s.dh + c]; };
      auto g = [&](int64_t t, int64_t c) { return dout[(b * T + t) * d + h * s.dh + c]; };
      auto at = [&](int64_t t, int64_t c) { return (b * T + t) * d + h * s.dh + c; };
      auto at3 = [&](int64_t t, int64_t c) { return (b * T + t) * d3 + h * s.dh + c; };
      for (int64_t t = 0; t < T; ++t) {
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double x = 0.0;
          for (int c = 0; c < s.dh; ++c) x += R(q(t, c)) * R(k(u, c));
          P[t * T + u] = x * scale;
          mx = std::max(mx, x * scale);
        }
        double sum = 0.0;
        for (int64_t u = 0; u <= t; ++u) sum += std::exp(P[t * T + u] - mx);
        for (int64_t u = 0; u <= t; ++u) P[t * T + u] = std::exp(P[t * T + u] - mx) / sum;
        o.lse[(int64_t{b} * s.H + h) * T + t] = mx + std::log(sum);
        for (int c = 0; c < s.dh; ++c) {
          double x = 0.0, mag = 0.0;
          for (int64_t u = 0; u <= t; ++u) {
            x += R(static_cast<float>(P[t * T + u])) * R(v(u, c));
            mag += P[t * T + u] * std::abs(R(v(u, c)));
          }
          o.out[at(t, c)] = x;
          o.out_tol[at(t, c)] = (step + sums) * mag + 1e-30;
          o.out_tight[at(t, c)] = sums * mag + 1e-30;
        }
      }
      // Backward.
      for (int64_t t = 0; t < T; ++t) {
        double D = 0.0, Dmag = 0.0;
        for (int c = 0; c < s.dh; ++c) {
          D += double{g(t, c)} * out[at(t, c)];
          Dmag += std::abs(double{g(t, c)} * out[at(t, c)]);
        }
        for (int64_t u = 0; u <= t; ++u) {
          double dp = 0.0, mag = Dmag;
          for (int c = 0; c < s.dh; ++c) {
            dp += R(g(t, c)) * R(v(u, c));
            mag += std::abs(R(g(t, c)) * R(v(u, c)));
          }
          dS[t * T + u] = P[t * T + u] * (dp - D) * scale;
          dSerr[t * T + u] = P[t * T + u] * scale * sums * mag;
        }
      }
      for (int c = 0; c < s.dh; ++c) {
        for (int64_t t = 0; t < T; ++t) {  // dQ[t] = Σ_u dS[t, u] K[u]
          double x = 0.0, tol = 0.0, tight = 0.0;
          for (int64_t u = 0; u <= t; ++u) {
            const double ds = dS[t * T + u];
            x += R(static_cast<float>(ds)) * R(k(u, c));
            tol += (step * std::abs(ds) + dSerr[t * T + u]) * std::abs(R(k(u, c)));
            tight += (sums * std::abs(ds) + dSerr[t * T + u]) * std::abs(R(k(u, c)));
          }
          o.dqkv[at3(t, c)] = x;
          o.dqkv_tol[at3(t, c)] = tol + 1e-30;
          o.dqkv_tight[at3(t, c)] = tight + 1e-30;
        }
        for (int64_t u = 0; u < T; ++u) {  // dK[u] = Σ_t dS[t, u] Q[t], dV[u] = Σ_t P[t, u] dO[t]
          double xk = 0.0, tk = 0.0, gk = 0.0, xv = 0.0, mv = 0.0;
          for (int64_t t = u; t < T; ++t) {
            const double ds = dS[t * T + u], p = P[t * T + u];
            xk += R(static_cast<float>(ds)) * R(q(t, c));
            tk += (step * std::abs(ds) + dSerr[t * T + u]) * std::abs(R(q(t, c)));
            gk += (sums * std::abs(ds) + dSerr[t * T + u]) * std::abs(R(q(t, c)));
            xv += R(static_cast<float>(p)) * R(g(t, c));
            mv += p * std::abs(R(g(t, c)));
          }
          o.dqkv[at3(u, c) + d] = xk;
          o.dqkv_tol[at3(u, c) + d] = tk + 1e-30;
          o.dqkv_tight[at3(u, c) + d] = gk + 1e-30;
          o.dqkv[at3(u, c) + 2 * d] = xv;
          o.dqkv_tol[at3(u, c) + 2 * d] = (step + sums) * mv + 1e-30;
          o.dqkv_tight[at3(u, c) + 2 * d] = sums * mv + 1e-30;
        }
      }
    }
  }
  return o;
}

// Indices where |got − want| exceeds the bound (or got is not finite), as a message; empty when
// none.
std::string Outside(const char* what, const std::vector<float>& got,
                    const std::vector<double>& want, const std::vector<double>& tol) {
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= tol[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return "";
  return std::string(what) + ": " + std::to_string(bad) + " elements outside, first at " +
         std::to_string(first) + ": " + std::to_string(got[first]) + " vs " +
         std::to_string(want[first]) + " ± " + std::to_string(tol[first]);
}

// Share of elements outside the fp32-sums-only bound: a rounded probability or score
// gradient differs from the oracle's only where fp32 sums moved it across a rounding
// boundary, which is rare; skipping a rounding moves most elements past this bound.
double ShareOutside(const std::vector<float>& got, const std::vector<double>& want,
                    const std::vector<double>& tight) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += !(std::abs(got[i] - want[i]) <= tight[i]);
  return got.empty() ? 0.0 : static_cast<double>(bad) / static_cast<double>(got.size());
}

// The native kernel with VDPBF16PS products (kNative) or AMX tiles (kAmx), or the widened path.
enum class Path { kNative, kAmx, kWidened };

bool Available(Path p) {
  if (p == Path::kWidened) return true;
  const bool native = __builtin_cpu_supports("avx512bf16") != 0 && NativeBf16GemmSupported();
  return native && (p == Path::kNative || amx::Available());
}

std::string PathName(Path p) {
  return p == Path::kNative ? "native" : p == Path::kAmx ? "amx" : "widened";
}

// Forces the path for one test, restoring the process's on exit.
class PathScope {
 public:
  explicit PathScope(Path p)
      : saved_(ActiveBf16GemmPath()), products_(ActiveBf16AttentionProducts()) {
    SetBf16GemmPath(p == Path::kWidened ? Bf16GemmPath::kWidened : Bf16GemmPath::kNative);
    if (p != Path::kWidened) {
      SetBf16AttentionProducts(p == Path::kAmx ? Bf16AttentionProducts::kAmx
                                               : Bf16AttentionProducts::kAvx512Bf16);
    }
  }
  ~PathScope() {
    SetBf16GemmPath(saved_);
    SetBf16AttentionProducts(products_);
  }
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  Bf16GemmPath saved_;
  Bf16AttentionProducts products_;
};

struct Outputs {
  std::vector<float> out, lse, dqkv;
};

Outputs RunBf16(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
                int scratch_threads = -1) {
  const int64_t d = int64_t{s.H} * s.dh, BT = int64_t{s.B} * s.T;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> scratch(
      AttentionBf16ScratchFloats(s.B, s.T, s.H, s.dh, s.block, scratch_threads), nan);
  Outputs r{std::vector<float>(BT * d, nan), std::vector<float>(int64_t{s.B} * s.H * s.T, nan),
            std::vector<float>(BT * 3 * d, nan)};
  CausalAttentionForwardBf16(qkv.data(), r.out.data(), r.lse.data(), scratch.data(),
                             static_cast<int64_t>(scratch.size()), s.B, s.T, s.H, s.dh, s.block);
  CausalAttentionBackwardBf16(dout.data(), qkv.data(), r.out.data(), r.lse.data(), r.dqkv.data(),
                              scratch.data(), static_cast<int64_t>(scratch.size()), s.B, s.T, s.H,
                              s.dh, s.block);
  return r;
}

std::vector<float> Inputs(size_t n, uint64_t seed, float scale) {
  std::vector<float> x = testing::Random(n, seed);
  for (float& v : x) v *= scale;
  return x;
}

class AttentionBf16Test : public ::testing::TestWithParam<std::tuple<Path, Shape>> {
 protected:
  void SetUp() override {
    if (!Available(std::get<0>(GetParam()))) {
      GTEST_SKIP() << "this CPU has no AVX512-BF16 or AMX-BF16 for this path (the others are "
                      "tested instead)";
    }
  }
};

TEST_P(AttentionBf16Test, MatchesRoundedOracle) {
  const auto [path, s] = GetParam();
  PathScope scope(path);
  ASSERT_EQ(NativeBf16AttentionActive(), path != Path::kWidened);
  const int64_t d = int64_t{s.H} * s.dh, BT = int64_t{s.B} * s.T;
  const std::vector<float> qkv = Inputs(BT * 3 * d, 21, 1.5f);  // sharper rows than N(0, 1)
  const std::vector<float> dout = Inputs(BT * d, 22, 1.0f);
  const Outputs r = RunBf16(s, qkv, dout);
  const Oracle o = Expected(s, qkv, dout, r.out);
  EXPECT_EQ(Outside("out", r.out, o.out, o.out_tol), "");
  std::vector<double> lse_tol(o.lse.size(), 1e-4);
  EXPECT_EQ(Outside("lse", r.lse, o.lse, lse_tol), "");
  EXPECT_EQ(Outside("dqkv", r.dqkv, o.dqkv, o.dqkv_tol), "");
  EXPECT_LT(ShareOutside(r.out, o.out, o.out_tight), 0.05);
  EXPECT_LT(ShareOutside(r.dqkv, o.dqkv, o.dqkv_tight), 0.05);
}

INSTANTIATE_TEST_SUITE_P(
    OddShapes, AttentionBf16Test,
    ::testing::Combine(::testing::Values(Path::kNative, Path::kAmx, Path::kWidened),
                       ::testing::Values(Shape{1, 1, 1, 1, 64}, Shape{2, 5, 3, 7, 64},
                                         Shape{1, 67, 2, 33, 16}, Shape{3, 40, 4, 32, 8},
                                         Shape{1, 64, 2, 64, 64}, Shape{2, 19, 1, 16, 4},
                                         Shape{1, 90, 1, 8, 2}, Shape{2, 3, 2, 0, 64})),
    [](const auto& info) {
      const Shape s = std::get<1>(info.param);
      return PathName(std::get<0>(info.param)) + "_B" + std::to_string(s.B) + "_T" +
             std::to_string(s.T) + "_H" + std::to_string(s.H) + "_dh" + std::to_string(s.dh) +
             "_block" + std::to_string(s.block);
    });

// The native kernel computes each (sequence, head) plane whole on one worker: any thread
// count, and scratch sized for fewer threads than run, give the same bits.
TEST(AttentionBf16, NativeThreadCountsGiveSameBits) {
  if (!Available(Path::kNative)) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  const Shape s{3, 50, 3, 24, 16};
  const int64_t d = int64_t{s.H} * s.dh, BT = int64_t{s.B} * s.T;
  const std::vector<float> qkv = Inputs(BT * 3 * d, 31, 1.5f), dout = Inputs(BT * d, 32, 1.0f);
  for (const Path path : {Path::kNative, Path::kAmx}) {
    if (!Available(path)) continue;
    PathScope scope(path);
    const int saved = KernelThreads();
    SetKernelThreads(1);
    const Outputs one = RunBf16(s, qkv, dout);
    SetKernelThreads(3);
    const Outputs three = RunBf16(s, qkv, dout);
    const Outputs narrow = RunBf16(s, qkv, dout, /*scratch_threads=*/1);
    SetKernelThreads(saved);
    EXPECT_EQ(one.out, three.out) << PathName(path);
    EXPECT_EQ(one.dqkv, three.dqkv) << PathName(path);
    EXPECT_EQ(one.lse, three.lse) << PathName(path);
    EXPECT_EQ(one.out, narrow.out) << PathName(path);
    EXPECT_EQ(one.dqkv, narrow.dqkv) << PathName(path);
  }
}

// The products engine is chosen by the CPU (unless SSHSDP_BF16_ATTENTION_PRODUCTS says
// otherwise), forced by the setter (amx refused where the CPU has none), named in the header
// line, and is the one that runs: AMX products are counted (amx::Calls), VDPBF16PS ones not.
TEST(AttentionBf16, ProductsEngineIsChosenAndNamed) {
  const Bf16AttentionProducts saved = ActiveBf16AttentionProducts();
  const char* env = std::getenv("SSHSDP_BF16_ATTENTION_PRODUCTS");
  if (env == nullptr || std::string_view(env) == "auto") {
    EXPECT_EQ(saved,
              amx::Available() ? Bf16AttentionProducts::kAmx : Bf16AttentionProducts::kAvx512Bf16);
  }
  if (!amx::Available()) {
    EXPECT_THROW(SetBf16AttentionProducts(Bf16AttentionProducts::kAmx), NumericsError);
  }
  const Shape s{2, 40, 2, 16, 16};
  const int64_t d = int64_t{s.H} * s.dh, BT = int64_t{s.B} * s.T;
  const std::vector<float> qkv = Inputs(BT * 3 * d, 41, 1.0f), dout = Inputs(BT * d, 42, 1.0f);
  for (const Path path : {Path::kNative, Path::kAmx}) {
    if (!Available(path)) continue;
    PathScope scope(path);
    EXPECT_EQ(AttentionPathDescription(true),
              path == Path::kAmx ? "bf16 (AMX kernel)" : "bf16 (AVX512-BF16 kernel)");
    const int64_t before = amx::Calls();
    RunBf16(s, qkv, dout);
    // Per plane: 2 products per query block forward, 5 backward; 40 rows in blocks of 16.
    const int64_t planes = int64_t{s.B} * s.H, blocks = 3;
    EXPECT_EQ(amx::Calls() - before, path == Path::kAmx ? planes * blocks * 7 : 0)
        << PathName(path);
  }
  EXPECT_EQ(ActiveBf16AttentionProducts(), saved);
}

TEST(AttentionBf16, RefusesOddBlocksAndShortScratch) {
  EXPECT_THROW(AttentionBf16ScratchFloats(1, 8, 1, 4, 3), NumericsError);
  for (const Path path : {Path::kNative, Path::kAmx, Path::kWidened}) {
    if (!Available(path)) continue;
    PathScope scope(path);
    std::vector<float> qkv(8 * 12, 0.5f), out(8 * 4), lse(8), scratch(16);
    EXPECT_THROW(CausalAttentionForwardBf16(qkv.data(), out.data(), lse.data(), scratch.data(),
                                            static_cast<int64_t>(scratch.size()), 1, 8, 1, 4),
                 NumericsError);
    EXPECT_THROW(CausalAttentionForwardBf16(qkv.data(), out.data(), lse.data(), scratch.data(),
                                            static_cast<int64_t>(scratch.size()), 1, 8, 1, 4, 3),
                 NumericsError);
    std::vector<float> dqkv(qkv.size());
    EXPECT_THROW(CausalAttentionBackwardBf16(out.data(), qkv.data(), out.data(), lse.data(),
                                             dqkv.data(), scratch.data(),
                                             static_cast<int64_t>(scratch.size()), 1, 8, 1, 4),
                 NumericsError);
  }
}

// A NaN in one key reaches every query that sees it, on both paths, as it does in fp32: the
// rows before it stay finite, the rows from it on are NaN (not a finite e^-87 weight).
TEST(AttentionBf16, NanKeyReachesTheRowsThatSeeIt) {
  const Shape s{1, 40, 2, 16, 16};
  const int64_t d = int64_t{s.H} * s.dh, BT = int64_t{s.B} * s.T, key = 17;
  std::vector<float> qkv = Inputs(BT * 3 * d, 51, 1.0f);
  qkv[key * 3 * d + d + 3] = std::numeric_limits<float>::quiet_NaN();  // K[key], head 0
  const std::vector<float> dout = Inputs(BT * d, 52, 1.0f);
  for (const Path path : {Path::kNative, Path::kAmx, Path::kWidened}) {
    if (!Available(path)) continue;
    PathScope scope(path);
    const Outputs r = RunBf16(s, qkv, dout);
    for (int64_t t = 0; t < s.T; ++t) {
      for (int64_t c = 0; c < s.dh; ++c) {
        EXPECT_EQ(std::isnan(r.out[t * d + c]), t >= key) << PathName(path) << " row " << t;
        EXPECT_TRUE(std::isfinite(r.out[t * d + s.dh + c]));  // head 1 untouched
      }
    }
  }
}

// Against the fp32 kernel: the roundings move the result by bf16 steps, not more.
TEST(AttentionBf16, CloseToFp32Attention) {
  const Shape s{2, 48, 2, 32, 16};
  const int64_t d = int64_t{s.H} * s.dh, BT = int64_t{s.B} * s.T;
  const std::vector<float> qkv = Inputs(BT * 3 * d, 41, 1.0f), dout = Inputs(BT * d, 42, 1.0f);
  std::vector<float> scratch(AttentionScratchFloats(s.B, s.T, s.H, s.block));
  std::vector<float> out(BT * d), lse(int64_t{s.B} * s.H * s.T), dqkv(BT * 3 * d);
  CausalAttentionForward(qkv.data(), out.data(), lse.data(), scratch.data(), s.B, s.T, s.H, s.dh,
                         s.block);
  CausalAttentionBackward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                          scratch.data(), s.B, s.T, s.H, s.dh, s.block);
  const Outputs r = RunBf16(s, qkv, dout);
  double worst_out = 0.0, worst_grad = 0.0, max_out = 0.0, max_grad = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    worst_out = std::max(worst_out, std::abs(double{r.out[i]} - out[i]));
    max_out = std::max(max_out, std::abs(double{out[i]}));
  }
  for (size_t i = 0; i < dqkv.size(); ++i) {
    worst_grad = std::max(worst_grad, std::abs(double{r.dqkv[i]} - dqkv[i]));
    max_grad = std::max(max_grad, std::abs(double{dqkv[i]}));
  }
  EXPECT_LT(worst_out / max_out, 2e-2);
  EXPECT_LT(worst_grad / max_grad, 3e-2);
  EXPECT_GT(worst_out, 0.0);  // the roundings happened
}

}  // namespace
}  // namespace sshsdp::kernels
