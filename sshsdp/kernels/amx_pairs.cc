// bf16 pair products on AMX tiles (amx_pairs.h).
//
// Eight tiles, all 16 rows × 64 bytes: C in tmm0–3 (tile 2i + j holds the block's rows
// 16i.., columns 16j..), A in tmm4–5 (rows 16i..), B in tmm6–7 (columns 16j..). A block of
// up to 32 × 32 results is summed over the reduction 16 pairs (one tile) at a time. Whole
// tiles load straight from the operands; a reduction tail or a short last row tile is first
// copied into zero-padded stage tiles (a reduction tail must be zero in A and B both: a NaN in
// the unused part of either would reach every sum). Results go straight to C when the block
// is whole and alpha = 1 (accumulating in the tile); otherwise through a stage, scaled,
// masked and added there.
//
// GCC's tile intrinsics take the tile number as a literal token, so the helpers switch on it.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "sshsdp/kernels/amx_pairs.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace sshsdp::kernels::amx {
namespace {

using Pair = uint32_t;

std::atomic<int64_t> g_calls{0};  // Calls()

#define SSHSDP_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")))

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Eight 16-row × 64-byte tiles. A constant: GCC 12 does not see that ldtilecfg reads its
// operand, and dropped the stores that filled a local configuration where the function was
// not inlined.
constexpr TileConfig MakeConfig() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  return cfg;
}
constexpr TileConfig kConfig = MakeConfig();

// Strides in bytes.
SSHSDP_AMX_TARGET inline void ZeroC(int t) {
  switch (t) {
    case 0:
      _tile_zero(0);
      break;
    case 1:
      _tile_zero(1);
      break;
    case 2:
      _tile_zero(2);
      break;
    default:
      _tile_zero(3);
      break;
  }
}
SSHSDP_AMX_TARGET inline void LoadC(int t, const float* p, int64_t stride) {
  switch (t) {
    case 0:
      _tile_loadd(0, p, stride);
      break;
    case 1:
      _tile_loadd(1, p, stride);
      break;
    case 2:
      _tile_loadd(2, p, stride);
      break;
    default:
      _tile_loadd(3, p, stride);
      break;
  }
}
SSHSDP_AMX_TARGET inline void StoreC(int t, float* p, int64_t stride) {
  switch (t) {
    case 0:
      _tile_stored(0, p, stride);
      break;
    case 1:
      _tile_stored(1, p, stride);
      break;
    case 2:
      _tile_stored(2, p, stride);
      break;
    default:
      _tile_stored(3, p, stride);
      break;
  }
}
SSHSDP_AMX_TARGET inline void LoadA(int i, const Pair* p, int64_t stride) {
  if (i == 0) {
    _tile_loadd(4, p, stride);
  } else {
    _tile_loadd(5, p, stride);
  }
}
SSHSDP_AMX_TARGET inline void LoadB(int j, const Pair* p, int64_t stride) {
  if (j == 0) {
    _tile_loadd(6, p, stride);
  } else {
    _tile_loadd(7, p, stride);
  }
}
SSHSDP_AMX_TARGET inline void Dot(int i, int j) {
  switch (2 * i + j) {
    case 0:
      _tile_dpbf16ps(0, 4, 6);
      break;
    case 1:
      _tile_dpbf16ps(1, 4, 7);
      break;
    case 2:
      _tile_dpbf16ps(2, 5, 6);
      break;
    default:
      _tile_dpbf16ps(3, 5, 7);
      break;
  }
}

constexpr int64_t kTile = 16;  // rows of a tile; pairs (or floats) per tile row

struct Stage {
  alignas(64) Pair a[2][kTile * kTile];
  alignas(64) Pair b[2][kTile * kTile];
  alignas(64) float c[kTile * kTile];
};

// dst[r][p] = src[r][p] for r < rows, p < cols (row stride ld), 0 elsewhere in the tile.
void StageTile(const Pair* src, int64_t ld, int64_t rows, int64_t cols, Pair* dst) {
  std::memset(dst, 0, sizeof(Pair) * kTile * kTile);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * kTile, src + r * ld, sizeof(Pair) * cols);
}

// C[rows, cols] (+)= alpha · stage, rows ≤ 16, cols ≤ 16.
SSHSDP_AMX_TARGET void FinishTile(const float* t, float* c, int64_t ldc, int64_t rows, int64_t cols,
                                  float alpha, bool acc) {
  const auto mask = static_cast<__mmask16>((uint32_t{1} << cols) - 1);
  const __m512 al = _mm512_set1_ps(alpha);
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v = _mm512_mul_ps(_mm512_load_ps(t + r * kTile), al);
    if (acc) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, c + r * ldc));
    _mm512_mask_storeu_ps(c + r * ldc, mask, v);
  }
}

// One block of MB × NB result tiles: rows in (16(MB−1), 16·MB], cols in (16(NB−1), 16·NB].
template <int MB, int NB>
SSHSDP_AMX_TARGET void Block(int64_t kp, const Pair* a, int64_t lda, const Pair* b, int64_t ldb,
                             float* c, int64_t ldc, int64_t rows, int64_t cols, float alpha,
                             bool acc, Stage& st) {
  const bool direct = alpha == 1.0f && rows == kTile * MB && cols == kTile * NB;
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      if (direct && acc) {
        LoadC(2 * i + j, c + i * kTile * ldc + j * kTile, ldc * 4);
      } else {
        ZeroC(2 * i + j);
      }
    }
  }
  for (int64_t k0 = 0; k0 < kp; k0 += kTile) {
    const int64_t kt = std::min(kTile, kp - k0);
    for (int i = 0; i < MB; ++i) {
      const int64_t ri = std::min(kTile, rows - i * kTile);
      const Pair* ap = a + i * kTile * lda + k0;
      if (kt == kTile && ri == kTile) {
        LoadA(i, ap, lda * 4);
      } else {
        StageTile(ap, lda, ri, kt, st.a[i]);
        LoadA(i, st.a[i], 64);
      }
    }
    for (int j = 0; j < NB; ++j) {
      const Pair* bp = b + k0 * ldb + j * kTile;
      if (kt == kTile) {
        LoadB(j, bp, ldb * 4);
      } else {
        StageTile(bp, ldb, kt, kTile, st.b[j]);
        LoadB(j, st.b[j], 64);
      }
    }
    for (int i = 0; i < MB; ++i) {
      for (int j = 0; j < NB; ++j) Dot(i, j);
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      float* cp = c + i * kTile * ldc + j * kTile;
      if (direct) {
        StoreC(2 * i + j, cp, ldc * 4);
      } else {
        StoreC(2 * i + j, st.c, 64);
        FinishTile(st.c, cp, ldc, std::min(kTile, rows - i * kTile),
                   std::min(kTile, cols - j * kTile), alpha, acc);
      }
    }
  }
}

}  // namespace

int64_t Calls() { return g_calls.load(std::memory_order_relaxed); }

SSHSDP_AMX_TARGET void ConfigureTiles() { _tile_loadconfig(&kConfig); }

SSHSDP_AMX_TARGET void ReleaseTiles() { _tile_release(); }

bool Available() {
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool tile = (edx >> 24) & 1u, bf16 = (edx >> 22) & 1u;
    if (!tile || !bf16 || !__builtin_cpu_supports("avx512bw")) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

SSHSDP_AMX_TARGET void GemmPairs(int64_t M, int64_t N, int64_t kp, const uint32_t* a, int64_t lda,
                                 const uint32_t* b, int64_t ldb, float* c, int64_t ldc, float alpha,
                                 bool acc) {
  if (M <= 0 || N <= 0) return;
  g_calls.fetch_add(1, std::memory_order_relaxed);
  ConfigureTiles();
  Stage st;
  for (int64_t n0 = 0; n0 < N; n0 += 2 * kTile) {
    const int64_t nc = std::min(2 * kTile, N - n0);
    for (int64_t m0 = 0; m0 < M; m0 += 2 * kTile) {
      const int64_t mr = std::min(2 * kTile, M - m0);
      const Pair* ap = a + m0 * lda;
      const Pair* bp = b + n0;
      float* cp = c + m0 * ldc + n0;
      if (mr > kTile) {
        if (nc > kTile) {
          Block<2, 2>(kp, ap, lda, bp, ldb, cp, ldc, mr, nc, alpha, acc, st);
        } else {
          Block<2, 1>(kp, ap, lda, bp, ldb, cp, ldc, mr, nc, alpha, acc, st);
        }
      } else if (nc > kTile) {
        Block<1, 2>(kp, ap, lda, bp, ldb, cp, ldc, mr, nc, alpha, acc, st);
      } else {
        Block<1, 1>(kp, ap, lda, bp, ldb, cp, ldc, mr, nc, alpha, acc, st);
      }
    }
  }
  ReleaseTiles();
}

}  // namespace sshsdp::kernels::amx
