// GEMMs for linear layers and for the optimizer, on the CPU through oneDNN's matmul primitive.
//
// Linear layers follow nn.Linear: the weight W is [out, in] row-major, activations X are
// [M, in] row-major, Y = X·Wᵀ. Weights may be fp32 or bf16 (runtime precision). For bf16
// weights the fp32 activation operand is rounded to bf16 into a scratch buffer and oneDNN
// multiplies bf16×bf16 with fp32 accumulation (AMX on this hardware): this is where a
// low-precision runtime weight pays off. Every output is written in one of two modes:
// accumulate=false overwrites every element of the destination (garbage and NaN included:
// the engine relies on the first write of a gradient buffer covering it exactly),
// accumulate=true adds into it.
//
//   LinearForward(x, w, DType::kBF16, y, /*m=*/B * T, /*n=*/d_out, /*k=*/d_in);
//   LinearBackwardData(dy, w, DType::kBF16, dx, m, n, k, /*accumulate=*/true);
//   LinearBackwardWeight(dy, x, DType::kBF16, dw, DType::kF32, m, n, k, /*accumulate=*/false);
//   double peak = MeasureGemmPeak(DType::kBF16);   // FLOP/s, the MFU denominator
//
// Primitives are cached by (shape, transposes, dtypes, mode); one oneDNN engine and stream
// serve the whole process and calls are serialized by a mutex (oneDNN's shared scratchpad
// is not safe for concurrent execution), so any thread may call these functions.
#pragma once

#include <cstdint>
#include <string>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp::kernels {

// General matrix product C[m,n] (=|+=) op(A)[m,k] · op(B)[k,n], all row-major and dense.
// op(A) = A when A is stored [m,k], or Aᵀ when trans_a and A is stored [k,m]; the same for
// B ([k,n], or [n,k] with trans_b). A and B are both fp32 or both bf16; C is fp32 or bf16
// (fp32 operands with a bf16 C go through an fp32 scratch). With batch > 1 the operands
// hold `batch` matrices back to back and C[i] = op(A[i])·op(B[i]). k == 0 writes zeros
// (overwrite) or leaves C as it is (accumulate). Throws NumericsError for other dtypes.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
          DType ab_dtype, void* c, DType c_dtype, bool accumulate, int64_t batch = 1);

// Gemm on operands stored inside larger row-major arrays (one head's columns of a packed
// QKV activation, say): lda, ldb and ldc are the row strides, in elements, of A, B and C as
// stored (A stored [m,k], or [k,m] when trans_a, ...). C (=|+=) alpha · op(A) · op(B).
void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                 int64_t lda, const void* b, int64_t ldb, DType ab_dtype, void* c, int64_t ldc,
                 DType c_dtype, bool accumulate, float alpha = 1.0f);

// y[m,n] = x[m,k] · wᵀ, w [n,k] in w_dtype (fp32 or bf16). y is always overwritten.
void LinearForward(const float* x, const void* w, DType w_dtype, float* y, int64_t m, int64_t n,
                   int64_t k);

// dx[m,k] (=|+=) dy[m,n] · w, w [n,k] in w_dtype.
void LinearBackwardData(const float* dy, const void* w, DType w_dtype, float* dx, int64_t m,
                        int64_t n, int64_t k, bool accumulate);

// dw[n,k] (=|+=) dyᵀ · x, dy [m,n], x [m,k]. compute_dtype is the runtime weight's dtype:
// for bf16 the operands are rounded to bf16 first, as in the other two products. dw is
// fp32 or bf16 (a bf16 runtime-gradient buffer).
void LinearBackwardWeight(const float* dy, const float* x, DType compute_dtype, void* dw,
                          DType dw_dtype, int64_t m, int64_t n, int64_t k, bool accumulate);

// Times a size³ GEMM with fp32 or bf16 operands (fp32 output) `reps` times after one
// warm-up and returns the median rate in FLOP/s (2·size³ per product). Uses the threads
// oneDNN is given (OMP_NUM_THREADS).
double MeasureGemmPeak(DType dtype, int64_t size = 1024, int reps = 5);

// Short description of the oneDNN implementation chosen for Gemm with these arguments,
// e.g. "brg:avx512_core_amx_bf16" (for reports and benchmarks).
std::string GemmImplementation(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               DType ab_dtype, DType c_dtype);

}  // namespace sshsdp::kernels
