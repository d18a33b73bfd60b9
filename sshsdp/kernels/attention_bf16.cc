// bf16 causal attention (attention.h): the AVX512-BF16 kernel, and the dispatch between it
// and the chunked oneDNN kernel on rounded operands (attention.cc) everywhere else.
//
// Why a kernel of our own: oneDNN 2.6 runs bf16 products on the strided batched layouts
// attention needs with its `gemm:jit` kernels (a bf16 version of attention.cc's products
// measured 0.6× the fp32 kernel), while VDPBF16PS — two bf16 products summed into each fp32
// lane — runs at twice the fp32 FMA rate on the CPUs that have it. So each (sequence, head)
// plane is packed once into the layouts the products read, in one worker's scratch:
//   Pair = two bf16 in one 32-bit word, the lower index in the low half (VDPBF16PS's order);
//   A operands row-major in pairs along the reduction (Q, dO, P, dS; Qᵀ and dOᵀ paired by
//   rows for dKᵀ and dVᵀ);
//   B operands as [reduction / 2][columns] pairs (Kᵀ, Vᵀ for the score-shaped products; V,
//   K, P, dS paired by rows for the rest), columns zero-padded to whole 16-lane vectors.
// One tile function C (+)= α·A·B (up to 6 rows × 64 columns in registers) does all seven
// products (two forward, five backward); on CPUs with AMX-BF16 (Sapphire Rapids on), where
// VDPBF16PS runs no faster than fp32 FMAs, AMX tiles do them instead (amx_pairs.h: the pairs
// layouts are AMX's own, so the same packed operands load as tiles). The softmax rows write their
// probabilities straight into the packed operand, and the backward's rows compute P and dS and
// write only their packed forms (SoftmaxRowToBf16, GradientRowsToBf16). The backward accumulates
// dKᵀ and dVᵀ in the worker's fp32 scratch across query blocks and writes them once. VDPBF16PS
// treats subnormal bf16 inputs and results as zero, so tiny P and dS values may differ from the
// widened path's (which keeps them); nothing else differs but the order of the fp32 sums. GCC 12's
// AVX-512 headers pass _mm512_undefined_*() as the pass-through operand of the unmasked intrinsics
// (and the reductions) and then warn that it is or may be uninitialized (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string_view>
#include <utility>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/amx_pairs.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/attention_internal.h"
#include "sshsdp/kernels/bf16_avx512.h"
#include "sshsdp/kernels/env_choice.h"
#include "sshsdp/kernels/gemm_provider.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/parallel.h"
#include "sshsdp/kernels/vec_math.h"
#include "sshsdp/numerics/dtype.h"

namespace sshsdp::kernels {
namespace {

namespace ai = attention_internal;

using Pair = uint32_t;

int64_t Up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t Half(int64_t x) { return (x + 1) / 2; }

#define SSHSDP_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// ---- Packing: rounding as numerics' FloatToBf16, 16 floats at a time (bf16_avx512.h's
// RoundedBits / Bf16Of). ----

// x >> 16 per lane.
SSHSDP_BF16_TARGET inline __m512i Shr16(__m512i x) {
  return _mm512_maskz_srli_epi32(static_cast<__mmask16>(0xFFFF), x, 16);
}

SSHSDP_BF16_TARGET inline __mmask16 Lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// Full vectors load and store unmasked: masked stores (and VPMOVDW to memory) are slow on
// AMD's Zen 4/5.
SSHSDP_BF16_TARGET inline __m512 Load(const float* x, int64_t left) {
  return left >= 16 ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(Lanes(left), x);
}

// dst[r][p] = (src[r][2p], src[r][2p+1]) for r < rows, p < ⌈cols/2⌉ (a missing odd column 0):
// each row's bf16 values in order.
SSHSDP_BF16_TARGET void PackRows(const float* src, int64_t ld, int64_t rows, int64_t cols,
                                 Pair* dst) {
  const int64_t pairs = Half(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * ld;
    auto* o = reinterpret_cast<uint16_t*>(dst + r * pairs);
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c), Bf16Of(_mm512_loadu_ps(x + c)));
    }
    if (c < cols) _mm256_mask_storeu_epi16(o + c, Lanes(cols - c), Bf16Of(Load(x + c, cols - c)));
    if (cols % 2 != 0) o[cols] = 0;
  }
}

// dst[j][c] = (src[2j][c], src[2j+1][c]) for j < ⌈rows/2⌉, c < cols (a missing odd row 0);
// columns [cols, ldd) 0.
SSHSDP_BF16_TARGET void PackRowPairs(const float* src, int64_t ld, int64_t rows, int64_t cols,
                                     Pair* dst, int64_t ldd) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t j = 0; j < Half(rows); ++j) {
    const float* a = src + 2 * j * ld;
    const bool has_b = 2 * j + 1 < rows;
    Pair* o = dst + j * ldd;
    for (int64_t c = 0; c < cols; c += 16) {
      const __m512i lo = RoundedBits(Load(a + c, cols - c));
      const __m512i hi = has_b ? RoundedBits(Load(a + ld + c, cols - c)) : _mm512_setzero_si512();
      const __m512i w = _mm512_or_si512(Shr16(lo), _mm512_and_si512(hi, high));
      if (cols - c >= 16 || c + 16 <= ldd) {
        _mm512_storeu_si512(o + c, w);  // the padding columns are zero in `w` too
      } else {
        _mm512_mask_storeu_epi32(o + c, Lanes(cols - c), w);
      }
    }
    std::fill(o + std::min(Up(cols, 16), ldd), o + ldd, Pair{0});
  }
}

// dst[c][r] = src[r][c] for r < rows, c < cols; columns [rows, ldd) of dst 0.
void TransposeWords(const Pair* src, int64_t rows, int64_t cols, Pair* dst, int64_t ldd) {
  for (int64_t c = 0; c < cols; ++c) {
    Pair* o = dst + c * ldd;
    for (int64_t r = 0; r < rows; ++r) o[r] = src[r * cols + c];
    std::fill(o + rows, o + ldd, Pair{0});
  }
}

// ---- The softmax rows fused with the packing of their bf16 results: whole vectors to the
// row's end, lanes past a row's valid keys masked to 0 (no scalar tails). ----

// Lanes [0, n) of a vector (none for n <= 0).
SSHSDP_BF16_TARGET inline __mmask16 LanesUpTo(int64_t n) {
  return n <= 0 ? static_cast<__mmask16>(0) : Lanes(n);
}

// e^x as vec_math.h's ExpVec, 16 lanes (x clamped to [-87, 88], 2^n · degree-6 polynomial;
// NaN stays NaN: VMAXPS / VMINPS return their second operand when one is NaN).
SSHSDP_BF16_TARGET inline __m512 Exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), x));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 fn =
      _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic), magic);
  const __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(1.428606765330187e-06f),
                                    _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693145751953125f), x));
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i n = _mm512_add_epi32(_mm512_cvtps_epi32(fn), _mm512_set1_epi32(127));
  return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(n, 23)));
}

// Forward: row [0, valid) of scores → probabilities, rounded to bf16 into out[0, Up16(e))
// (0 from valid on); returns lse. `row` holds Up16(e) floats, 1 <= valid <= e.
SSHSDP_BF16_TARGET float SoftmaxRowToBf16(float* row, int64_t valid, int64_t e, uint16_t* out) {
  __m512 mv = _mm512_set1_ps(row[0]);
  for (int64_t u0 = 0; u0 < valid; u0 += 16) {
    mv = _mm512_max_ps(_mm512_mask_loadu_ps(mv, LanesUpTo(valid - u0), row + u0), mv);
  }
  const float mx = _mm512_reduce_max_ps(mv);
  const __m512 mxv = _mm512_set1_ps(mx);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t u0 = 0; u0 < valid; u0 += 16) {
    const __mmask16 m = LanesUpTo(valid - u0);
    const __m512 x = _mm512_maskz_mov_ps(m, Exp16(_mm512_sub_ps(_mm512_loadu_ps(row + u0), mxv)));
    _mm512_storeu_ps(row + u0, x);
    acc = _mm512_add_ps(acc, x);
  }
  const float sum = _mm512_reduce_add_ps(acc);
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (int64_t u0 = 0; u0 < e; u0 += 16) {
    const __m512 x = _mm512_maskz_loadu_ps(LanesUpTo(valid - u0), row + u0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + u0), Bf16Of(_mm512_mul_ps(x, inv)));
  }
  return mx + std::log(sum);
}

// Backward, rows r and r + 1 of a block, columns [0, Up16(e)): P = e^(S − lse) on each row's
// valid keys, dS = P ⊙ (dP − D)·scale there, both 0 elsewhere; written rounded as P and dS
// paired by rows (pb, sb) and as dS's rows (sa0, sa1). No fp32 P or dS is kept. Without a
// second row the caller passes valid1 = 0 and a throwaway sa1.
struct RowPair {
  const float *s0, *s1, *dp0, *dp1;
  int64_t valid0, valid1;
  float lse0, lse1, D0, D1;
};

SSHSDP_BF16_TARGET void GradientRowsToBf16(const RowPair& r, int64_t e, float scale, Pair* pb,
                                           Pair* sb, uint16_t* sa0, uint16_t* sa1) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m512 sc = _mm512_set1_ps(scale);
  const __m512 lse0 = _mm512_set1_ps(r.lse0), lse1 = _mm512_set1_ps(r.lse1);
  const __m512 D0 = _mm512_set1_ps(r.D0), D1 = _mm512_set1_ps(r.D1);
  for (int64_t u0 = 0; u0 < e; u0 += 16) {
    const __mmask16 m0 = LanesUpTo(r.valid0 - u0), m1 = LanesUpTo(r.valid1 - u0);
    const __m512 p0 =
        _mm512_maskz_mov_ps(m0, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m0, r.s0 + u0), lse0)));
    const __m512 p1 =
        _mm512_maskz_mov_ps(m1, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m1, r.s1 + u0), lse1)));
    const __m512 d0 = _mm512_mul_ps(
        _mm512_mul_ps(p0, _mm512_sub_ps(_mm512_maskz_loadu_ps(m0, r.dp0 + u0), D0)), sc);
    const __m512 d1 = _mm512_mul_ps(
        _mm512_mul_ps(p1, _mm512_sub_ps(_mm512_maskz_loadu_ps(m1, r.dp1 + u0), D1)), sc);
    const __m512i bd0 = RoundedBits(d0), bd1 = RoundedBits(d1);
    _mm512_storeu_si512(
        pb + u0, _mm512_or_si512(Shr16(RoundedBits(p0)), _mm512_and_si512(RoundedBits(p1), high)));
    _mm512_storeu_si512(sb + u0, _mm512_or_si512(Shr16(bd0), _mm512_and_si512(bd1, high)));
    const auto whole = static_cast<__mmask16>(0xFFFF);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sa0 + u0),
                        _mm512_maskz_cvtepi32_epi16(whole, Shr16(bd0)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sa1 + u0),
                        _mm512_maskz_cvtepi32_epi16(whole, Shr16(bd1)));
  }
}

constexpr int kTileRows = 6;

// C[MR, ≤16·NV] (+)= alpha · A[MR, kp pairs] · B[kp, 16·NV]; the last vector's columns
// masked by `last`.
template <int MR, int NV>
SSHSDP_BF16_TARGET void Tile(int64_t kp, const Pair* a, int64_t lda, const Pair* b, int64_t ldb,
                             float* c, int64_t ldc, __mmask16 last, float alpha, bool acc) {
  __m512 s[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) s[m][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kp; ++p) {
    __m512i bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(b + p * ldb + 16 * v);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(a[m * lda + p]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        s[m][v] = _mm512_dpbf16_ps(s[m][v], reinterpret_cast<__m512bh>(av),
                                   reinterpret_cast<__m512bh>(bv[v]));
      }
    }
  }
  const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mask = v == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
      float* cp = c + m * ldc + 16 * v;
      __m512 r = _mm512_mul_ps(s[m][v], al);
      if (acc) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask, cp));
      _mm512_mask_storeu_ps(cp, mask, r);
    }
  }
}

using TileFn = void (*)(int64_t, const Pair*, int64_t, const Pair*, int64_t, float*, int64_t,
                        __mmask16, float, bool);

template <int NV, int... MR>
constexpr std::array<TileFn, sizeof...(MR)> TilesOf(std::integer_sequence<int, MR...>) {
  return {Tile<MR + 1, NV>...};
}

// [vectors − 1][rows − 1].
const std::array<std::array<TileFn, kTileRows>, 4> kTiles = {
    TilesOf<1>(std::make_integer_sequence<int, kTileRows>{}),
    TilesOf<2>(std::make_integer_sequence<int, kTileRows>{}),
    TilesOf<3>(std::make_integer_sequence<int, kTileRows>{}),
    TilesOf<4>(std::make_integer_sequence<int, kTileRows>{})};

// C[M, N] (+)= alpha · A · B with A [M, kp pairs] (row stride lda pairs) and B [kp, ldb]
// pairs, ldb ≥ N rounded up to 16, the padding columns 0.
void GemmPairs(int64_t M, int64_t N, int64_t kp, const Pair* a, int64_t lda, const Pair* b,
               int64_t ldb, float* c, int64_t ldc, float alpha, bool acc) {
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t nn = std::min<int64_t>(64, N - n0);
    const int64_t nv = (nn + 15) / 16;
    const int64_t tail = nn - 16 * (nv - 1);
    const auto last = static_cast<__mmask16>((uint32_t{1} << tail) - 1);
    for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
      const int64_t mr = std::min<int64_t>(kTileRows, M - m0);
      kTiles[nv - 1][mr - 1](kp, a + m0 * lda, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, last,
                             alpha, acc);
    }
  }
}

// One plane's sizes and the floats of its worker's scratch (ForwardPlane / BackwardPlane
// carve it in this order).
struct Plane {
  int64_t T, dh, block, dh2, dhv, T16, T2;
  Plane(int T_, int dh_, int block_)
      : T(T_),
        dh(dh_),
        block(std::min(block_, std::max(T_, 1))),
        dh2(Half(dh_)),
        dhv(Up(std::max(dh_, 1), 16)),
        T16(Up(std::max(T_, 1), 16)),
        T2(Half(T_)) {}
  int64_t Words() const { return std::max(T * dh2, T2 * dh); }  // a pack before its transpose
  int64_t ForwardFloats() const {
    return T * dh2 + dh2 * T16 + T2 * dhv + block * T16 + block * Half(T16) + Words();
  }
  int64_t BackwardFloats() const {
    return 2 * T * dh2 + 2 * dh2 * T16 + T2 * dhv + 2 * dh * T2 + 2 * block * T16 +
           2 * Half(block) * T16 + (block + 1) * Half(T16) + 2 * dh * T16 + T + Words();
  }
};

// Carves consecutive regions out of a worker's scratch.
struct Carver {
  float* at;
  Pair* pairs(int64_t n) { return reinterpret_cast<Pair*>(std::exchange(at, at + n)); }
  float* floats(int64_t n) { return std::exchange(at, at + n); }
};

using GemmFn = void (*)(int64_t, int64_t, int64_t, const Pair*, int64_t, const Pair*, int64_t,
                        float*, int64_t, float, bool);

struct Layout {
  int B, T, H, dh, block;
  int64_t d, d3;
  float scale;
  GemmFn gemm;  // GemmPairs or amx::GemmPairs
};

// The transpose of a [T, dh] operand (row stride ld) as a B operand [⌈dh/2⌉][T16]: Kᵀ, Vᵀ.
void PackTransposedB(const float* x, int64_t ld, const Plane& P, Pair* words, Pair* dst) {
  PackRows(x, ld, P.T, P.dh, words);
  TransposeWords(words, P.T, P.dh2, dst, P.T16);
}

// The transpose of a [T, dh] operand as an A operand [dh][⌈T/2⌉] (pairs of rows): Qᵀ, dOᵀ.
void PackTransposedA(const float* x, int64_t ld, const Plane& P, Pair* words, Pair* dst) {
  PackRowPairs(x, ld, P.T, P.dh, words, P.dh);
  TransposeWords(words, P.T2, P.dh, dst, P.T2);
}

void ForwardPlane(const Layout& L, const Plane& P, int64_t plane, const float* qkv, float* out,
                  float* lse, float* scratch) {
  const int64_t b = plane / L.H, h = plane % L.H, T = L.T;
  const float* q = qkv + b * T * L.d3 + h * L.dh;
  Carver cv{scratch};
  Pair* qa = cv.pairs(T * P.dh2);         // Q rows (S = Q·Kᵀ)
  Pair* kt = cv.pairs(P.dh2 * P.T16);     // Kᵀ
  Pair* vb = cv.pairs(P.T2 * P.dhv);      // V paired by rows (O = P·V)
  float* s = cv.floats(P.block * P.T16);  // scores, then probabilities
  Pair* pa = cv.pairs(P.block * Half(P.T16));
  Pair* words = cv.pairs(P.Words());
  PackRows(q, L.d3, T, L.dh, qa);
  PackTransposedB(q + L.d, L.d3, P, words, kt);
  PackRowPairs(q + 2 * L.d, L.d3, T, L.dh, vb, P.dhv);
  for (int64_t q0 = 0; q0 < T; q0 += L.block) {
    const int64_t nr = std::min<int64_t>(L.block, T - q0), e = q0 + nr;
    L.gemm(nr, e, P.dh2, qa + q0 * P.dh2, P.dh2, kt, P.T16, s, P.T16, L.scale, false);
    const int64_t lda = P.T16 / 2;  // pa's rows: Up16(e) bf16 written, Half(e) pairs read
    for (int64_t r = 0; r < nr; ++r) {
      lse[plane * T + q0 + r] =
          SoftmaxRowToBf16(s + r * P.T16, q0 + r + 1, e, reinterpret_cast<uint16_t*>(pa + r * lda));
    }
    L.gemm(nr, L.dh, Half(e), pa, lda, vb, P.dhv, out + (b * T + q0) * L.d + h * L.dh, L.d, 1.0f,
           false);
  }
}

// dk[t][c] = dkt[c][t] and dv[t][c] = dvt[c][t] (dv at dk + dv_offset) for t < T, c < dh,
// rows of dk ld apart: gathered 16 columns at a time, written as vectors.
SSHSDP_BF16_TARGET void WriteTransposed(const float* dkt, const float* dvt, const Plane& P,
                                        float* dk, int64_t dv_offset, int64_t ld) {
  const __m512i lanes =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(P.T16)));
  for (int64_t t = 0; t < P.T; ++t) {
    float* row = dk + t * ld;
    for (int64_t c = 0; c < P.dh; c += 16) {
      const __mmask16 m = Lanes(P.dh - c);
      const __m512i at =
          _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int>(c * P.T16 + t)));
      _mm512_mask_storeu_ps(row + c, m,
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, at, dkt, 4));
      _mm512_mask_storeu_ps(row + dv_offset + c, m,
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, at, dvt, 4));
    }
  }
}

// dK and dV are accumulated transposed (dKᵀ = Qᵀ·dS, dVᵀ = dOᵀ·P, [dh, T]) so that P and dS
// are paired by rows — as they are computed — instead of transposed every block.
void BackwardPlane(const Layout& L, const Plane& P, int64_t plane, const float* dout,
                   const float* qkv, const float* out, const float* lse, float* dqkv,
                   float* scratch) {
  const int64_t b = plane / L.H, h = plane % L.H, T = L.T;
  const float* q = qkv + b * T * L.d3 + h * L.dh;
  const float* go = dout + b * T * L.d + h * L.dh;
  float* dq = dqkv + b * T * L.d3 + h * L.dh;
  Carver cv{scratch};
  Pair* qa = cv.pairs(T * P.dh2);      // Q rows (S)
  Pair* ga = cv.pairs(T * P.dh2);      // dO rows (dP = dO·Vᵀ)
  Pair* kt = cv.pairs(P.dh2 * P.T16);  // Kᵀ (S)
  Pair* vt = cv.pairs(P.dh2 * P.T16);  // Vᵀ (dP)
  Pair* kb = cv.pairs(P.T2 * P.dhv);   // K paired by rows (dQ = dS·K)
  Pair* qt = cv.pairs(P.dh * P.T2);    // Qᵀ (dKᵀ)
  Pair* gt = cv.pairs(P.dh * P.T2);    // dOᵀ (dVᵀ)
  float* p = cv.floats(P.block * P.T16);
  float* dp = cv.floats(P.block * P.T16);
  Pair* pb = cv.pairs(Half(P.block) * P.T16);        // P paired by rows (dVᵀ)
  Pair* sb = cv.pairs(Half(P.block) * P.T16);        // dS paired by rows (dKᵀ)
  Pair* sa = cv.pairs((P.block + 1) * Half(P.T16));  // dS rows (dQ); one spare row
  float* dkt = cv.floats(P.dh * P.T16);
  float* dvt = cv.floats(P.dh * P.T16);
  float* D = cv.floats(T);
  Pair* words = cv.pairs(P.Words());
  PackRows(q, L.d3, T, L.dh, qa);
  PackRows(go, L.d, T, L.dh, ga);
  PackTransposedB(q + L.d, L.d3, P, words, kt);
  PackTransposedB(q + 2 * L.d, L.d3, P, words, vt);
  PackRowPairs(q + L.d, L.d3, T, L.dh, kb, P.dhv);
  PackTransposedA(q, L.d3, P, words, qt);
  PackTransposedA(go, L.d, P, words, gt);
  for (int64_t t = 0; t < T; ++t) {
    D[t] = ai::Dot(go + t * L.d, out + (b * T + t) * L.d + h * L.dh, L.dh);
  }
  // The last query block meets every key: it writes dKᵀ and dVᵀ, earlier blocks add to them.
  const int64_t last_q0 = (T - 1) / L.block * L.block;
  for (int64_t q0 = last_q0; q0 >= 0; q0 -= L.block) {
    const int64_t nr = std::min<int64_t>(L.block, T - q0), e = q0 + nr, kr = Half(nr);
    const bool acc = q0 != last_q0;
    L.gemm(nr, e, P.dh2, qa + q0 * P.dh2, P.dh2, kt, P.T16, p, P.T16, L.scale, false);
    L.gemm(nr, e, P.dh2, ga + q0 * P.dh2, P.dh2, vt, P.T16, dp, P.T16, 1.0f, false);
    const int64_t lda = P.T16 / 2;  // sa's rows: Up16(e) bf16 written, Half(e) pairs read
    auto* sa16 = reinterpret_cast<uint16_t*>(sa);
    for (int64_t r = 0; r < nr; r += 2) {
      const bool two = r + 1 < nr;
      const int64_t r1 = two ? r + 1 : r;
      const RowPair rows{p + r * P.T16,
                         p + r1 * P.T16,
                         dp + r * P.T16,
                         dp + r1 * P.T16,
                         q0 + r + 1,
                         two ? q0 + r + 2 : 0,
                         lse[plane * T + q0 + r],
                         lse[plane * T + q0 + r1],
                         D[q0 + r],
                         D[q0 + r1]};
      GradientRowsToBf16(rows, e, L.scale, pb + r / 2 * P.T16, sb + r / 2 * P.T16, sa16 + r * P.T16,
                         sa16 + (r + 1) * P.T16);
    }
    L.gemm(L.dh, e, kr, gt + q0 / 2, P.T2, pb, P.T16, dvt, P.T16, 1.0f, acc);
    L.gemm(L.dh, e, kr, qt + q0 / 2, P.T2, sb, P.T16, dkt, P.T16, 1.0f, acc);
    L.gemm(nr, L.dh, Half(e), sa, lda, kb, P.dhv, dq + q0 * L.d3, L.d3, 1.0f, false);
  }
  WriteTransposed(dkt, dvt, P, dq + L.d, L.d, L.d3);
}

void CheckBf16Shape(const char* what, int B, int T, int H, int dh, int block) {
  ai::CheckShape(what, B, T, H, dh, block);
  SSHSDP_CHECK(block % 2 == 0, NumericsError,
               "{}: the bf16 attention needs an even query block (got {}): its products pair "
               "query rows",
               what, block);
}

// Workers the native kernel runs with this scratch (at most one per kernel thread and plane).
int64_t Workers(const char* what, int64_t planes, int64_t per_worker, int64_t scratch_floats) {
  const int64_t fit = per_worker > 0 ? scratch_floats / per_worker : planes;
  SSHSDP_CHECK(fit >= 1 || planes == 0, NumericsError,
               "{}: scratch of {} floats is below one worker's {} (size it with "
               "AttentionBf16ScratchFloats for this shape)",
               what, scratch_floats, per_worker);
  return std::clamp<int64_t>(std::min<int64_t>(fit, KernelThreads()), 1,
                             std::max<int64_t>(planes, 1));
}

// f(plane, worker scratch) over every plane, planes dealt round-robin to `workers` slots.
template <typename F>
void ForWorkers(int64_t planes, int64_t workers, int64_t per_worker, float* scratch, F&& f) {
  ParallelFor(workers, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      for (int64_t plane = w; plane < planes; plane += workers) f(plane, scratch + w * per_worker);
    }
  });
}

Bf16AttentionProducts ParseProducts(std::string_view name) {
  if (name == "auto") {
    return amx::Available() ? Bf16AttentionProducts::kAmx : Bf16AttentionProducts::kAvx512Bf16;
  }
  if (name == "avx512bf16") return Bf16AttentionProducts::kAvx512Bf16;
  SSHSDP_CHECK(name == "amx", NumericsError,
               "bf16 attention products '{}' are not one of auto, amx, avx512bf16", name);
  SSHSDP_CHECK(amx::Available(), NumericsError,
               "bf16 attention products 'amx' requested, but this CPU has no AMX-BF16 (or the "
               "kernel refused its tile state); use 'auto' or 'avx512bf16'");
  return Bf16AttentionProducts::kAmx;
}

EnvChoice<Bf16AttentionProducts> g_products("SSHSDP_BF16_ATTENTION_PRODUCTS", &ParseProducts);

Layout MakeLayout(int B, int T, int H, int dh, int block) {
  const int64_t d = static_cast<int64_t>(H) * dh;
  const GemmFn gemm =
      ActiveBf16AttentionProducts() == Bf16AttentionProducts::kAmx ? &amx::GemmPairs : &GemmPairs;
  return {B,   T, H, dh, block, d, 3 * d, dh > 0 ? 1.0f / std::sqrt(static_cast<float>(dh)) : 1.0f,
          gemm};
}

}  // namespace

Bf16AttentionProducts ActiveBf16AttentionProducts() { return g_products.Get(); }

void SetBf16AttentionProducts(Bf16AttentionProducts products) {
  g_products.Set(ParseProducts(products == Bf16AttentionProducts::kAmx ? "amx" : "avx512bf16"));
}

bool NativeBf16AttentionActive() {
  static const bool cpu = __builtin_cpu_supports("avx512bf16") != 0;
  return cpu && ActiveBf16GemmPath() == Bf16GemmPath::kNative;
}

std::string AttentionPathDescription(bool bf16) {
  const std::string_view fp32 = GemmProviderLabel(ActiveGemmProvider());  // the fp32 products'
  if (!bf16) return fmt::format("fp32 ({})", fp32);
  if (!NativeBf16AttentionActive()) {
    return fmt::format("bf16 widened (fp32 {} on rounded operands)", fp32);
  }
  return ActiveBf16AttentionProducts() == Bf16AttentionProducts::kAmx ? "bf16 (AMX kernel)"
                                                                      : "bf16 (AVX512-BF16 kernel)";
}

int64_t AttentionBf16ScratchFloats(int B, int T, int H, int dh, int block, int threads) {
  CheckBf16Shape("AttentionBf16ScratchFloats", B, T, H, dh, block);
  if (!NativeBf16AttentionActive()) return ai::ChunkedScratchFloats(B, T, H, dh, block, true);
  const int64_t workers = std::clamp<int64_t>(threads > 0 ? threads : KernelThreads(), 1,
                                              std::max<int64_t>(int64_t{B} * H, 1));
  return workers * Plane(T, dh, block).BackwardFloats();
}

namespace {

// The widened path (`chunked`, on the chunked kernel's scratch) or the native kernel
// (`per_plane`, each worker `per_worker` floats of the scratch), after the checks both share.
template <typename Chunked, typename PerPlane>
void RunBf16(const char* what, int64_t scratch_floats, int B, int T, int H, int dh, int block,
             bool backward, float* scratch, Chunked&& chunked, PerPlane&& per_plane) {
  CheckBf16Shape(what, B, T, H, dh, block);
  if (!NativeBf16AttentionActive()) {
    const int64_t need = ai::ChunkedScratchFloats(B, T, H, dh, block, true);
    SSHSDP_CHECK(scratch_floats >= need, NumericsError, "{}: scratch of {} floats, {} needed", what,
                 scratch_floats, need);
    chunked();
    return;
  }
  if (T == 0) return;
  const Plane P(T, dh, block);
  const Layout L = MakeLayout(B, T, H, dh, block);
  const int64_t planes = int64_t{B} * H, per = backward ? P.BackwardFloats() : P.ForwardFloats();
  ForWorkers(planes, Workers(what, planes, per, scratch_floats), per, scratch,
             [&](int64_t plane, float* s) { per_plane(L, P, plane, s); });
}

}  // namespace

void CausalAttentionForwardBf16(const float* qkv, float* out, float* lse, float* scratch,
                                int64_t scratch_floats, int B, int T, int H, int dh, int block) {
  RunBf16(
      "CausalAttentionForwardBf16", scratch_floats, B, T, H, dh, block, false, scratch,
      [&] { ai::ChunkedForward(qkv, out, lse, scratch, B, T, H, dh, block, true); },
      [&](const Layout& L, const Plane& P, int64_t plane, float* s) {
        ForwardPlane(L, P, plane, qkv, out, lse, s);
      });
}

void CausalAttentionBackwardBf16(const float* dout, const float* qkv, const float* out,
                                 const float* lse, float* dqkv, float* scratch,
                                 int64_t scratch_floats, int B, int T, int H, int dh, int block) {
  RunBf16(
      "CausalAttentionBackwardBf16", scratch_floats, B, T, H, dh, block, true, scratch,
      [&] { ai::ChunkedBackward(dout, qkv, out, lse, dqkv, scratch, B, T, H, dh, block, true); },
      [&](const Layout& L, const Plane& P, int64_t plane, float* s) {
        BackwardPlane(L, P, plane, dout, qkv, out, lse, dqkv, s);
      });
}

}  // namespace sshsdp::kernels
