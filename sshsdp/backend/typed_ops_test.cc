// The typed layer ops of a backend (backend.h: LinearForward / BackwardData / BackwardWeight on
// fp32, bf16 and MXFP8 operands, the bf16-storing norm, GELU and loss ops, typed embeddings,
// WriteOrAccumulate, MxDequantizeOperand) against the kernels the models were written on, and
// the defaults every backend without fused versions runs (backend.h's compositions, called
// here on the backend under test too: on the CPU they are checked in CI). The CPU backend's own
// ops are the kernels, bit for bit; a composition rounds the same fp32 values once but may sum
// in another order (fp32 results to 1e-5, bf16 results to one bf16 step).
#include <gtest/gtest.h>

#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/testing/backend_test_util.h"
#include "sshsdp/kernels/layer_kernels.h"
#include "sshsdp/kernels/mx_linear.h"
#include "sshsdp/numerics/mx.h"

namespace sshsdp {
namespace {

std::vector<bf16> ToBf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  FloatToBf16(x.data(), y.data(), x.size());
  return y;
}

std::vector<float> ToF32(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  Bf16ToFloat(x.data(), y.data(), x.size());
  return y;
}

// An MXFP8 weight [n, k]: E4M3 codes and the per-row scale matrix [n, ceil(k/32)] (row_major:
// each 32x32 block's scale repeated on its rows), as the engine's Tw lays them out.
struct MxWeight {
  std::vector<uint8_t> codes, row_scales;
};
MxWeight Quantize(const std::vector<float>& w, int64_t n, int64_t k) {
  MxWeight m;
  m.codes.resize(static_cast<size_t>(n * k));
  std::vector<uint8_t> blocks(static_cast<size_t>(MxWeightScaleCount(n, k)));
  MxQuantizeWeight(w.data(), n, k, m.codes.data(), blocks.data(), MxOptions{});
  const int64_t kb = MxBlocks(k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < kb; ++j) m.row_scales.push_back(blocks[(r / 32) * kb + j]);
  return m;
}

// Which implementation of the ops a case runs: the backend's own, or backend.h's defaults.
enum class Impl { kOwn, kDefault };

class TypedOpsTest : public BackendTest, public ::testing::WithParamInterface<Impl> {
 protected:
  bool own() const { return GetParam() == Impl::kOwn; }
  void Linear(kernels::LinearInput x, const kernels::WeightView& w, float* y, int64_t m, int64_t n,
              int64_t k) {
    own() ? b_->LinearForward(x, w, y, m, n, k) : b_->Backend::LinearForward(x, w, y, m, n, k);
  }
  void Data(kernels::LinearInput dy, const kernels::WeightView& w, float* dx, int64_t m, int64_t n,
            int64_t k, bool acc) {
    own() ? b_->LinearBackwardData(dy, w, dx, m, n, k, acc)
          : b_->Backend::LinearBackwardData(dy, w, dx, m, n, k, acc);
  }
  void Weight(kernels::LinearInput dy, kernels::LinearInput x, DType compute, float* dw, int64_t m,
              int64_t n, int64_t k, bool acc) {
    own() ? b_->LinearBackwardWeight(dy, x, compute, dw, DType::kF32, m, n, k, acc)
          : b_->Backend::LinearBackwardWeight(dy, x, compute, dw, DType::kF32, m, n, k, acc);
  }
  // The CPU backend's own ops are the kernels: bit for bit there.
  float Tol() const { return own() && b_->host_memory() ? 0.0f : 1e-5f; }
};

constexpr int64_t kM = 37, kN = 48, kK = 70;  // ragged against 32-blocks and vector widths

TEST_P(TypedOpsTest, LinearOnEveryWeightDtype) {
  const std::vector<float> x = Normal(kM * kK, 1), w = Normal(kN * kK, 2, 0.1f);
  const std::vector<float> dy = Normal(kM * kN, 3), y0 = Normal(kM * kK, 4);
  const std::vector<bf16> x16 = ToBf16(x), w16 = ToBf16(w), dy16 = ToBf16(dy);
  const MxWeight mx = Quantize(w, kN, kK);
  Buffer<float> dx32(*b_, x), dw32(*b_, w), ddy(*b_, dy);
  Buffer<bf16> dx16(*b_, x16), dw16(*b_, w16), ddy16(*b_, dy16);
  Buffer<uint8_t> dcodes(*b_, mx.codes), dscales(*b_, mx.row_scales);
  struct Case {
    const char* name;
    kernels::LinearInput hx, hdy;
    kernels::WeightView hw;
    kernels::LinearInput bx, bdy;
    kernels::WeightView bw;
  };
  const Case cases[] = {
      {"fp32", x.data(), dy.data(), {w.data()}, dx32.get(), ddy.get(), {dw32.get()}},
      {"bf16 weight, fp32 input",
       x.data(),
       dy.data(),
       {w16.data(), DType::kBF16},
       dx32.get(),
       ddy.get(),
       {dw16.get(), DType::kBF16}},
      {"bf16 weight, bf16 input",
       x16.data(),
       dy16.data(),
       {w16.data(), DType::kBF16},
       dx16.get(),
       ddy16.get(),
       {dw16.get(), DType::kBF16}},
      {"mxfp8 weight",
       x.data(),
       dy.data(),
       {mx.codes.data(), DType::kE4M3, mx.row_scales.data(), ScaleLayout::kRowMajor},
       dx32.get(),
       ddy.get(),
       {dcodes.get(), DType::kE4M3, dscales.get(), ScaleLayout::kRowMajor}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<float> want(kM * kN), want_dx = y0;
    kernels::LinearForward(c.hx, c.hw, want.data(), kM, kN, kK);
    kernels::LinearBackwardData(c.hdy, c.hw, want_dx.data(), kM, kN, kK, true);
    Buffer<float> y(*b_, kM * kN), dxb(*b_, y0);
    Linear(c.bx, c.bw, y.get(), kM, kN, kK);
    Data(c.bdy, c.bw, dxb.get(), kM, kN, kK, true);
    EXPECT_EQ(FirstOutside(y.Read(), want, Tol(), Tol()), "") << b_->name();
    EXPECT_EQ(FirstOutside(dxb.Read(), want_dx, Tol(), Tol()), "") << b_->name();
    const DType compute = kernels::LinearComputeDType(c.hw.dtype);
    if (c.hx.dtype != c.hdy.dtype) continue;
    std::vector<float> want_dw(kN * kK);
    kernels::LinearBackwardWeight(c.hdy, c.hx, compute, want_dw.data(), DType::kF32, kM, kN, kK,
                                  false);
    Buffer<float> dwb(*b_, kN * kK);
    Weight(c.bdy, c.bx, compute, dwb.get(), kM, kN, kK, false);
    EXPECT_EQ(FirstOutside(dwb.Read(), want_dw, Tol(), Tol()), "") << b_->name();
  }
}

// One bf16 step of want, or exactly it.
std::string WithinOneBf16Step(const std::vector<bf16>& got, const std::vector<bf16>& want,
                              bool exact) {
  return exact ? FirstMismatch(got, want)
               : FirstOutside(ToF32(got), ToF32(want), 1e-30f, 1.0f / 128);
}

TEST_P(TypedOpsTest, Bf16StoringLayerOps) {
  const int64_t rows = 19, d = 72, n = rows * d, V = 40;
  const std::vector<float> x = Normal(n, 5), g = Normal(d, 6), dy = Normal(n, 7);
  const bool exact = own() && b_->host_memory();
  Buffer<float> dx(*b_, x), dg(*b_, g), ddy(*b_, dy), rstd(*b_, rows);
  Buffer<bf16> y(*b_, n);
  std::vector<bf16> want(n);
  std::vector<float> want_rstd(rows);
  kernels::RmsNormForwardBf16(x.data(), g.data(), want.data(), want_rstd.data(), rows,
                              static_cast<int>(d));
  const float eps = kernels::kRmsEps;
  own() ? b_->RmsNormForwardBf16(dx.get(), dg.get(), y.get(), rstd.get(), rows, static_cast<int>(d),
                                 eps)
        : b_->Backend::RmsNormForwardBf16(dx.get(), dg.get(), y.get(), rstd.get(), rows,
                                          static_cast<int>(d), eps);
  EXPECT_EQ(WithinOneBf16Step(y.Read(), want, exact), "") << "RmsNormForwardBf16";
  kernels::GeluForwardBf16(x.data(), want.data(), n);
  own() ? b_->GeluForwardBf16(dx.get(), y.get(), n)
        : b_->Backend::GeluForwardBf16(dx.get(), y.get(), n);
  EXPECT_EQ(WithinOneBf16Step(y.Read(), want, exact), "") << "GeluForwardBf16";
  kernels::GeluBackwardBf16(x.data(), dy.data(), want.data(), n);
  own() ? b_->GeluBackwardBf16(dx.get(), ddy.get(), y.get(), n)
        : b_->Backend::GeluBackwardBf16(dx.get(), ddy.get(), y.get(), n);
  EXPECT_EQ(WithinOneBf16Step(y.Read(), want, exact), "") << "GeluBackwardBf16";
  std::vector<float> probs = Normal(rows * V, 8);
  for (float& p : probs) p = std::fabs(p) / 8;
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 7) % V);
  Buffer<float> dprobs(*b_, probs);
  Buffer<int32_t> dtargets(*b_, targets);
  std::vector<bf16> want_dl(rows * V);
  Buffer<bf16> dl(*b_, rows * V);
  kernels::SoftmaxCrossEntropyBackwardBf16(probs.data(), targets.data(), want_dl.data(), rows, V,
                                           0.25f);
  own()
      ? b_->SoftmaxCrossEntropyBackwardBf16(dprobs.get(), dtargets.get(), dl.get(), rows, V, 0.25f)
      : b_->Backend::SoftmaxCrossEntropyBackwardBf16(dprobs.get(), dtargets.get(), dl.get(), rows,
                                                     V, 0.25f);
  EXPECT_EQ(WithinOneBf16Step(dl.Read(), want_dl, exact), "") << "SoftmaxCrossEntropyBackwardBf16";
}

TEST_P(TypedOpsTest, TablesGainsAndMxOperands) {
  const int B = 2, T = 5, d = 40;
  const int64_t vocab = 11, seq = 6;
  const std::vector<float> wte = Normal(vocab * d, 9), wpe = Normal(seq * d, 10);
  std::vector<int32_t> tokens(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = (i * 3) % static_cast<int>(vocab);
  const std::vector<bf16> wte16 = ToBf16(wte), wpe16 = ToBf16(wpe);
  // bf16 tables: the rows widened, then the fp32 sum — exact anywhere.
  std::vector<float> want(B * T * d);
  kernels::EmbeddingForwardF32(ToF32(wte16).data(), ToF32(wpe16).data(), tokens.data(), B, T, d,
                               want.data());
  Buffer<bf16> dte(*b_, wte16), dpe(*b_, wpe16);
  Buffer<int32_t> dtok(*b_, tokens);
  Buffer<float> out(*b_, want.size());
  own() ? b_->EmbeddingForwardTyped(dte.get(), dpe.get(), DType::kBF16, dtok.get(), B, T, d, vocab,
                                    seq, out.get())
        : b_->Backend::EmbeddingForwardTyped(dte.get(), dpe.get(), DType::kBF16, dtok.get(), B, T,
                                             d, vocab, seq, out.get());
  EXPECT_EQ(FirstMismatch(out.Read(), want), "") << "EmbeddingForwardTyped";
  // WriteOrAccumulate into fp32: a copy, then an add.
  const std::vector<float> a = Normal(100, 11), c = Normal(100, 12);
  Buffer<float> da(*b_, a), dc(*b_, c);
  own() ? b_->WriteOrAccumulate(da.get(), dc.get(), DType::kF32, 100, true)
        : b_->Backend::WriteOrAccumulate(da.get(), dc.get(), DType::kF32, 100, true);
  std::vector<float> sum(100);
  for (int i = 0; i < 100; ++i) sum[i] = c[i] + a[i];
  EXPECT_EQ(FirstMismatch(dc.Read(), sum), "") << "WriteOrAccumulate";
  // An MXFP8 operand from row_major scales: code value times scale, exact anywhere.
  const MxWeight mx = Quantize(Normal(64 * 70, 13), 64, 70);
  std::vector<float> deq(64 * 70);
  kernels::MxDequantizeOperand(mx.codes.data(), DType::kE4M3, mx.row_scales.data(),
                               ScaleLayout::kRowMajor, 64, 70, deq.data());
  Buffer<uint8_t> dq(*b_, mx.codes), ds(*b_, mx.row_scales);
  Buffer<float> dout(*b_, deq.size());
  own() ? b_->MxDequantizeOperand(dq.get(), DType::kE4M3, ds.get(), ScaleLayout::kRowMajor, 64, 70,
                                  dout.get())
        : b_->Backend::MxDequantizeOperand(dq.get(), DType::kE4M3, ds.get(), ScaleLayout::kRowMajor,
                                           64, 70, dout.get());
  EXPECT_EQ(FirstMismatch(dout.Read(), deq), "") << "MxDequantizeOperand";
}

// What the defaults do not compose is refused by name (a model asks Has() before it builds).
TEST_F(BackendTest, DefaultsRefuseWhatTheyLackByName) {
  auto refused = [&](auto&& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Buffer<float> f(*b_, 64 * 64);
  refused(
      [&] {
        b_->Backend::GemmStrided(false, false, 2, 2, 2, f.get(), 4, f.get(), 4, DType::kF32,
                                 f.get(), 4, DType::kF32, false);
      },
      "GemmStrided has no strided GEMM");
  refused(
      [&] {
        b_->Backend::CausalAttentionForwardBf16(f.get(), f.get(), f.get(), f.get(), 0, 1, 1, 1, 8);
      },
      "CausalAttentionForwardBf16 has no bf16 attention");
  refused([&] { b_->Backend::WriteOrAccumulate(f.get(), f.get(), DType::kBF16, 4, false); },
          "WriteOrAccumulate has no bf16 gradients");
  refused(
      [&] {
        b_->Backend::MxDequantizeOperand(reinterpret_cast<uint8_t*>(f.get()), DType::kE4M3,
                                         reinterpret_cast<uint8_t*>(f.get()),
                                         ScaleLayout::kCublasSwizzle, 32, 32, f.get());
      },
      "cublas_swizzle scales");
  EXPECT_EQ(b_->host_memory(), b_->Has(BackendFeature::kStridedGemm)) << "the CPU has every one";
}

INSTANTIATE_TEST_SUITE_P(Impls, TypedOpsTest, ::testing::Values(Impl::kOwn, Impl::kDefault),
                         [](const auto& info) {
                           return info.param == Impl::kOwn ? "Own" : "Defaults";
                         });

}  // namespace
}  // namespace sshsdp
