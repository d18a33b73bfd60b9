// GEMMs for linear layers and for the optimizer, on the CPU: fp32 products on the active
// provider (oneDNN, MKL or BLIS, chosen per CPU kind: gemm_provider.h), bf16 products on
// oneDNN's matmul primitive or sshsdp's AMX kernel.
//
// Linear layers follow nn.Linear: the weight W is [out, in] row-major, activations X are
// [M, in] row-major, Y = X·Wᵀ. Weights may be fp32 or bf16 (runtime precision). For bf16
// weights the fp32 activation operand is rounded to bf16 and the product is bf16×bf16 with
// fp32 accumulation: this is where a low-precision runtime weight pays off. Every output is
// written in one of two modes: accumulate=false overwrites every element of the destination
// (garbage and NaN included: the engine relies on the first write of a gradient buffer
// covering it exactly), accumulate=true adds into it.
//
// bf16 products take one of two paths, probed once per process (Bf16GemmPath):
//   native   operands stay bf16: on AMX CPUs the products of one matrix run on sshsdp's AMX
//            kernel (amx_gemm.h; SSHSDP_BF16_GEMM_KERNEL=onednn keeps oneDNN), otherwise, and
//            for batched products, oneDNN's bf16 matmul (AVX512-BF16, AMX);
//   widened  CPUs whose oneDNN has no bf16 matmul (AVX2 and older): the bf16 operands are
//            widened to fp32 into per-call scratch and multiplied in fp32. A bf16×bf16
//            product is exact in fp32, so the two paths differ only in accumulation order;
//            runtime weights, gradients and communication stay bf16 either way.
// SSHSDP_BF16_GEMM=auto|native|widened (or SetBf16GemmPath) forces a path, so the widened
// path is tested on every machine.
//
//   LinearForward(x, w, DType::kBF16, y, /*m=*/B * T, /*n=*/d_out, /*k=*/d_in);
//   LinearBackwardData(dy, w, DType::kBF16, dx, m, n, k, /*accumulate=*/true);
//   LinearBackwardWeight(dy, x, DType::kBF16, dw, DType::kF32, m, n, k, /*accumulate=*/false);
//   CastToBf16(dy, dy16, m * n);                   // one rounding for both backward products
//   LinearBackwardData(dy16, w, DType::kBF16, dx, m, n, k, false);
//   LinearBackwardWeight(dy16, x, DType::kBF16, dw, DType::kF32, m, n, k, false);
//   fmt::print("{}\n", GemmPathDescription(DType::kBF16));  // "bf16 widened to fp32 (...)"
//   double peak = MeasureGemmPeak(DType::kBF16);   // FLOP/s of the active path
//
// oneDNN primitives are cached by (shape, transposes, dtypes, mode); one oneDNN engine and
// stream serve the whole process and calls are serialized by a mutex (oneDNN's shared
// scratchpad is not safe for concurrent execution), so any thread may call these functions.
// The implementation is split by job: gemm_internal.h lists the files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp::kernels {

// General matrix product C[m,n] (=|+=) op(A)[m,k] · op(B)[k,n], all row-major and dense.
// op(A) = A when A is stored [m,k], or Aᵀ when trans_a and A is stored [k,m]; the same for
// B ([k,n], or [n,k] with trans_b). A and B are both fp32 or both bf16; C is fp32 or bf16
// (fp32 operands with a bf16 C, and bf16 ones on the AMX kernel, go through an fp32 scratch). With
// batch > 1 the operands hold `batch` matrices back to back and C[i] = op(A[i])·op(B[i]). k == 0
// writes zeros (overwrite) or leaves C as it is (accumulate). Throws NumericsError for other
// dtypes.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
          DType ab_dtype, void* c, DType c_dtype, bool accumulate, int64_t batch = 1);

// Gemm on operands stored inside larger row-major arrays (one head's columns of a packed
// QKV activation, say): lda, ldb and ldc are the row strides, in elements, of A, B and C as
// stored (A stored [m,k], or [k,m] when trans_a, ...). C (=|+=) alpha · op(A) · op(B).
void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                 int64_t lda, const void* b, int64_t ldb, DType ab_dtype, void* c, int64_t ldc,
                 DType c_dtype, bool accumulate, float alpha = 1.0f);

// Element strides between the matrices of a two-level batch grid (GemmBatchedStrided).
struct GridStrides {
  int64_t outer = 0, inner = 0;
};

// fp32 products over an [outer, inner] grid in one call (oneDNN; a loop of sgemm on MKL and BLIS),
// each operand a strided view: for o < outer, i < inner, C[o,i] (=|+=) alpha · op(A[o,i]) ·
// op(B[o,i]), where X[o,i] starts at x + o·sx.outer + i·sx.inner and has row stride ldx (stored as
// in GemmStrided). Attention's per-(batch, head) products on packed QKV rows are one such call:
//   GemmBatchedStrided(false, true, B, H, T, T, dh, q, 3 * d, {T * 3 * d, dh},
//                      k, 3 * d, {T * 3 * d, dh}, s, T, {H * T * T, T * T}, false, scale);
// Any count may be 0; k == 0 writes zeros (overwrite) or leaves C as it is (accumulate).
void GemmBatchedStrided(bool trans_a, bool trans_b, int64_t outer, int64_t inner, int64_t m,
                        int64_t n, int64_t k, const float* a, int64_t lda, GridStrides sa,
                        const float* b, int64_t ldb, GridStrides sb, float* c, int64_t ldc,
                        GridStrides sc, bool accumulate, float alpha = 1.0f);

// A linear layer's activation operand (x, or dy): fp32, which a product with a bf16 weight
// rounds to bf16 inside the call, or bf16 already rounded — by the kernel that produced it
// (RmsNormForwardBf16, GeluForwardBf16, ...), or once for the several products that read it.
// A rounded operand is accepted with a bf16 weight (compute dtype) only, and a product then
// has the same bits as one given the fp32 values it was rounded from (CastToBf16), on either
// bf16 path. Converts implicitly from either pointer type, so fp32 callers read as before.
struct LinearInput {
  LinearInput(const float* p) : data(p), dtype(DType::kF32) {}  // NOLINT(runtime/explicit)
  LinearInput(const bf16* p) : data(p), dtype(DType::kBF16) {}  // NOLINT(runtime/explicit)
  const void* data;
  DType dtype;
};

// y[m,n] = x[m,k] · wᵀ, w [n,k] in w_dtype (fp32 or bf16). y is always overwritten.
void LinearForward(LinearInput x, const void* w, DType w_dtype, float* y, int64_t m, int64_t n,
                   int64_t k);

// dx[m,k] (=|+=) dy[m,n] · w, w [n,k] in w_dtype.
void LinearBackwardData(LinearInput dy, const void* w, DType w_dtype, float* dx, int64_t m,
                        int64_t n, int64_t k, bool accumulate);

// dw[n,k] (=|+=) dyᵀ · x, dy [m,n], x [m,k]. compute_dtype is the runtime weight's dtype:
// for bf16 fp32 operands are rounded to bf16 first, as in the other two products. dw is
// fp32 or bf16 (a bf16 runtime-gradient buffer). On the fp32 GEMM paths (fp32, or bf16
// widened) with oneDNN as provider a dy whose rows are a multiple of 2 KiB (n = 512, 1024,
// ...) is first copied (widened) into rows 16 floats longer (kernel scratch): oneDNN runs the
// transposed product about twice as fast that way on AVX2.
void LinearBackwardWeight(LinearInput dy, LinearInput x, DType compute_dtype, void* dw,
                          DType dw_dtype, int64_t m, int64_t n, int64_t k, bool accumulate);

// fp32 activation elements the linear-layer products above have rounded to bf16 in this
// process so far (every call with a bf16 weight and an fp32 LinearInput adds its size; a
// rounded input adds nothing). A deterministic count: tests assert how often a model makes
// the products round.
int64_t LinearRoundedElements();

// How products with bf16 operands run (see the top of this file).
enum class Bf16GemmPath {
  kNative,   // bf16×bf16 products with fp32 accumulation (oneDNN, or the AMX kernel)
  kWidened,  // bf16 operands widened to fp32 in scratch, fp32 matmul
};

// "native" / "widened".
std::string_view Bf16GemmPathName(Bf16GemmPath path);

// Parses "auto", "native" or "widened" (the SSHSDP_BF16_GEMM values); "auto" yields the
// probed path. Throws NumericsError naming the accepted values, or when "native" is asked
// for on a CPU without a native bf16 matmul (naming the CPU's ISA and the way out).
Bf16GemmPath ParseBf16GemmPath(std::string_view name);

// True when this CPU's oneDNN has a non-reference bf16 matmul (probed once, cached). On
// AVX-512 CPUs without BF16 that matmul is an emulation: "auto" widens there, and
// SSHSDP_BF16_GEMM=native selects the emulation.
bool NativeBf16GemmSupported();

// The path bf16 products take in this process: SSHSDP_BF16_GEMM if set, else the probe's
// choice (native where supported and the ISA has AVX512-BF16 or AMX, widened elsewhere). Resolved
// once, on first use; throws NumericsError for a bad SSHSDP_BF16_GEMM value (call it early to fail
// before any work).
Bf16GemmPath ActiveBf16GemmPath();

// Forces the path for the rest of the process (tests, benchmarks comparing both). kNative
// throws NumericsError where NativeBf16GemmSupported() is false.
void SetBf16GemmPath(Bf16GemmPath path);

// oneDNN's effective CPU ISA in its own spelling, e.g. "avx2", "avx512_core_amx".
std::string CpuIsaName();

// One line naming the GEMM path products with `dtype` operands take, for progress headers
// and benchmark reports: "fp32 (oneDNN brg:avx2)", "fp32 (MKL 2025.3 (path))", "bf16 native (oneDNN
// brg:avx512_core_amx_bf16)", "bf16 widened to fp32 (CPU ISA avx2 has no bf16 matmul in
// oneDNN; fp32 brg:avx2)".
std::string GemmPathDescription(DType dtype);

// A size³ product C = A·Bᵀ (fp32 output) on operands allocated once, run through Gemm with
// `dtype` operands (so it takes the active bf16 path). A peak measurement that brackets
// Run with its own synchronisation (all ranks at once, say) uses this directly.
class GemmPeakProbe {
 public:
  explicit GemmPeakProbe(DType dtype, int64_t size = 1024);
  void Run(int count = 1);  // `count` products
  double FlopsPerProduct() const { return 2.0 * static_cast<double>(size_) * size_ * size_; }

 private:
  DType dtype_;
  int64_t size_;
  std::vector<char> a_, b_;
  std::vector<float> c_;
};

// Times a size³ GEMM with fp32 or bf16 operands (fp32 output) `reps` times after one
// warm-up and returns the median rate in FLOP/s (2·size³ per product). Uses the threads
// oneDNN is given (OMP_NUM_THREADS). bf16 takes the active path.
double MeasureGemmPeak(DType dtype, int64_t size = 1024, int reps = 5);

// Short description of the implementation chosen for Gemm with these arguments, e.g.
// "brg:avx512_core_amx_bf16" for oneDNN or "MKL 2025.3 (path)" for an fp32 product on another
// provider (for reports and benchmarks). On the widened path a bf16 product reports the fp32
// implementation it runs on.
std::string GemmImplementation(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               DType ab_dtype, DType c_dtype);

}  // namespace sshsdp::kernels
