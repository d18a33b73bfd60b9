// bf16 GEMMs on AMX tiles (amx_gemm.h).
//
// A "word" is two bf16 of consecutive k, the lower k in the low half. Packed per call:
//   A, one 32-row block at a time (in each worker's scratch): [k tile][row tile 0..1]
//     [16 rows][16 words] — tile rows are op(A)'s rows; an A stored untransposed loads its
//     tiles from its own rows instead where a block is whole (rows and k) and its row
//     stride is not a multiple of 2 KiB;
//   B, 512 columns at a time: per 32 columns [k tile][column tile 0..1][16 words of k]
//     [16 columns] — AMX's VNNI layout.
// Rows, columns and k past the matrix are packed as zeros, so every tile is whole and only
// the stores are masked. Each packed tile is 1 KiB contiguous, and a block's two tiles of a k
// tile are packed together. A stored row becomes a tile row by one masked load (A not
// transposed); B not transposed takes two 64-byte rows per tile row pair, interleaved and put
// back in column order; a transposed A is read the same way and transposed 16 × 16 words
// (so each 64-byte line of it is read once, not once per tile), a transposed B (w in the
// forward) as rows of k transposed 16 × 16 words.
//
// Tiles: C in tmm0-3 (2i + j: rows 16i.., columns 16j..), A in tmm4-5, B in tmm6-7. A block
// of 32 × 32 results is summed over at most kKcWords words of k; with more, the partial sums
// wait in an fp32 scratch of whole tiles and the last k block finishes into C. That scratch
// holds one pass of rows × one 512-column panel, a pass at most kPartialFloats (4 MiB) of
// sums: the order of the sums is the same whatever the passes, so the bits are too.
#include "sshsdp/kernels/amx_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/amx_pairs.h"
#include "sshsdp/kernels/env_choice.h"
#include "sshsdp/kernels/parallel.h"

namespace sshsdp::kernels {
namespace {

Bf16GemmKernel ParseBf16GemmKernel(std::string_view name) {
  if (name == "auto") return amx::Available() ? Bf16GemmKernel::kAmx : Bf16GemmKernel::kOneDnn;
  if (name == "onednn") return Bf16GemmKernel::kOneDnn;
  SSHSDP_CHECK(name == "amx", NumericsError,
               "bf16 GEMM kernel '{}' is not one of auto, amx, onednn", name);
  SSHSDP_CHECK(amx::Available(), NumericsError,
               "bf16 GEMM kernel 'amx' requested, but this CPU has no AMX-BF16 (or the kernel "
               "refused this process its tile state): use 'auto' or 'onednn'");
  return Bf16GemmKernel::kAmx;
}

EnvChoice<Bf16GemmKernel> g_kernel("SSHSDP_BF16_GEMM_KERNEL", &ParseBf16GemmKernel);

}  // namespace

Bf16GemmKernel ActiveBf16GemmKernel() { return g_kernel.Get(); }

void SetBf16GemmKernel(Bf16GemmKernel kernel) {
  g_kernel.Set(ParseBf16GemmKernel(Bf16GemmKernelName(kernel)));
}

std::string_view Bf16GemmKernelName(Bf16GemmKernel kernel) {
  return kernel == Bf16GemmKernel::kAmx ? "amx" : "onednn";
}

}  // namespace sshsdp::kernels

// GCC 12's AVX-512 intrinsics (the masked zero loads) trip its own uninitialized warnings where
// they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The GEMM's internals live in their own namespace: a unity build (the library built as a
// subdirectory of a user's project) merges this file's anonymous namespace with amx_pairs.cc's.
namespace sshsdp::kernels::amx::gemm_tiles {
namespace {

#define SSHSDP_AMX_GEMM_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")))

using Word = uint32_t;

constexpr int64_t kT = 16;                            // tile rows; words (or floats) per tile row
constexpr int64_t kTileWords = kT * kT;               // one 1 KiB tile
constexpr int64_t kBlock = 2 * kT;                    // result rows and columns of a block
constexpr int64_t kKcWords = 512;                     // k words per block (1,024 bf16)
constexpr int64_t kNc = 512;                          // columns of B packed at once
constexpr int64_t kKtileWords = 2 * kTileWords;       // one k tile of a block's two A (or B) tiles
constexpr int64_t kPartialFloats = int64_t{1} << 20;  // partial sums of one pass: 4 MiB

// A calling thread's scratch, kept for the thread's life: the partial sums of one pass
// (kPartialFloats at most) and one k block of a panel of packed B (1 MiB at most).
struct Scratch {
  std::vector<float> partial;
  std::vector<Word> bpack;
};

Scratch& ThreadScratch() {
  thread_local Scratch s;
  return s;
}

std::atomic<int64_t> g_calls{0};

int64_t Clamp(int64_t v, int64_t hi) { return std::max<int64_t>(0, std::min(v, hi)); }

// The 32 bf16 of a row at elements e.. (zeros from element k on).
SSHSDP_AMX_GEMM_TARGET inline __m512i Load32(const bf16* row, int64_t e, int64_t k) {
  const int64_t valid = k - e;
  if (valid <= 0) return _mm512_setzero_si512();
  const __mmask32 mask = valid >= 32 ? ~__mmask32{0} : (__mmask32{1} << valid) - 1;
  return _mm512_maskz_loadu_epi16(mask, row + e);
}

// The words (x[k0][c0 + i], x[k0 + 1][c0 + i]) of a matrix stored [k, ld] for i < 32, from one
// 64-byte load per row (zeros for i ≥ valid and from row k on), as unpacking leaves them:
// lo holds i = 8⌊j/4⌋ + j mod 4 in word j, hi i + 4 (see kLoColumn).
SSHSDP_AMX_GEMM_TARGET inline void WordPairs32(const bf16* x, int64_t ld, int64_t k0, int64_t k,
                                               int64_t c0, int64_t valid, __m512i& lo,
                                               __m512i& hi) {
  if (valid <= 0 || k0 >= k) {
    lo = hi = _mm512_setzero_si512();
    return;
  }
  const __mmask32 mask = valid >= 32 ? ~__mmask32{0} : (__mmask32{1} << valid) - 1;
  const __m512i l = _mm512_maskz_loadu_epi16(mask, x + k0 * ld + c0);
  const __m512i h =
      k0 + 1 < k ? _mm512_maskz_loadu_epi16(mask, x + (k0 + 1) * ld + c0) : _mm512_setzero_si512();
  lo = _mm512_unpacklo_epi16(l, h);
  hi = _mm512_unpackhi_epi16(l, h);
}

// The column (0..31) that word j of WordPairs32's lo holds; hi holds it + 4.
constexpr int kLoColumn[16] = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};

// v[i] word j -> v[j] word i.
SSHSDP_AMX_GEMM_TARGET inline void Transpose16(__m512i v[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {  // 128-bit lane l of t[2i]: v2i[4l], v2i+1[4l], v2i[4l+1], ...
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // lane l of u[4g + c]: rows 4g..4g+3 of column 4l + c
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // column 4l + c: lane l of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    v[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    v[4 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    v[8 + c] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    v[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

SSHSDP_AMX_GEMM_TARGET inline void StoreTile(const __m512i v[16], Word* dst) {
  for (int r = 0; r < kT; ++r) _mm512_store_si512(dst + r * kT, v[r]);
}

// One operand's view: op(X) is [rows, k]; X stored [rows, k] (straight) or [k, rows].
struct Operand {
  const bf16* p;
  int64_t ld, rows, k;
  bool straight;  // rows of the stored matrix are op(X)'s rows
};

// A block's two tiles of op(X) rows r0..r0+31, words w..w+15, as tile rows (A's layout):
// rows r0.. into dst[0], r0 + 16.. into dst[1].
SSHSDP_AMX_GEMM_TARGET void PackRowsTiles(const Operand& x, int64_t r0, int64_t w,
                                          Word* const dst[2]) {
  __m512i v[16];
  const int64_t e = 2 * w;
  if (x.straight) {
    for (int t = 0; t < 2; ++t) {
      const int64_t vrows = Clamp(x.rows - r0 - t * kT, kT);
      for (int r = 0; r < kT; ++r) {
        v[r] = r < vrows ? Load32(x.p + (r0 + t * kT + r) * x.ld, e, x.k) : _mm512_setzero_si512();
      }
      StoreTile(v, dst[t]);
    }
    return;
  }
  // Stored columns r0.. are the tiles' rows: word q of row i = stored rows e + 2q, e + 2q + 1
  // at column r0 + i, i.e. the transposes of WordPairs32's lo and hi over q.
  __m512i hi[16];
  const int64_t valid = Clamp(x.rows - r0, 2 * kT);
  for (int q = 0; q < kT; ++q) WordPairs32(x.p, x.ld, e + 2 * q, x.k, r0, valid, v[q], hi[q]);
  Transpose16(v);
  Transpose16(hi);
  for (int j = 0; j < kT; ++j) {
    const int i = kLoColumn[j];
    _mm512_store_si512(dst[i / kT] + (i % kT) * kT, v[j]);
    _mm512_store_si512(dst[(i + 4) / kT] + ((i + 4) % kT) * kT, hi[j]);
  }
}

// A block's two VNNI tiles of op(Y) = Yᵀ-view: words w..w+15 of k by columns c0..c0+31 (c0..
// into dst[0], c0 + 16.. into dst[1]), where op(Y) is [k, cols] and y describes Y as an
// Operand over its columns (straight: stored [cols, k]).
SSHSDP_AMX_GEMM_TARGET void PackVnniTiles(const Operand& y, int64_t c0, int64_t w,
                                          Word* const dst[2]) {
  __m512i v[16];
  const int64_t e = 2 * w;
  if (y.straight) {  // column c of a tile = the words of stored row c0 + c
    for (int t = 0; t < 2; ++t) {
      const int64_t vcols = Clamp(y.rows - c0 - t * kT, kT);
      for (int c = 0; c < kT; ++c) {
        v[c] = c < vcols ? Load32(y.p + (c0 + t * kT + c) * y.ld, e, y.k) : _mm512_setzero_si512();
      }
      Transpose16(v);
      StoreTile(v, dst[t]);
    }
    return;
  }
  // Row q of a tile = stored rows e + 2q, e + 2q + 1 interleaved: WordPairs32's words put back
  // in column order (an index ≥ 16 picks from hi).
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const int64_t valid = Clamp(y.rows - c0, 2 * kT);
  for (int q = 0; q < kT; ++q) {
    __m512i lo, hi;
    WordPairs32(y.p, y.ld, e + 2 * q, y.k, c0, valid, lo, hi);
    _mm512_store_si512(dst[0] + q * kT, _mm512_permutex2var_epi32(lo, first, hi));
    _mm512_store_si512(dst[1] + q * kT, _mm512_permutex2var_epi32(lo, second, hi));
  }
}

// C[rows, cols] (+)= alpha · t (a 16 × 16 tile in memory), rows and cols ≤ 16.
SSHSDP_AMX_GEMM_TARGET void Finish(const float* t, float* c, int64_t ldc, int64_t rows,
                                   int64_t cols, float alpha, bool acc) {
  const auto mask = static_cast<__mmask16>((uint32_t{1} << cols) - 1);
  const __m512 al = _mm512_set1_ps(alpha);
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v = _mm512_load_ps(t + r * kT);
    if (alpha != 1.0f) v = _mm512_mul_ps(v, al);
    if (acc) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, c + r * ldc));
    _mm512_mask_storeu_ps(c + r * ldc, mask, v);
  }
}

// Where a block's sums go.
struct Out {
  float* partial;         // whole-tile partial sums between k blocks of one panel, or nullptr
  int64_t ldp, i0p, j0c;  // partial's row stride (a panel's columns); its first row (the
                          // pass's) and column (the panel's)
  bool load, store;       // load partial sums first; store them (not the last k block)
  float* c;
  int64_t ldc, m, n;
  float alpha;
  bool acc;
};

// A block's two row tiles per k tile, in bytes: packed (1 KiB tiles, 64-byte rows), or
// straight from op(A)'s stored rows.
struct ATiles {
  const char* base;
  int64_t kt_step, tile_step, stride;
};

// The 32 × 32 block at (i0, j0) over ktiles k tiles of A and packed B (bp).
SSHSDP_AMX_GEMM_TARGET void Block(int64_t ktiles, const ATiles& at, const Word* bp, const Out& o,
                                  int64_t i0, int64_t j0) {
  float* p = o.partial ? o.partial + (i0 - o.i0p) * o.ldp + (j0 - o.j0c) : nullptr;
  const int64_t sp = o.ldp * 4;
  if (o.load) {
    _tile_loadd(0, p, sp);
    _tile_loadd(1, p + kT, sp);
    _tile_loadd(2, p + kT * o.ldp, sp);
    _tile_loadd(3, p + kT * o.ldp + kT, sp);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    _tile_loadd(4, at.base + kt * at.kt_step, at.stride);
    _tile_loadd(5, at.base + kt * at.kt_step + at.tile_step, at.stride);
    _tile_loadd(6, bp + kt * kKtileWords, 64);
    _tile_loadd(7, bp + kt * kKtileWords + kTileWords, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  if (o.store) {
    _tile_stored(0, p, sp);
    _tile_stored(1, p + kT, sp);
    _tile_stored(2, p + kT * o.ldp, sp);
    _tile_stored(3, p + kT * o.ldp + kT, sp);
    return;
  }
  float* c = o.c + i0 * o.ldc + j0;
  const int64_t sc = o.ldc * 4;
  if (!o.acc && o.alpha == 1.0f && o.m - i0 >= kBlock && o.n - j0 >= kBlock) {
    _tile_stored(0, c, sc);
    _tile_stored(1, c + kT, sc);
    _tile_stored(2, c + kT * o.ldc, sc);
    _tile_stored(3, c + kT * o.ldc + kT, sc);
    return;
  }
  alignas(64) float stage[4][kTileWords];
  _tile_stored(0, stage[0], 64);
  _tile_stored(1, stage[1], 64);
  _tile_stored(2, stage[2], 64);
  _tile_stored(3, stage[3], 64);
  for (int t = 0; t < 4; ++t) {
    const int64_t r = i0 + kT * (t / 2), col = j0 + kT * (t % 2);
    const int64_t rows = Clamp(o.m - r, kT), cols = Clamp(o.n - col, kT);
    if (rows > 0 && cols > 0)
      Finish(stage[t], o.c + r * o.ldc + col, o.ldc, rows, cols, o.alpha, o.acc);
  }
}

}  // namespace

void Run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda,
         const bf16* b, int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) {
      for (int64_t r = 0; r < m; ++r) std::fill_n(c + r * ldc, n, 0.0f);
    }
    return;
  }
  g_calls.fetch_add(1, std::memory_order_relaxed);
  const Operand A{a, lda, m, k, !trans_a};
  const Operand B{b, ldb, n, k, trans_b};  // B as its columns: stored [n, k] when transposed
  const int64_t kw = (k + 1) / 2, nkb = (kw + kKcWords - 1) / kKcWords;
  const int64_t n_pad = (n + kBlock - 1) / kBlock * kBlock;
  // Products deeper than one k block keep partial sums for a pass of rows × one panel's
  // columns; a pass's rows are capped so those sums stay within kPartialFloats (2,048 rows of
  // 512 columns). A taller product — the LM head's weight gradient, m = the vocabulary —
  // takes several passes, each packing B again (k × 512 words per 2,048 × 512 × k products).
  const int64_t ldp = std::min(n_pad, kNc);  // one panel's columns
  const int64_t pass_rows = std::max(kBlock, kPartialFloats / ldp / kBlock * kBlock);
  // The calling thread's scratch, kept between calls (no allocation once warm).
  Scratch& s = ThreadScratch();
  if (nkb > 1) {
    const int64_t rows = std::min(pass_rows, (m + kBlock - 1) / kBlock * kBlock);
    if (s.partial.size() < static_cast<size_t>(rows * ldp)) {
      s.partial.resize(static_cast<size_t>(rows * ldp));
    }
  }
  for (int64_t i_lo = 0; i_lo < m; i_lo += pass_rows) {
    const int64_t ib_lo = i_lo / kBlock,
                  ib_hi = (std::min(m, i_lo + pass_rows) + kBlock - 1) / kBlock;
    for (int64_t j0c = 0; j0c < n; j0c += kNc) {
      const int64_t nblocks = (std::min(kNc, n - j0c) + kBlock - 1) / kBlock;
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t w0 = kb * kKcWords, ktiles = (std::min(kKcWords, kw - w0) + kT - 1) / kT;
        const int64_t block_words = ktiles * kKtileWords;
        s.bpack.resize(static_cast<size_t>(nblocks * block_words + 16));
        Word* bpack = reinterpret_cast<Word*>((reinterpret_cast<uintptr_t>(s.bpack.data()) + 63) &
                                              ~uintptr_t{63});
        ParallelFor(nblocks, 1, [&](int64_t begin, int64_t end) {
          for (int64_t nb = begin; nb < end; ++nb) {
            for (int64_t kt = 0; kt < ktiles; ++kt) {
              Word* const dst = bpack + nb * block_words + kt * kKtileWords;
              Word* const tiles[2] = {dst, dst + kTileWords};
              PackVnniTiles(B, j0c + nb * kBlock, w0 + kt * kT, tiles);
            }
          }
        });
        // op(A)'s stored rows load as tiles themselves when whole in k and not 2 KiB-strided
        // (16 rows 2 KiB apart fall into two L1 sets, which a block's reuse would thrash).
        const bool direct_a = !trans_a && 2 * (w0 + ktiles * kT) <= k && (lda * 2) % 2048 != 0;
        const Out out{nkb > 1 ? s.partial.data() : nullptr,
                      ldp,
                      i_lo,
                      j0c,
                      kb > 0,
                      kb + 1 < nkb,
                      c,
                      ldc,
                      m,
                      n,
                      alpha,
                      accumulate};
        ParallelFor(ib_hi - ib_lo, 1, [&](int64_t begin, int64_t end) {
          // Each worker's packed A block: at most a k block's tiles, 64 KiB, no allocation.
          alignas(64) thread_local Word apack[kKcWords / kT * kKtileWords];
          ConfigureTiles();
          for (int64_t ib = ib_lo + begin; ib < ib_lo + end; ++ib) {
            ATiles at{reinterpret_cast<const char*>(apack), kKtileWords * 4, kTileWords * 4, 64};
            if (direct_a && (ib + 1) * kBlock <= m) {
              at = {reinterpret_cast<const char*>(a + ib * kBlock * lda + 2 * w0), 64, kT * lda * 2,
                    lda * 2};
            } else {
              for (int64_t kt = 0; kt < ktiles; ++kt) {
                Word* const tiles[2] = {apack + kt * kKtileWords,
                                        apack + kt * kKtileWords + kTileWords};
                PackRowsTiles(A, ib * kBlock, w0 + kt * kT, tiles);
              }
            }
            for (int64_t nb = 0; nb < nblocks; ++nb) {
              Block(ktiles, at, bpack + nb * block_words, out, ib * kBlock, j0c + nb * kBlock);
            }
          }
          ReleaseTiles();
        });
      }
    }
  }
}

}  // namespace sshsdp::kernels::amx::gemm_tiles

namespace sshsdp::kernels::amx {

int64_t GemmBf16Calls() { return gemm_tiles::g_calls.load(std::memory_order_relaxed); }

int64_t GemmBf16ScratchBytes() {
  const gemm_tiles::Scratch& s = gemm_tiles::ThreadScratch();
  return static_cast<int64_t>(s.partial.capacity() * sizeof(float) +
                              s.bpack.capacity() * sizeof(gemm_tiles::Word));
}

void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a,
              int64_t lda, const bf16* b, int64_t ldb, float* c, int64_t ldc, float alpha,
              bool accumulate) {
  gemm_tiles::Run(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, alpha, accumulate);
}

}  // namespace sshsdp::kernels::amx

#pragma GCC diagnostic pop
