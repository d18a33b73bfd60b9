// Every op of a device backend (backend.h) against the CPU functions the engine and the
// models run (the models' layers are a fixture here: the fp32 embedding kernels are checked
// against them), on the same inputs: casts, stochastic rounding, AdamW, Muon's elementwise
// stages and fill bit for bit; the sum of squares to 1e-12 relative; Newton–Schulz to 1e-4 of
// the largest entry. Sizes include 0, odd sizes and sizes that start and end inside a Philox
// block; inputs include NaN, ±Inf, subnormals and values that round past the bf16 maximum.
// Events hand a stream's results to another thread and stream (and the guarded test backend's
// model of them is checked here too).
//
//   backend_test --backend=cpu     # the CPU backend (runs everywhere)
//   backend_test --backend=cuda    # exit 77 (ctest: skipped) without CUDA or a GPU
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/testing/backend_test_util.h"
#include "sshsdp/backend/testing/guarded_backend.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/layer_kernels.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/moe_kernels.h"

#ifdef SSHSDP_CUDA_EMULATION
namespace sshsdp::emu {
int64_t EventsCreated();  // testing/cuda_emulation.h (a header for kernel files)
}  // namespace sshsdp::emu
#endif

namespace sshsdp {
std::string g_backend = "cpu";  // NOLINT: set once by main (backend_test_util.h)
namespace {

const size_t kSizes[] = {0, 1, 7, 8, 9, 1000, 4099, (size_t{1} << 18) + 3};
// Past every grid-stride limit (4096 blocks of 256 threads; 8 elements a thread for SR).
const size_t kLarge = (size_t{1} << 23) + 5;

TEST_F(BackendTest, CastF32ToBf16BitForBit) {
  std::vector<size_t> sizes(std::begin(kSizes), std::end(kSizes));
  sizes.push_back(kLarge);
  for (size_t n : sizes) {
    const std::vector<float> x = Values(n, 11 + static_cast<uint32_t>(n));
    std::vector<bf16> want(n);
    FloatToBf16(x.data(), want.data(), n);
    Buffer<float> dx(*b_, x);
    Buffer<bf16> dy(*b_, n);
    b_->CastF32ToBf16(dx.get(), dy.get(), static_cast<int64_t>(n));
    EXPECT_EQ(FirstMismatch(dy.Read(), want, &x), "") << b_->name() << " n=" << n;
  }
}

TEST_F(BackendTest, CastBf16ToF32EveryPattern) {
  std::vector<bf16> x(65536);
  for (uint32_t i = 0; i < 65536; ++i) x[i].bits = static_cast<uint16_t>(i);
  std::vector<float> want(x.size());
  Bf16ToFloat(x.data(), want.data(), x.size());
  Buffer<bf16> dx(*b_, x);
  Buffer<float> dy(*b_, x.size());
  b_->CastBf16ToF32(dx.get(), dy.get(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(FirstMismatch(dy.Read(), want), "") << b_->name();
}

TEST_F(BackendTest, AdamWBitForBitOverSpans) {
  const size_t sizes[] = {0, 1, 4099, 33};
  const float decays[] = {0.1f, 0.0f, 0.1f, 0.05f};
  AdamWConfig cfg{.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
  for (int64_t step : {int64_t{1}, int64_t{7}}) {
    std::vector<std::vector<float>> w, g, m, v;
    for (size_t i = 0; i < std::size(sizes); ++i) {
      const uint32_t s = static_cast<uint32_t>(i * 4 + step);
      std::vector<float> vv = Values(sizes[i], s + 3);
      for (float& x : vv) x = std::isfinite(x) ? std::fabs(std::fmod(x, 4.0f)) : 1.0f;
      auto finite = [](std::vector<float> a) {
        for (float& x : a) x = std::isfinite(x) ? std::fmod(x, 8.0f) : 0.5f;
        return a;
      };
      w.push_back(finite(Values(sizes[i], s)));
      g.push_back(finite(Values(sizes[i], s + 1)));
      m.push_back(finite(Values(sizes[i], s + 2)));
      v.push_back(vv);
    }
    std::vector<std::unique_ptr<Buffer<float>>> dev;
    std::vector<AdamWSpan> host_spans, dev_spans;
    for (size_t i = 0; i < std::size(sizes); ++i) {
      for (auto* a : {&w[i], &g[i], &m[i], &v[i]})
        dev.push_back(std::make_unique<Buffer<float>>(*b_, *a));
      const size_t k = dev.size() - 4;
      dev_spans.push_back({dev[k]->get(), dev[k + 1]->get(), dev[k + 2]->get(), dev[k + 3]->get(),
                           static_cast<int64_t>(sizes[i]), decays[i]});
      host_spans.push_back({w[i].data(), g[i].data(), m[i].data(), v[i].data(),
                            static_cast<int64_t>(sizes[i]), decays[i]});
    }
    b_->AdamW(dev_spans.data(), static_cast<int>(dev_spans.size()), cfg, step, 0.25f);
    AdamWStep(host_spans, cfg, step, 0.25f);
    for (size_t i = 0; i < std::size(sizes); ++i) {
      const std::vector<float>* want[] = {&w[i], &g[i], &m[i], &v[i]};
      for (int f = 0; f < 4; ++f) {
        EXPECT_EQ(FirstMismatch(dev[i * 4 + f]->Read(), *want[f]), "")
            << b_->name() << " step " << step << " span " << i << " field "
            << "wgmv"[f];
      }
    }
  }
  EXPECT_THROW(b_->AdamW(nullptr, 0, cfg, 0, 1.0f), PlanError);
}

// Muon's elementwise stages against their formulas written out here (update/muon.h), one
// element at a time: sizes cross the host loop's 256-element tiles; u fp32 and bf16.
TEST_F(BackendTest, MuonStagesBitForBit) {
  const size_t sizes[] = {0, 1, 255, 256, 257, 4099};
  for (size_t n : sizes) {
    for (DType udt : {DType::kF32, DType::kBF16}) {
      for (bool nesterov : {true, false}) {
        auto finite = [](std::vector<float> a) {
          for (float& x : a) x = std::isfinite(x) ? std::fmod(x, 8.0f) : 0.5f;
          return a;
        };
        const uint32_t seed = static_cast<uint32_t>(n * 8 + nesterov * 2 + (udt == DType::kF32));
        std::vector<float> g = finite(Values(n, seed)), m = finite(Values(n, seed + 1));
        std::vector<float> w = finite(Values(n, seed + 2)), v = finite(Values(n, seed + 3));
        const float mu = 0.95f, gs = 0.3f, lr = 0.02f, wd = 0.1f;
        std::vector<float> want_m(n), want_u(n), want_w(n);
        std::vector<bf16> want_u16(n);
        for (size_t i = 0; i < n; ++i) {
          const float gi = gs * g[i];
          const float mi = mu * m[i] + gi;
          want_m[i] = mi;
          want_u[i] = nesterov ? gi + mu * mi : mi;
          want_u16[i] = FloatToBf16(want_u[i]);
          const float decay = 1.0f - lr * wd;
          want_w[i] = w[i] * decay - lr * v[i];
        }
        Buffer<float> dg(*b_, g), dm(*b_, m), dw(*b_, w), dv(*b_, v), du32(*b_, n);
        Buffer<bf16> du16(*b_, n);
        void* du = udt == DType::kF32 ? static_cast<void*>(du32.get()) : du16.get();
        const auto N = static_cast<int64_t>(n);
        b_->MuonMomentum(dg.get(), dm.get(), du, udt, N, mu, nesterov, gs);
        b_->MuonWeightUpdate(dw.get(), dv.get(), N, lr, wd);
        const std::string what =
            fmt::format("{} n={} u={} nesterov={}", b_->name(), n, DTypeName(udt), nesterov);
        EXPECT_EQ(FirstMismatch(dm.Read(), want_m), "") << what << " m";
        EXPECT_EQ(FirstMismatch(dg.Read(), g), "") << what << " grad (read only)";
        if (udt == DType::kF32)
          EXPECT_EQ(FirstMismatch(du32.Read(), want_u), "") << what << " u";
        else
          EXPECT_EQ(FirstMismatch(du16.Read(), want_u16), "") << what << " u";
        EXPECT_EQ(FirstMismatch(dw.Read(), want_w), "") << what << " w";
      }
    }
  }
  EXPECT_THROW(b_->MuonMomentum(nullptr, nullptr, nullptr, DType::kF32, -1, 0.9f, true, 1.0f),
               NumericsError);
  EXPECT_THROW(b_->MuonMomentum(nullptr, nullptr, nullptr, DType::kE4M3, 4, 0.9f, true, 1.0f),
               NumericsError);
  EXPECT_THROW(b_->MuonWeightUpdate(nullptr, nullptr, -1, 0.1f, 0.0f), NumericsError);
}

TEST_F(BackendTest, MxQuantizeWeightBitForBit) {
  struct Shape {
    int64_t rows, cols;
  };
  const MxOptions opts[] = {{DType::kE4M3, MxScaleRule::kCeil},
                            {DType::kE4M3, MxScaleRule::kOcpFloor},
                            {DType::kE5M2, MxScaleRule::kCeil},
                            {DType::kE5M2, MxScaleRule::kOcpFloor}};
  for (const Shape& sh : {Shape{1, 1}, Shape{33, 70}, Shape{64, 64}, Shape{100, 33}, Shape{0, 5},
                          Shape{5, 0}, Shape{257, 130}}) {
    const size_t n = static_cast<size_t>(sh.rows * sh.cols);
    const size_t ns = static_cast<size_t>(MxWeightScaleCount(sh.rows, sh.cols));
    // Values spread over many binades (specials in some blocks: NaN / Inf blocks get the NaN
    // scale), and a whole block of zeros.
    // Finite values with a magnitude per 32x32 block from 2^-140 (subnormal scales) to 2^120,
    // a few rounding ties and saturating values, a zero block, and NaN / Inf in some blocks.
    std::vector<float> w = Normal(n, static_cast<uint32_t>(sh.rows * 7 + sh.cols));
    for (int64_t r = 0; r < sh.rows; ++r)
      for (int64_t c = 0; c < sh.cols; ++c) {
        const int64_t blk = (r / 32) * 7 + c / 32;
        float& x = w[static_cast<size_t>(r * sh.cols + c)];
        x = blk == 1 ? 0.0f : std::ldexp(x, static_cast<int>((blk * 37) % 260) - 140);
        if (blk == 2 && c % 32 == 0) x = r % 2 ? 464.0f : 61440.0f;  // E4M3 / E5M2 ties
        if (blk == 3 && r % 32 == 5 && c % 32 == 7) x = (r / 32) % 2 ? NAN : INFINITY;
      }
    for (const MxOptions& opt : opts) {
      std::vector<uint8_t> want_q(n), want_s(ns);
      MxQuantizeWeight(w.data(), sh.rows, sh.cols, want_q.data(), want_s.data(), opt);
      Buffer<float> dw(*b_, w);
      Buffer<uint8_t> dq(*b_, n), ds(*b_, ns);
      b_->MxQuantizeWeight(dw.get(), sh.rows, sh.cols, dq.get(), ds.get(), opt);
      EXPECT_EQ(FirstMismatch(dq.Read(), want_q), "")
          << b_->name() << " codes [" << sh.rows << "x" << sh.cols << "] elem "
          << DTypeName(opt.elem) << " rule " << static_cast<int>(opt.rule);
      EXPECT_EQ(FirstMismatch(ds.Read(), want_s), "")
          << b_->name() << " scales [" << sh.rows << "x" << sh.cols << "]";
    }
  }
  EXPECT_THROW(b_->MxQuantizeWeight(nullptr, 2, 2, nullptr, nullptr, {DType::kF32}), NumericsError);
  EXPECT_THROW(b_->MxQuantizeWeight(nullptr, -1, 2, nullptr, nullptr, {}), NumericsError);
}

// Per-row scales (Tw's row-major layout, what the engine on a GPU dequantizes its MXFP8 runtime
// weights from): every code under every scale code, 0 (2^-127, subnormal results) and 0xFF
// (NaN) included, against numerics/mx.h's MxDequantizeActivation.
TEST_F(BackendTest, MxDequantizeRowsBitForBit) {
  for (DType elem : {DType::kE4M3, DType::kE5M2})
    for (int64_t rows : {0, 1, 3, 256})
      for (int64_t cols : {0, 1, 33, 256}) {
        const size_t n = static_cast<size_t>(rows * cols);
        const size_t ns = static_cast<size_t>(rows * MxBlocks(cols));
        std::vector<uint8_t> q(n), s(ns);
        for (size_t i = 0; i < n; ++i) q[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
        for (size_t i = 0; i < ns; ++i) s[i] = static_cast<uint8_t>((i * 101 + 3) % 256);
        if (ns > 1) s[0] = 0, s[1] = 0xFF;
        std::vector<float> want(n);
        MxDequantizeActivation(q.data(), s.data(), rows, cols, want.data(), {elem});
        Buffer<uint8_t> dq(*b_, q), ds(*b_, s);
        Buffer<float> out(*b_, n);
        b_->MxDequantizeRows(dq.get(), ds.get(), rows, cols, out.get(), {elem});
        EXPECT_EQ(FirstMismatch(out.Read(), want, nullptr, /*nan_equal=*/true), "")
            << b_->name() << " " << DTypeName(elem) << " [" << rows << "x" << cols << "]";
        // In one pass to bf16: the bf16 rounding of those values.
        std::vector<bf16> want16(n);
        FloatToBf16(want.data(), want16.data(), n);
        Buffer<bf16> out16(*b_, n);
        b_->MxDequantizeRowsBf16(dq.get(), ds.get(), rows, cols, out16.get(), {elem});
        const std::vector<bf16> got16 = out16.Read();
        std::vector<float> got_w(n), want_w(n);  // widened (exact): NaNs compare as NaNs
        Bf16ToFloat(got16.data(), got_w.data(), n);
        Bf16ToFloat(want16.data(), want_w.data(), n);
        EXPECT_EQ(FirstMismatch(got_w, want_w, nullptr, /*nan_equal=*/true), "")
            << b_->name() << " bf16 " << DTypeName(elem) << " [" << rows << "x" << cols << "]";
      }
  EXPECT_THROW(b_->MxDequantizeRows(nullptr, nullptr, 2, 2, nullptr, {DType::kF32}), NumericsError);
  EXPECT_THROW(b_->MxDequantizeRows(nullptr, nullptr, -1, 2, nullptr, {}), NumericsError);
  EXPECT_THROW(b_->MxDequantizeRowsBf16(nullptr, nullptr, -1, 2, nullptr, {}), NumericsError);
}

// ---- The reference GPT's layer ops: against kernels/layer_kernels.h and kernels/matmul.h,
// the CPU functions every backend is held to. ----

TEST_F(BackendTest, RmsNormForwardAndBackward) {
  for (int64_t rows : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}}) {
    for (int d : {1, 33, 256, 1000}) {
      const size_t n = static_cast<size_t>(rows * d);
      const auto x = Normal(n, 1), g = Normal(d, 2), dy = Normal(n, 3), dx0 = Normal(n, 4);
      std::vector<float> y(n), rstd(rows), dx = dx0, dg(d);
      const float eps = d % 2 ? 1e-6f : kernels::kRmsEps;  // Qwen3's and the GPT's
      kernels::RmsNormForward(x.data(), g.data(), y.data(), rstd.data(), rows, d, eps);
      Buffer<float> bx(*b_, x), bg(*b_, g), by(*b_, n), br(*b_, rows), bdy(*b_, dy);
      b_->RmsNormForward(bx.get(), bg.get(), by.get(), br.get(), rows, d, eps);
      const std::string at = fmt::format("{} rows={} d={}", b_->name(), rows, d);
      EXPECT_EQ(FirstOutside(by.Read(), y, 1e-6f, 1e-5f), "") << at << " y";
      EXPECT_EQ(FirstOutside(br.Read(), rstd, 0.0f, 1e-5f), "") << at << " rstd";
      for (bool acc : {false, true}) {
        dx = dx0;
        kernels::RmsNormBackward(dy.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(),
                                 rows, d, acc);
        Buffer<float> bdx(*b_, dx0), bdg(*b_, Values(d, 9));
        b_->RmsNormBackward(bdy.get(), bx.get(), bg.get(), br.get(), bdx.get(), bdg.get(), rows, d,
                            acc);
        EXPECT_EQ(FirstOutside(bdx.Read(), dx, 1e-5f, 1e-4f), "") << at << " dx acc=" << acc;
        EXPECT_EQ(FirstOutside(bdg.Read(), dg, 1e-4f, 1e-4f), "") << at << " dg acc=" << acc;
      }
    }
  }
  EXPECT_THROW(b_->RmsNormForward(nullptr, nullptr, nullptr, nullptr, 1, 0, kernels::kRmsEps),
               NumericsError);
}

TEST_F(BackendTest, ActivationsForwardAndBackward) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, (size_t{1} << 16) + 7}) {
    std::vector<float> x = Normal(n, 5, 4.0f), h3 = Normal(n, 6), da = Normal(n, 7);
    if (n > 10) x[3] = 40.0f, x[4] = -40.0f, x[5] = 0.0f;  // saturated and zero
    const std::string at = fmt::format("{} n={}", b_->name(), n);
    // GELU (tanh): the CPU's polynomial e^x and a GPU's expf differ in the last bits.
    std::vector<float> y(n), dy = da;
    kernels::GeluForward(x.data(), y.data(), static_cast<int64_t>(n));
    kernels::GeluBackwardInPlace(x.data(), dy.data(), static_cast<int64_t>(n));
    Buffer<float> bx(*b_, x), by(*b_, n), bdy(*b_, da), bh3(*b_, h3), bda(*b_, da);
    b_->GeluForward(bx.get(), by.get(), static_cast<int64_t>(n));
    b_->GeluBackwardInPlace(bx.get(), bdy.get(), static_cast<int64_t>(n));
    EXPECT_EQ(FirstOutside(by.Read(), y, 2e-6f, 2e-6f), "") << at << " gelu";
    EXPECT_EQ(FirstOutside(bdy.Read(), dy, 5e-6f, 2e-6f), "") << at << " gelu'";
    // SwiGLU, with da aliasing dh1 as the experts' backward runs it.
    std::vector<float> a(n), dh1 = da, dh3(n);
    kernels::SwigluForward(x.data(), h3.data(), a.data(), static_cast<int64_t>(n));
    kernels::SwigluBackward(x.data(), h3.data(), dh1.data(), dh1.data(), dh3.data(),
                            static_cast<int64_t>(n));
    Buffer<float> ba(*b_, n), bdh3(*b_, n);
    b_->SwigluForward(bx.get(), bh3.get(), ba.get(), static_cast<int64_t>(n));
    b_->SwigluBackward(bx.get(), bh3.get(), bda.get(), bda.get(), bdh3.get(),
                       static_cast<int64_t>(n));
    EXPECT_EQ(FirstOutside(ba.Read(), a, 2e-6f, 2e-6f), "") << at << " swiglu";
    EXPECT_EQ(FirstOutside(bda.Read(), dh1, 4e-6f, 4e-6f), "") << at << " swiglu dh1";
    EXPECT_EQ(FirstOutside(bdh3.Read(), dh3, 2e-6f, 2e-6f), "") << at << " swiglu dh3";
  }
}

TEST_F(BackendTest, SoftmaxCrossEntropyForwardAndBackward) {
  struct Shape {
    int64_t rows, V, ld;
  };
  for (const Shape& sh : {Shape{1, 1, 1}, Shape{5, 7, 20}, Shape{64, 300, 300},
                          Shape{3, 1000, 1024}, Shape{0, 4, 4}}) {
    const size_t n = static_cast<size_t>(sh.rows * sh.ld);
    std::vector<float> logits = Normal(n, 8, 3.0f);
    std::vector<int32_t> targets(static_cast<size_t>(sh.rows));
    for (int64_t r = 0; r < sh.rows; ++r) targets[r] = static_cast<int32_t>((r * 37) % sh.V);
    std::vector<float> probs = logits, losses(sh.rows);
    const double want = kernels::SoftmaxCrossEntropyForward(probs.data(), targets.data(),
                                                            losses.data(), sh.rows, sh.V, sh.ld);
    Buffer<float> bl(*b_, logits), bloss(*b_, static_cast<size_t>(sh.rows));
    Buffer<int32_t> bt(*b_, targets);
    Buffer<double> btotal(*b_, std::vector<double>{-7.0});  // overwritten, also by an empty sum
    b_->SoftmaxCrossEntropyForward(bl.get(), bt.get(), bloss.get(), sh.rows, sh.V, sh.ld,
                                   btotal.get());
    const double got = btotal.Read()[0];
    const std::string at = fmt::format("{} rows={} V={} ld={}", b_->name(), sh.rows, sh.V, sh.ld);
    EXPECT_NEAR(got, want, 1e-6 * (1.0 + std::fabs(want))) << at;
    EXPECT_EQ(FirstOutside(bl.Read(), probs, 1e-7f, 1e-5f), "") << at << " probs";
    EXPECT_EQ(FirstOutside(bloss.Read(), losses, 1e-5f, 1e-6f), "") << at << " losses";
    // Backward from the same probabilities: the same two operations per element, bit for bit.
    std::vector<float> dl(n);
    kernels::SoftmaxCrossEntropyBackward(probs.data(), targets.data(), dl.data(), sh.rows, sh.ld,
                                         0.125f);
    Buffer<float> bp(*b_, probs), bdl(*b_, Values(n, 2));
    b_->SoftmaxCrossEntropyBackward(bp.get(), bt.get(), bdl.get(), sh.rows, sh.ld, 0.125f);
    EXPECT_EQ(FirstMismatch(bdl.Read(), dl), "") << at << " dlogits";
  }
  EXPECT_THROW(b_->SoftmaxCrossEntropyForward(nullptr, nullptr, nullptr, 1, 5, 4, nullptr),
               NumericsError);
  EXPECT_THROW(b_->SoftmaxCrossEntropyForward(nullptr, nullptr, nullptr, 0, 4, 4, nullptr),
               NumericsError);
}

TEST_F(BackendTest, GemmEveryTransposeAndAccumulate) {
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape& sh : {Shape{1, 1, 1}, Shape{7, 33, 5}, Shape{64, 96, 128}, Shape{130, 3, 257},
                          Shape{0, 4, 4}, Shape{4, 0, 4}, Shape{4, 5, 0}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      if (sh.k == 0 && t > 0) continue;
      const auto a = Normal(static_cast<size_t>(sh.m * sh.k), 10);
      const auto b = Normal(static_cast<size_t>(sh.k * sh.n), 11);
      const auto c0 = Normal(static_cast<size_t>(sh.m * sh.n), 12);
      for (bool acc : {false, true}) {
        std::vector<float> c = c0;
        kernels::Gemm(ta, tb, sh.m, sh.n, sh.k, a.data(), b.data(), DType::kF32, c.data(),
                      DType::kF32, acc);
        Buffer<float> ba(*b_, a), bb(*b_, b), bc(*b_, c0);
        b_->Gemm(ta, tb, sh.m, sh.n, sh.k, ba.get(), bb.get(), bc.get(), acc);
        // fp32 sums of k products in another order: within k·2^-22 of the magnitudes.
        const float tol = 2.5e-7f * static_cast<float>(sh.k) * 16.0f;
        EXPECT_EQ(FirstOutside(bc.Read(), c, tol, 1e-5f), "")
            << b_->name() << " [" << sh.m << "x" << sh.n << "x" << sh.k << "] ta=" << ta
            << " tb=" << tb << " acc=" << acc;
      }
    }
  }
}

// bf16 operands (rounded from normal draws), fp32 accumulation: against a double-precision
// sum of the exact bf16 products (the CPU's native and widened paths and cuBLAS's tensor cores
// all accumulate in fp32, in different orders).
TEST_F(BackendTest, GemmBf16EveryTransposeAndAccumulate) {
  struct Shape {
    int64_t m, n, k;
  };
  auto round = [](const std::vector<float>& x) {
    std::vector<bf16> r;
    for (float v : x) r.push_back(FloatToBf16(v));
    return r;
  };
  for (const Shape& sh : {Shape{1, 1, 1}, Shape{7, 33, 5}, Shape{64, 96, 128}, Shape{130, 3, 257},
                          Shape{0, 4, 4}, Shape{4, 0, 4}, Shape{4, 5, 0}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const std::vector<bf16> a = round(Normal(static_cast<size_t>(sh.m * sh.k), 20));
      const std::vector<bf16> b = round(Normal(static_cast<size_t>(sh.k * sh.n), 21));
      const auto c0 = Normal(static_cast<size_t>(sh.m * sh.n), 22);
      for (bool acc : {false, true}) {
        std::vector<float> want(c0.size()), bound(c0.size());
        for (int64_t i = 0; i < sh.m; ++i)
          for (int64_t j = 0; j < sh.n; ++j) {
            double s = acc ? c0[i * sh.n + j] : 0.0, mag = std::fabs(s);
            for (int64_t p = 0; p < sh.k; ++p) {
              const double x = Bf16ToFloat(a[ta ? p * sh.m + i : i * sh.k + p]);
              const double y = Bf16ToFloat(b[tb ? j * sh.k + p : p * sh.n + j]);
              s += x * y;
              mag += std::fabs(x * y);
            }
            want[i * sh.n + j] = static_cast<float>(s);
            bound[i * sh.n + j] = static_cast<float>(mag);
          }
        Buffer<bf16> ba(*b_, a), bb(*b_, b);
        Buffer<float> bc(*b_, c0);
        b_->GemmBf16(ta, tb, sh.m, sh.n, sh.k, ba.get(), bb.get(), bc.get(), acc);
        const std::vector<float> got = bc.Read();
        // fp32 sums of k + 1 terms in any order: within (k + 1)·2^-23 of the summed magnitudes.
        std::string bad;
        for (size_t i = 0; i < got.size() && bad.empty(); ++i) {
          const double tol = (static_cast<double>(sh.k) + 1) * 0x1p-23 * bound[i] + 1e-30;
          if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol))
            bad = fmt::format("element {}: {} vs {} (tolerance {})", i, got[i], want[i], tol);
        }
        EXPECT_EQ(bad, "") << b_->name() << " [" << sh.m << "x" << sh.n << "x" << sh.k
                           << "] ta=" << ta << " tb=" << tb << " acc=" << acc;
      }
    }
  }
}

TEST_F(BackendTest, EmbeddingsBitForBit) {
  const int vocab = 50, seq = 9, d = 24;
  for (int B : {0, 1, 3}) {
    for (int T : {1, 9}) {
      const size_t n = static_cast<size_t>(B) * T * d;
      std::vector<int32_t> tokens(static_cast<size_t>(B) * T);
      for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = static_cast<int32_t>((i * 7) % 5);  // repeats
      const auto wte = Normal(static_cast<size_t>(vocab) * d, 1);
      const auto wpe = Normal(static_cast<size_t>(seq) * d, 2);
      const auto dx = Normal(n, 3);
      // The fp32 kernels equal the definition (their oracle: a row sum, a scatter-add in
      // token order) ...
      std::vector<float> out(n), ref(n);
      kernels::EmbeddingForwardF32(wte.data(), wpe.data(), tokens.data(), B, T, d, out.data());
      for (size_t r = 0; r < tokens.size(); ++r)
        for (int j = 0; j < d; ++j)
          ref[r * d + j] = wte[static_cast<size_t>(tokens[r]) * d + j] + wpe[(r % T) * d + j];
      EXPECT_EQ(FirstMismatch(out, ref), "") << "B=" << B << " T=" << T;
      // ... and every backend equals the fp32 kernels.
      Buffer<float> bwte(*b_, wte), bwpe(*b_, wpe), bout(*b_, n), bdx(*b_, dx);
      Buffer<int32_t> btok(*b_, tokens);
      b_->EmbeddingForward(bwte.get(), bwpe.get(), btok.get(), B, T, d, bout.get());
      EXPECT_EQ(FirstMismatch(bout.Read(), out), "") << b_->name() << " B=" << B << " T=" << T;
      for (bool acc : {false, true}) {
        std::vector<float> gte = Normal(wte.size(), 4), gpe = Normal(wpe.size(), 5);
        Buffer<float> bgte(*b_, gte), bgpe(*b_, gpe);
        std::vector<float> rte = gte, rpe = gpe;
        kernels::EmbeddingBackwardF32(dx.data(), tokens.data(), B, T, d, gte.data(), vocab,
                                      gpe.data(), seq, acc);
        if (!acc) {
          std::fill(rte.begin(), rte.end(), 0.0f);
          std::fill(rpe.begin(), rpe.end(), 0.0f);
        }
        for (size_t r = 0; r < tokens.size(); ++r)
          for (int j = 0; j < d; ++j) {
            rte[static_cast<size_t>(tokens[r]) * d + j] += dx[r * d + j];
            rpe[(r % T) * d + j] += dx[r * d + j];
          }
        EXPECT_EQ(FirstMismatch(gte, rte), "") << "dwte acc=" << acc;
        EXPECT_EQ(FirstMismatch(gpe, rpe), "") << "dwpe acc=" << acc;
        b_->EmbeddingBackward(bdx.get(), btok.get(), B, T, d, bgte.get(), vocab, bgpe.get(), seq,
                              acc);
        EXPECT_EQ(FirstMismatch(bgte.Read(), gte), "") << b_->name() << " dwte acc=" << acc;
        EXPECT_EQ(FirstMismatch(bgpe.Read(), gpe), "") << b_->name() << " dwpe acc=" << acc;
      }
    }
  }
}

TEST_F(BackendTest, AddBitForBit) {
  for (size_t n : kSizes) {
    const auto a = Normal(n, 1), b = Normal(n, 2);
    std::vector<float> y(n);
    for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    Buffer<float> ba(*b_, a), bb(*b_, b);
    b_->Add(ba.get(), bb.get(), ba.get(), static_cast<int64_t>(n));  // in place, as residuals
    EXPECT_EQ(FirstMismatch(ba.Read(), y), "") << b_->name() << " n=" << n;
  }
}

TEST_F(BackendTest, CausalAttentionForwardAndBackward) {
  struct Shape {
    int B, T, H, dh;
  };
  // T past the CPU kernel's 64-row query block, odd T, one head, dh = 1; the CUDA kernels'
  // three tile shapes (dh <= 64, <= 128, <= 256), several tiles with a ragged last one, and T
  // past the 4096 that the earlier per-row CUDA kernels held in shared memory.
  for (const Shape& sh : {Shape{1, 1, 1, 4}, Shape{2, 7, 3, 5}, Shape{1, 130, 2, 16},
                          Shape{3, 33, 4, 1}, Shape{0, 8, 2, 4}, Shape{1, 150, 2, 64},
                          Shape{2, 45, 1, 100}, Shape{1, 37, 2, 256}, Shape{1, 4200, 1, 2}}) {
    const int d = sh.H * sh.dh;
    const size_t rows = static_cast<size_t>(sh.B) * sh.T;
    const auto qkv = Normal(rows * 3 * d, 21), dout = Normal(rows * d, 22);
    std::vector<float> out(rows * d), lse(static_cast<size_t>(sh.B) * sh.H * sh.T),
        dqkv(rows * 3 * d);
    std::vector<float> scratch(
        static_cast<size_t>(kernels::AttentionScratchFloats(sh.B, sh.T, sh.H)));
    kernels::CausalAttentionForward(qkv.data(), out.data(), lse.data(), scratch.data(), sh.B, sh.T,
                                    sh.H, sh.dh);
    kernels::CausalAttentionBackward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                                     scratch.data(), sh.B, sh.T, sh.H, sh.dh);
    Buffer<float> bq(*b_, qkv), bo(*b_, rows * d), bl(*b_, lse.size()), bd(*b_, dout),
        bdq(*b_, Values(rows * 3 * d, 5));
    b_->CausalAttentionForward(bq.get(), bo.get(), bl.get(), sh.B, sh.T, sh.H, sh.dh);
    b_->CausalAttentionBackward(bd.get(), bq.get(), bo.get(), bl.get(), bdq.get(), sh.B, sh.T, sh.H,
                                sh.dh);
    const std::string at =
        fmt::format("{} B={} T={} H={} dh={}", b_->name(), sh.B, sh.T, sh.H, sh.dh);
    EXPECT_EQ(FirstOutside(bo.Read(), out, 2e-6f, 1e-5f), "") << at << " out";
    EXPECT_EQ(FirstOutside(bl.Read(), lse, 2e-6f, 1e-5f), "") << at << " lse";
    EXPECT_EQ(FirstOutside(bdq.Read(), dqkv, 1e-5f, 1e-4f), "") << at << " dqkv";
  }
  // The CUDA kernels keep rows of up to 256 floats per thread group; wider heads are refused
  // with the bound named, not run.
  if (b_->name().starts_with("cuda")) {
    Buffer<float> q(*b_, 3 * 257), o(*b_, 257), l(*b_, 1);
    try {
      b_->CausalAttentionForward(q.get(), o.get(), l.get(), 1, 1, 1, 257);
      ADD_FAILURE() << b_->name() << ": dh = 257 was run";
    } catch (const NumericsError& e) {
      EXPECT_NE(std::string(e.what()).find("dh <= 256"), std::string::npos) << e.what();
    }
  }
}

// The MoE router's steps on random logits against kernels/moe_kernels.h: the selection, the
// counts and the permutation bit for bit; scores and gates to 1e-6 relative (CUDA's exp / expf
// against glibc's), the per-expert score sums to 1e-12 relative (summed in another order), the
// logits' gradient to 1e-5 of each row's largest.
TEST_F(BackendTest, MoeRouterOps) {
  for (int64_t N : {0, 1, 5, 37, 1000})
    for (int E : {1, 4, 16})
      for (int k : {1, 2, 3})
        for (bool softmax : {true, false})
          for (bool renorm : {true, false}) {
            if (k > E) continue;
            const kernels::MoeRouterOptions opt{softmax, renorm, 0.1f};
            const int64_t Nk = N * k;
            const std::string at =
                fmt::format("{} N={} E={} k={} {} {}", b_->name(), N, E, k,
                            softmax ? "softmax" : "sigmoid", renorm ? "renormalized" : "raw");
            std::vector<float> score = Normal(static_cast<size_t>(N * E), 21, 2.0f);
            // Ties, where the contract is exact (the lower expert first): rows of equal
            // logits, and rows whose first and last experts share the largest logit.
            for (int64_t t = 3; t < N; t += 7) std::fill_n(score.begin() + t * E, E, 0.5f);
            for (int64_t t = 5; t < N; t += 7)
              score[t * E] = score[t * E + E - 1] =
                  *std::max_element(score.begin() + t * E, score.begin() + (t + 1) * E) + 1.0f;
            Buffer<float> bscore(*b_, score), bgate(*b_, static_cast<size_t>(Nk));
            Buffer<int32_t> bsel(*b_, static_cast<size_t>(Nk));
            std::vector<int32_t> sel(Nk);
            std::vector<float> gate(Nk);
            kernels::MoeTopK(score.data(), N, E, k, opt, sel.data(), gate.data());
            b_->MoeTopK(bscore.get(), N, E, k, opt, bsel.get(), bgate.get());
            EXPECT_EQ(bsel.Read(), sel) << "MoeTopK sel " << at;
            EXPECT_EQ(FirstOutside(bscore.Read(), score, 1e-30f, 1e-6f), "") << "scores " << at;
            EXPECT_EQ(FirstOutside(bgate.Read(), gate, 1e-30f, 1e-6f), "") << "gates " << at;

            // The next steps from the reference's scores and selection.
            Buffer<float> rscore(*b_, score);
            Buffer<int32_t> rsel(*b_, sel), bcount(*b_, static_cast<size_t>(E));
            Buffer<double> bpsum(*b_, static_cast<size_t>(E));
            std::vector<int32_t> count(E), offsets(E + 1);
            std::vector<double> psum(E);
            kernels::MoeExpertStats(score.data(), sel.data(), N, E, k, opt, count.data(),
                                    psum.data());
            b_->MoeExpertStats(rscore.get(), rsel.get(), N, E, k, opt, bcount.get(), bpsum.get());
            EXPECT_EQ(bcount.Read(), count) << "MoeExpertStats count " << at;
            const std::vector<double> got_psum = bpsum.Read();
            for (int e = 0; e < E; ++e)
              EXPECT_NEAR(got_psum[e], psum[e], 1e-12 * N) << "psum e=" << e << " " << at;
            std::vector<float> frac(E);
            kernels::MoeBalance(count.data(), psum.data(), N, E, k, opt.aux_weight, frac.data(),
                                offsets.data());
            std::vector<int32_t> row(Nk), token(Nk);
            kernels::MoePermute(sel.data(), offsets.data(), N, E, k, row.data(), token.data());
            Buffer<int32_t> boff(*b_, offsets), brow(*b_, static_cast<size_t>(Nk)),
                btok(*b_, static_cast<size_t>(Nk));
            b_->MoePermute(rsel.get(), boff.get(), N, E, k, brow.get(), btok.get());
            EXPECT_EQ(brow.Read(), row) << "MoePermute row " << at;
            EXPECT_EQ(btok.Read(), token) << "MoePermute token " << at;

            const std::vector<float> dgate = Normal(static_cast<size_t>(Nk), 22);
            std::vector<float> dz(N * E);
            kernels::MoeRouterBackward(score.data(), sel.data(), gate.data(), frac.data(),
                                       dgate.data(), N, E, k, opt, dz.data());
            Buffer<float> rgate(*b_, gate), bfrac(*b_, frac), bdg(*b_, dgate),
                bdz(*b_, static_cast<size_t>(N * E));
            b_->MoeRouterBackward(rscore.get(), rsel.get(), rgate.get(), bfrac.get(), bdg.get(), N,
                                  E, k, opt, bdz.get());
            const std::vector<float> got_dz = bdz.Read();
            for (int64_t t = 0; t < N; ++t) {
              float amax = 0.0f;
              for (int e = 0; e < E; ++e) amax = std::max(amax, std::fabs(dz[t * E + e]));
              for (int e = 0; e < E; ++e)
                EXPECT_NEAR(got_dz[t * E + e], dz[t * E + e], 1e-5f * amax + 1e-30f)
                    << "dz t=" << t << " e=" << e << " " << at;
            }
          }
  EXPECT_THROW(b_->MoeTopK(nullptr, 1, 2, 3, {}, nullptr, nullptr), NumericsError);
}

// The MoE GPT's permutation ops on the routing of random logits (every row a
// valid permutation), against kernels/moe_kernels.h's loops: bit for bit, except the gate
// gradients' dot products (summed in another order on a GPU). 33,000 tokens at top-2 are more
// rows than the CUDA grid's 65,535 blocks (GatherRows' grid-stride loop); 70,000 tokens at
// top-1 are more tokens than that too (the per-token combine, backward and unpermute loops,
// the backward's barriers included, run a second pass).
TEST_F(BackendTest, MoePermutationOps) {
  for (int64_t N : {0, 1, 5, 37, 33000, 70000})
    for (int k : {1, 2, 3})
      for (int64_t d : {1, 7, 300}) {
        if (N == 33000 && (k != 2 || d != 1)) continue;
        if (N == 70000 && (k != 1 || d != 1)) continue;
        const int E = 4;
        const int64_t Nk = N * k;
        std::vector<float> score = Normal(static_cast<size_t>(N * E), 11);
        std::vector<int32_t> sel(Nk), count(E), offsets(E + 1), row(Nk), token(Nk);
        std::vector<float> gate(Nk), frac(E);
        std::vector<double> psum(E);
        kernels::MoeTopK(score.data(), N, E, k, {}, sel.data(), gate.data());
        kernels::MoeExpertStats(score.data(), sel.data(), N, E, k, {}, count.data(), psum.data());
        kernels::MoeBalance(count.data(), psum.data(), N, E, k, 0.01f, frac.data(), offsets.data());
        kernels::MoePermute(sel.data(), offsets.data(), N, E, k, row.data(), token.data());
        const auto x = Normal(static_cast<size_t>(N * d), 1), yp = Normal(Nk * d, 2),
                   dy = Normal(N * d, 3), init = Normal(N * d, 4);
        Buffer<float> bx(*b_, x), byp(*b_, yp), bdy(*b_, dy), bgate(*b_, gate);
        Buffer<int32_t> brow(*b_, row), btok(*b_, token);
        const std::string at = fmt::format("{} N={} k={} d={}", b_->name(), N, k, d);

        std::vector<float> xp(Nk * d);
        kernels::MoeGatherRows(x.data(), token.data(), xp.data(), Nk, d);
        Buffer<float> bxp(*b_, Nk * d);
        b_->GatherRows(bx.get(), btok.get(), bxp.get(), Nk, d);
        EXPECT_EQ(FirstMismatch(bxp.Read(), xp), "") << "GatherRows " << at;

        for (bool acc : {false, true}) {
          std::vector<float> out = init;
          kernels::MoeCombine(yp.data(), row.data(), gate.data(), out.data(), N, k, d, acc);
          Buffer<float> bout(*b_, init);
          b_->MoeCombine(byp.get(), brow.get(), bgate.get(), bout.get(), N, k, d, acc);
          EXPECT_EQ(FirstMismatch(bout.Read(), out), "") << "MoeCombine acc=" << acc << " " << at;
        }

        std::vector<float> dgate(Nk), dyp(Nk * d);
        kernels::MoeCombineBackward(dy.data(), yp.data(), row.data(), gate.data(), dgate.data(),
                                    dyp.data(), N, k, d);
        Buffer<float> bdgate(*b_, Nk), bdyp(*b_, Nk * d);
        b_->MoeCombineBackward(bdy.get(), byp.get(), brow.get(), bgate.get(), bdgate.get(),
                               bdyp.get(), N, k, d);
        EXPECT_EQ(FirstMismatch(bdyp.Read(), dyp), "") << "MoeCombineBackward dyp " << at;
        const std::vector<float> got = bdgate.Read();
        for (int64_t t = 0; t < N; ++t)
          for (int j = 0; j < k; ++j) {
            double mag = 0.0;  // Σ|dy·yp|: the scale of the dot product's rounding
            for (int64_t i = 0; i < d; ++i)
              mag += std::fabs(double{dy[t * d + i]} * yp[row[t * k + j] * d + i]);
            EXPECT_NEAR(got[t * k + j], dgate[t * k + j], 1e-5 * mag + 1e-30)
                << "MoeCombineBackward dgate t=" << t << " j=" << j << " " << at;
          }

        std::vector<float> dx(N * d);
        kernels::MoeUnpermuteSum(dyp.data(), row.data(), dx.data(), N, k, d);
        Buffer<float> bdx(*b_, N * d);
        b_->MoeUnpermuteSum(bdyp.get(), brow.get(), bdx.get(), N, k, d);
        EXPECT_EQ(FirstMismatch(bdx.Read(), dx), "") << "MoeUnpermuteSum " << at;
      }
  EXPECT_THROW(b_->MoeCombine(nullptr, nullptr, nullptr, nullptr, 1, 0, 4, false), NumericsError);
  EXPECT_THROW(b_->GatherRows(nullptr, nullptr, nullptr, -1, 4), NumericsError);
}

TEST_F(BackendTest, NegativeCountsAreRefused) {
  EXPECT_THROW(b_->Fill(nullptr, -1, 0.0f), NumericsError);
  EXPECT_THROW(b_->CastF32ToBf16(nullptr, nullptr, -3), NumericsError);
  EXPECT_THROW(b_->SumSquares(nullptr, -2), NumericsError);
  const AdamWSpan bad{nullptr, nullptr, nullptr, nullptr, -5, 0.0f};
  EXPECT_THROW(b_->AdamW(&bad, 1, {}, 1, 1.0f), NumericsError);
  // The MXFP8 ops name themselves (CheckMxCall).
  const MxOptions mx;
  try {
    b_->MxDequantizeRowsBf16(nullptr, nullptr, 2, -1, nullptr, mx);
    ADD_FAILURE() << "no error";
  } catch (const NumericsError& e) {
    EXPECT_NE(std::string(e.what()).find("MxDequantizeRowsBf16: matrix shape"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(b_->MxQuantizeWeight(nullptr, -1, 4, nullptr, nullptr, mx), NumericsError);
  EXPECT_THROW(b_->MxDequantizeRows(nullptr, nullptr, -1, 4, nullptr, mx), NumericsError);
}

TEST_F(BackendTest, SumSquaresInDouble) {
  for (size_t n : kSizes) {
    std::vector<float> x = Values(n, 5 + static_cast<uint32_t>(n));
    for (float& v : x) v = std::isfinite(v) ? std::fmod(v, 100.0f) : 2.0f;
    long double want = 0;
    for (float v : x) want += static_cast<long double>(v) * v;
    Buffer<float> dx(*b_, x);
    const double got = b_->SumSquares(dx.get(), static_cast<int64_t>(n));
    EXPECT_NEAR(got, static_cast<double>(want), 1e-12 * static_cast<double>(want))
        << b_->name() << " n=" << n;
  }
}

TEST_F(BackendTest, CopyWithinTheBackend) {
  for (size_t n : kSizes) {
    const std::vector<float> x = Values(n + 3, 11);
    Buffer<float> src(*b_, x), dst(*b_, n);
    b_->Copy(dst.get(), src.get() + 3, n * sizeof(float));
    EXPECT_EQ(FirstMismatch(dst.Read(), std::vector<float>(x.begin() + 3, x.end())), "")
        << b_->name() << " n=" << n;
  }
}

// Upload is queued like an op and stages its source: the host's buffer is overwritten at once
// and the uploads still land, in queue order with the ops around them — more uploads than the
// CUDA backend's staging ring holds, of growing sizes.
TEST_F(BackendTest, UploadStagesItsSourceAndKeepsQueueOrder) {
  for (size_t n : kSizes) {
    const std::vector<float> want = Values(n, 17);
    std::vector<std::unique_ptr<Buffer<float>>> dst;
    for (int i = 0; i < 11; ++i) dst.push_back(std::make_unique<Buffer<float>>(*b_, n));
    std::vector<float> host = want;
    for (int i = 0; i < 11; ++i) {
      b_->Fill(dst[i]->get(), static_cast<int64_t>(n), 9.0f);  // queued before: overwritten
      b_->Upload(dst[i]->get(), host.data(), n * sizeof(float));
      std::fill(host.begin(), host.end(), -1.0f);  // the source is reused at once
      if (i == 10) b_->Fill(dst[i]->get(), static_cast<int64_t>(n), 4.0f);  // queued after: wins
      host = want;
    }
    for (int i = 0; i < 10; ++i)
      EXPECT_EQ(FirstMismatch(dst[i]->Read(), want), "") << b_->name() << " n=" << n << " #" << i;
    EXPECT_EQ(dst[10]->Read(), std::vector<float>(n, 4.0f)) << b_->name() << " n=" << n;
  }
}

TEST_F(BackendTest, Fill) {
  for (size_t n : kSizes) {
    Buffer<float> dx(*b_, Values(n, 3));
    b_->Fill(dx.get(), static_cast<int64_t>(n), -2.5f);
    EXPECT_EQ(dx.Read(), std::vector<float>(n, -2.5f)) << b_->name() << " n=" << n;
  }
}

// Zero clears exactly the bytes asked for: an odd count of bf16 elements, the rest untouched.
TEST_F(BackendTest, ZeroClearsItsBytesOnly) {
  for (size_t n : kSizes) {
    Buffer<float> dx(*b_, Values(n, 3));
    const size_t half = n / 2;
    b_->Zero(dx.get(), half * sizeof(float) + (n % 2 ? 2 : 0));  // and one bf16 more
    std::vector<float> want = Values(n, 3);
    for (size_t i = 0; i < half; ++i) want[i] = 0.0f;
    if (n % 2) {  // the low half of float `half` (little endian): its bf16 truncation stays
      uint32_t u;
      std::memcpy(&u, &want[half], 4);
      u &= 0xffff0000u;
      std::memcpy(&want[half], &u, 4);
    }
    const std::vector<float> got = dx.Read();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
        << b_->name() << " n=" << n;
  }
}

// Newton–Schulz on fp32 and on bf16 inputs (Muon's u) against the CPU iteration.
TEST_F(BackendTest, NewtonSchulzMatchesTheCpuIteration) {
  struct Shape {
    int64_t rows, cols, batch;
  };
  for (DType idt : {DType::kF32, DType::kBF16})
    for (const Shape& s :
         {Shape{5, 12, 3}, Shape{12, 5, 2}, Shape{8, 8, 1}, Shape{64, 96, 4}, Shape{3, 3, 0}}) {
      const size_t mat = static_cast<size_t>(s.rows * s.cols);
      std::vector<std::vector<float>> in(s.batch), want(s.batch, std::vector<float>(mat));
      std::vector<std::vector<bf16>> in16(s.batch);
      std::vector<std::unique_ptr<Buffer<float>>> din, dout;
      std::vector<std::unique_ptr<Buffer<bf16>>> din16;
      std::vector<const void*> din_p;
      std::vector<float*> dout_p;
      std::vector<const void*> in_p;
      std::vector<float*> want_p;
      std::mt19937 rng(static_cast<uint32_t>(s.rows * 131 + s.cols));
      std::normal_distribution<float> nd;
      for (int64_t i = 0; i < s.batch; ++i) {
        in[i].resize(mat);
        for (float& x : in[i]) x = nd(rng);
        for (float x : in[i]) in16[i].push_back(FloatToBf16(x));
        if (idt == DType::kBF16) {
          din16.push_back(std::make_unique<Buffer<bf16>>(*b_, in16[i]));
          din_p.push_back(din16.back()->get());
          in_p.push_back(in16[i].data());
        } else {
          din.push_back(std::make_unique<Buffer<float>>(*b_, in[i]));
          din_p.push_back(din.back()->get());
          in_p.push_back(in[i].data());
        }
        dout.push_back(std::make_unique<Buffer<float>>(*b_, mat));
        dout_p.push_back(dout.back()->get());
        want_p.push_back(want[i].data());
      }
      b_->NewtonSchulz(din_p.data(), idt, dout_p.data(), s.batch, s.rows, s.cols, 5, {}, 0.7f);
      NewtonSchulz ref;
      ref.Run(in_p.data(), idt, want_p.data(), s.batch, s.rows, s.cols, 5, {}, 0.7f);
      for (int64_t i = 0; i < s.batch; ++i) {
        const std::vector<float> got = dout[i]->Read();
        float amax = 0, worst = 0;
        for (size_t k = 0; k < mat; ++k) {
          amax = std::max(amax, std::fabs(want[i][k]));
          worst = std::max(worst, std::fabs(got[k] - want[i][k]));
        }
        EXPECT_GT(amax, 0.1f);
        EXPECT_LE(worst, 1e-4f * amax) << b_->name() << " " << DTypeName(idt) << " [" << s.rows
                                       << "x" << s.cols << "] matrix " << i;
      }
    }
}

// An event recorded after a long queue of ops, waited for on another thread, hands the results
// to another handle's stream there (the engine's hand-off to its communication thread).
TEST_F(BackendTest, EventHandsWorkToAnotherThreadAndStream) {
  const std::vector<float> x = Values(kLarge, 17);
  Buffer<float> src(*b_, x);
  Buffer<bf16> y(*b_, kLarge);
  std::unique_ptr<Backend> other = b_->NewStream();  // made first: the wait is all that orders
  b_->Fill(src.get(), static_cast<int64_t>(kLarge), 3.0f);
  for (int i = 0; i < 20; ++i)  // long enough that a copy without the wait would overtake it
    b_->CastF32ToBf16(src.get(), y.get(), static_cast<int64_t>(kLarge));
  std::shared_ptr<BackendEvent> ready = b_->RecordEvent();
  std::vector<bf16> got(kLarge);
  std::thread comm([&] {
    ready->Wait();
    other->CopyOut(got.data(), y.get(), kLarge * sizeof(bf16));
  });
  comm.join();
  EXPECT_EQ(FirstMismatch(got, std::vector<bf16>(kLarge, FloatToBf16(3.0f))), "") << b_->name();
  b_->Synchronize();
}

// The deferred guarded backend models that hand-off on the CPU: a wait for an event runs the
// recording handle's queue up to the event — not past it — on the waiting thread; without the
// wait another handle reads what was there before; a queued op's failure is raised by the wait
// and again by the owner's next synchronizing call.
TEST(GuardedBackendEvents, AWaitRunsTheQueueUpToItsEventOnTheWaitingThread) {
  testing::GuardedBackend g(nullptr, /*deferred=*/true);
  std::unique_ptr<Backend> other = g.NewStream();
  const int64_t n = 1000;
  auto* x = static_cast<float*>(g.Alloc(n * sizeof(float)));
  const std::vector<float> zeros(n, 0.0f);
  g.CopyIn(x, zeros.data(), n * sizeof(float));
  g.Fill(x, n, 1.0f);
  std::shared_ptr<BackendEvent> first = g.RecordEvent();
  g.Fill(x, n, 2.0f);
  std::shared_ptr<BackendEvent> second = g.RecordEvent();
  std::vector<float> before(n), at_first(n), at_second(n);
  std::thread comm([&] {
    other->CopyOut(before.data(), x, n * sizeof(float));  // no wait: stale
    first->Wait();
    other->CopyOut(at_first.data(), x, n * sizeof(float));
    second->Wait();
    other->CopyOut(at_second.data(), x, n * sizeof(float));
  });
  comm.join();
  EXPECT_EQ(before, zeros);
  EXPECT_EQ(at_first, std::vector<float>(n, 1.0f));
  EXPECT_EQ(at_second, std::vector<float>(n, 2.0f));

  g.Fill(x, -1, 0.0f);  // fails when it runs
  std::shared_ptr<BackendEvent> failed = g.RecordEvent();
  EXPECT_THROW(failed->Wait(), NumericsError);
  EXPECT_THROW(g.Synchronize(), NumericsError);
  EXPECT_NO_THROW(g.Synchronize());             // raised once to the owner, as a stream's error
  EXPECT_THROW(failed->Wait(), NumericsError);  // but sticky for every wait that covers it
  EXPECT_NO_THROW(first->Wait());               // not for one recorded before it
  g.Free(x);
}

#ifdef SSHSDP_CUDA_EMULATION
// The CUDA backend's events come from a pool: a hand-off creates one only while more are in
// flight than were ever before, not one per hand-off (the emulation counts the creations).
TEST_F(BackendTest, CudaEventsComeFromAPool) {
  if (!b_->name().starts_with("cuda")) GTEST_SKIP() << "the CUDA backend's pool";
  b_->RecordEvent()->Wait();  // the pool's first event
  const int64_t before = emu::EventsCreated();
  for (int i = 0; i < 100; ++i) b_->RecordEvent()->Wait();
  std::vector<std::shared_ptr<BackendEvent>> held;
  for (int i = 0; i < 3; ++i) held.push_back(b_->RecordEvent());  // three at once: two more
  for (auto& e : held) e->Wait();
  EXPECT_EQ(emu::EventsCreated() - before, 2);
}
#endif

// The deferred guarded backend stages an upload as a GPU's does: no wait on the host, the bytes
// copied at the call and written when the queue reaches them.
TEST(GuardedBackendEvents, UploadIsQueuedWithoutAHostWait) {
  testing::GuardedBackend g(nullptr, /*deferred=*/true);
  const int64_t n = 1000;
  auto* x = static_cast<float*>(g.Alloc(n * sizeof(float)));
  g.Fill(x, n, 1.0f);
  std::vector<float> host(n, 5.0f);
  const int64_t waits = g.host_waits();
  g.Upload(x, host.data(), n * sizeof(float));
  std::fill(host.begin(), host.end(), -1.0f);
  EXPECT_EQ(g.host_waits(), waits);
  std::vector<float> got(n);
  g.CopyOut(got.data(), x, n * sizeof(float));
  EXPECT_EQ(g.host_waits(), waits + 1);
  EXPECT_EQ(got, std::vector<float>(n, 5.0f));
  g.Free(x);
}

TEST(BackendFactory, NamesWhatIsWrong) {
  EXPECT_EQ(MakeBackend("cpu")->name(), "cpu");
  try {
    MakeBackend("tpu");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use cpu, cuda or cuda:<ordinal>"), std::string::npos);
  }
  EXPECT_THROW(MakeBackend("cuda:x"), ConfigError);
  EXPECT_THROW(MakeBackend("cuda:-1"), ConfigError);
  // Without CUDA or a device the CUDA backend is refused, naming the way out.
  if (!CudaCompiled() || CudaDeviceCount() == 0) {
    try {
      MakeBackend("cuda");
      ADD_FAILURE() << "no error";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("--backend cpu"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_THROW(MakeCudaBackend(CudaDeviceCount()), DeviceError);
  }
}

}  // namespace
}  // namespace sshsdp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--backend=", 0) == 0) sshsdp::g_backend = a.substr(10);
  }
  if (sshsdp::g_backend != "cpu") {
    if (!sshsdp::CudaCompiled()) {
      std::printf("skipped: this build has no CUDA backend (-DSSHSDP_CUDA=ON with nvcc)\n");
      return 77;
    }
    if (sshsdp::CudaDeviceCount() == 0) {
      try {  // the reason: no driver, a driver too old for this runtime, no device
        sshsdp::MakeCudaBackend(0);
      } catch (const sshsdp::Error& e) {
        std::printf("skipped: %s\n", e.what());
      }
      return 77;
    }
  }
  return RUN_ALL_TESTS();
}
