// Elementwise loops (see elementwise.h). Kept trivially vectorisable: no aliasing tricks,
// no branches inside the loops; `omp simd` (compiled with -fopenmp-simd, no OpenMP runtime)
// asks for vectorisation where -O2's cost model would not, including reductions.
#include "sshsdp/kernels/elementwise.h"

#include <immintrin.h>

#include <cstring>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/bf16_avx512.h"
#include "sshsdp/kernels/parallel.h"
#include "sshsdp/kernels/vec_math.h"

namespace sshsdp::kernels {

void Fill(float* x, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

void Scale(float* x, int64_t n, float a) {
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

void Add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Split over the kernel threads (parallel.h) from 64K elements.
void AddThreaded(const float* a, const float* b, float* out, int64_t n) {
  ParallelFor(n, 65536, [&](int64_t i0, int64_t i1) { Add(a + i0, b + i0, out + i0, i1 - i0); });
}

double SumSquares(const float* x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void WriteOrAccumulate(const float* src, void* dst, DType dst_dtype, int64_t n, bool accumulate) {
  if (dst_dtype == DType::kF32) {
    float* d = static_cast<float*>(dst);
    if (accumulate) {
      for (int64_t i = 0; i < n; ++i) d[i] += src[i];
    } else {
      std::memcpy(d, src, static_cast<size_t>(n) * sizeof(float));
    }
    return;
  }
  SSHSDP_CHECK(dst_dtype == DType::kBF16, NumericsError,
               "WriteOrAccumulate: destination must be fp32 or bf16, got {}", DTypeName(dst_dtype));
  bf16* d = static_cast<bf16*>(dst);
  if (accumulate) {
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToBf16(Bf16ToFloat(d[i]) + src[i]);
  } else {
    CastToBf16(src, d, n);
  }
}

// The bf16 casts run on every activation of a bf16 GEMM: compiled for AVX2 and AVX-512 as
// well as the baseline ISA, picked at load time by the CPU (GCC function multi-versioning).
#define SSHSDP_CAST_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

SSHSDP_CAST_CLONES void CastToBf16Portable(const float* src, bf16* dst, int64_t n) {
  static_assert(sizeof(bf16) == 2);
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, src + i, 4);
    const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (x >> 16) | 0x40u;
    out[i] = static_cast<uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
  }
}

namespace {

// The same integer rounding in 512-bit vectors: GCC compiles the loop above for AVX-512 with
// 256-bit vectors and a pack/permute/blend sequence (~35 instructions per 16 floats); here
// it is ~11, the tail a masked load and store. Not a hardware conversion (VCVTNEPS2BF16
// flushes subnormal inputs to zero, which FloatToBf16 does not).
// GCC 12's own AVX-512 headers trip -Wmaybe-uninitialized (their _mm512_undefined_*
// placeholders are self-initialised); nothing here reads an undefined value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

SSHSDP_AVX512BW void CastToBf16Avx512(const float* src, bf16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), Bf16Of(_mm512_loadu_ps(src + i)));
  }
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm256_mask_storeu_epi16(dst + i, tail, Bf16Of(_mm512_maskz_loadu_ps(tail, src + i)));
  }
}

#pragma GCC diagnostic pop

using CastFn = void (*)(const float*, bf16*, int64_t);
CastFn ResolveCast() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  return avx512 ? CastToBf16Avx512 : CastToBf16Portable;
}

}  // namespace

void CastToBf16(const float* src, bf16* dst, int64_t n) {
  static const CastFn cast = ResolveCast();
  cast(src, dst, n);
}

SSHSDP_CAST_CLONES void WidenBf16(const bf16* src, float* dst, int64_t n) {
  const uint16_t* in = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t x = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(dst + i, &x, 4);
  }
}

SSHSDP_CAST_CLONES void RoundThroughBf16(const float* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = RoundBf16Vec(src[i]);
}

void ToFloat(const void* src, DType src_dtype, float* dst, int64_t n) {
  if (src_dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  SSHSDP_CHECK(src_dtype == DType::kBF16, NumericsError,
               "ToFloat: source must be fp32 or bf16, got {}", DTypeName(src_dtype));
  Bf16ToFloat(static_cast<const bf16*>(src), dst, static_cast<size_t>(n));
}

}  // namespace sshsdp::kernels
