// fp32 -> bf16 rounding of 16 lanes in AVX-512 integer arithmetic, as numerics' FloatToBf16
// (nearest even; NaN stays a quiet NaN; not VCVTNEPS2BF16, which flushes subnormal inputs):
// the one rounding CastToBf16's 512-bit loop (elementwise.cc) and the bf16 attention's
// packing (attention_bf16.cc) share. Internal header: include it only in files whose callers
// are compiled for AVX512-BW/VL (target attributes) and run where the CPU has them.
//
//   SSHSDP_AVX512BW void Cast16(const float* x, bf16* y) {
//     _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), Bf16Of(_mm512_loadu_ps(x)));
//   }
#pragma once

#include <immintrin.h>

#define SSHSDP_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))

namespace sshsdp::kernels {

// The bf16 of each lane in its upper 16 bits (the lower 16 are not cleared).
SSHSDP_AVX512BW inline __m512i RoundedBits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(
      _mm512_maskz_srli_epi32(static_cast<__mmask16>(0xFFFF), u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
}

// The 16 lanes' bf16 bits.
SSHSDP_AVX512BW inline __m256i Bf16Of(__m512 x) {
  const auto all = static_cast<__mmask16>(0xFFFF);
  return _mm512_maskz_cvtepi32_epi16(all, _mm512_maskz_srli_epi32(all, RoundedBits(x), 16));
}

}  // namespace sshsdp::kernels
