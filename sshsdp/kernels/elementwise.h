// Elementwise CPU kernels the engine, the optimizer and the models share.
//
// Plain loops over contiguous fp32 arrays that the compiler vectorises, plus the two
// dtype-aware helpers every gradient writer needs: "write or accumulate fp32 values into an
// fp32/bf16 destination" (the overwrite/accumulate rule of docs/design.md, One step) and "read an
// fp32/bf16 array as fp32". fp32 <-> bf16 bulk conversion lives in numerics/dtype.h.
//
//   Fill(g, n, 0.0f);
//   WriteOrAccumulate(tmp, grad_view, DType::kBF16, n, /*accumulate=*/true);
//   double sq = SumSquares(g, n);
#pragma once

#include <cstdint>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp::kernels {

// x[i] = value.
void Fill(float* x, int64_t n, float value);

// x[i] *= a.
void Scale(float* x, int64_t n, float a);

// out[i] = a[i] + b[i] (out may alias a or b), on the calling thread (the engine's ⑤ add
// runs on the communication thread and must not start a thread team there).
void Add(const float* a, const float* b, float* out, int64_t n);
// The same on every kernel thread (parallel.h): the models' residual adds.
void AddThreaded(const float* a, const float* b, float* out, int64_t n);

// Σ x[i]², accumulated in double.
double SumSquares(const float* x, int64_t n);

// dst = src (accumulate=false) or dst += src (accumulate=true), dst fp32 or bf16; bf16
// results are rounded to nearest even once per element.
void WriteOrAccumulate(const float* src, void* dst, DType dst_dtype, int64_t n, bool accumulate);

// Vectorised fp32 -> bf16 rounding, bit-identical to numerics' FloatToBf16 (round to nearest
// even, NaN stays a quiet NaN, overflow to ±Inf) but branch-free, for hot activation casts:
// 512-bit vectors on CPUs with AVX512-BW/VL, CastToBf16Portable elsewhere (picked once).
void CastToBf16(const float* src, bf16* dst, int64_t n);
// The loop CastToBf16 runs on other CPUs (AVX2 / baseline clones): tests compare the two on
// any CPU.
void CastToBf16Portable(const float* src, bf16* dst, int64_t n);

// dst[i] = the fp32 value of bf16 src[i] (exact), vectorised.
void WidenBf16(const bf16* src, float* dst, int64_t n);

// dst[i] = src[i] rounded to bf16 and kept in fp32 (CastToBf16 then WidenBf16 in one pass):
// what the widened bf16 GEMM path feeds the fp32 product. dst may equal src.
void RoundThroughBf16(const float* src, float* dst, int64_t n);

// dst = float(src) for an fp32 or bf16 source.
void ToFloat(const void* src, DType src_dtype, float* dst, int64_t n);

}  // namespace sshsdp::kernels
