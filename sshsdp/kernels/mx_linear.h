// Linear-layer GEMMs whose weight may be an MXFP8 runtime weight: FP8 element codes plus
// UE8M0 block scales already relaid out into a kernel scale layout (numerics/scale_layout.h)
// by the engine's Tw stage, for the WHOLE packed runtime weight (e.g. all Q/K/V heads as one
// [3d, d] projection).
//
// On CPU the weight is dequantized into fp32 scratch — element · 2^(scale-127), exact — and
// the product runs as an fp32 GEMM. This is numerically the same function an MX GPU GEMM
// computes (it applies the block scales to its operands and accumulates in fp32); it is not
// a speed claim: the CPU path pays a dequantization pass per GEMM. Activations stay fp32
// (no 1x32 activation quantization on this path), and the weight-gradient GEMM of an MX
// weight runs in fp32 (LinearComputeDType). The scale lookup reads the kernel layout
// (row-major, block grid, DeepGEMM MN-major, cuBLAS swizzle) exactly as a kernel would, so a
// wrong relayout shows up as a wrong product, not as a silently fixed-up one.
//
//   WeightView w{codes, DType::kE4M3, scales, ScaleLayout::kCublasSwizzle};
//   LinearForward(x, w, y, /*m=*/BT, /*n=*/3 * d, /*k=*/d);          // y = x · dequant(W)ᵀ
//   LinearBackwardData(dy, w, dx, BT, 3 * d, d, /*accumulate=*/false);
//   LinearBackwardWeight(dy, x, LinearComputeDType(w.dtype), dw, DType::kBF16,
//                        BT, 3 * d, d, /*accumulate=*/false);           // matmul.h
//   std::vector<float> f(n * k);                     // the weight itself, dequantized:
//   MxDequantizeOperand(codes, DType::kE4M3, scales, w.layout, n, k, f.data());
//
// fp32 and bf16 weights pass straight to matmul.h (scales ignored).
#pragma once

#include <cstdint>

#include "sshsdp/kernels/matmul.h"
#include "sshsdp/numerics/dtype.h"
#include "sshsdp/numerics/scale_layout.h"

namespace sshsdp::kernels {

// True for the FP8 element types an MX weight holds (E4M3, E5M2).
inline bool IsMxElement(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }

// A runtime weight operand [n, k] row-major: fp32 / bf16 data, or MX codes + scales.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  const uint8_t* scales = nullptr;  // MX only: per-row scale matrix [n, ceil(k/32)] in `layout`
  ScaleLayout layout = ScaleLayout::kRowMajor;
};

// out[mn, k] = dequantized MX operand (codes row-major [mn, k], scales in `layout` for the
// per-row scale matrix [mn, ceil(k/32)], block_rows 32). Throws NumericsError on a non-FP8
// element type, null scales, or a layout whose padding is not zero.
void MxDequantizeOperand(const uint8_t* codes, DType elem, const uint8_t* scales,
                         ScaleLayout layout, int64_t mn, int64_t k, float* out);

// y[m,n] = x[m,k] · wᵀ (overwrites y). A bf16 x (matmul.h's LinearInput) needs a bf16 w.
void LinearForward(LinearInput x, const WeightView& w, float* y, int64_t m, int64_t n, int64_t k);
// dx[m,k] (=|+=) dy[m,n] · w.
void LinearBackwardData(LinearInput dy, const WeightView& w, float* dx, int64_t m, int64_t n,
                        int64_t k, bool accumulate);
// Compute dtype of the weight-gradient GEMM for a weight of this dtype: bf16 for bf16, fp32
// for fp32 and MX weights.
inline DType LinearComputeDType(DType w_dtype) {
  return w_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

}  // namespace sshsdp::kernels
