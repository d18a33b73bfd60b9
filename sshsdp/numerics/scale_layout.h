// Relayout of MX scale grids into the layouts GEMM kernels want, for a PACKED runtime
// weight: several matrices stacked by rows and used as one GEMM operand (e.g. all Q heads
// of an attention layer as one projection). This is the scale half of the Tw stage: the
// FP8 weight data of a packed weight is already one contiguous view (zero copy), only the
// scales move.
//
//   // Two heads, each [128, 1024], quantized separately by the G stage (32x32 blocks):
//   MxScaleGrid parts[] = {{s_head0, 128, 1024, 32}, {s_head1, 128, 1024, 32}};
//   PackedScaleShape shape = PackedScales(parts, MxOperand::kAsStored);  // mn=256, kb=32
//   std::vector<uint8_t> dst(ScaleLayoutBytes(ScaleLayout::kCublasSwizzle, shape));
//   RelayoutPackedScales(parts, MxOperand::kAsStored, ScaleLayout::kCublasSwizzle, dst.data(),
//                        dst.size());
//   UnrelayoutPackedScales(dst.data(), dst.size(), MxOperand::kAsStored,
//                          ScaleLayout::kCublasSwizzle, out_parts);         // inverse
//
// Grid semantics.
//   Source: each part is a per-matrix scale grid as mx.h produces it (MxScaleGrid): a
//   [rows, cols] matrix (cols = K, the same for every part) quantized with 32x32 blocks
//   (block_rows = 32, grid [ceil(rows/32), ceil(cols/32)]) or 1x32 blocks (block_rows = 1,
//   grid [rows, ceil(cols/32)]).
//   Operand: a kernel consumes a K-major operand of shape [mn, k] (row-major, K contiguous)
//   with ONE SCALE PER (ROW, 32-WIDE K-BLOCK): the per-row scale matrix S[mn, kb],
//   kb = ceil(k/32). The packed operand is either
//     kAsStored:   the stacked matrix P = [Σ rows, K]  (forward Y = X·Pᵀ; mn = Σ rows, k = K);
//     kTransposed: Pᵀ = [K, Σ rows]                   (dgrad dX = dY·P; mn = K, k = Σ rows).
//   Expansion is part of the relayout: a 32x32 block scale is replicated across the 32 rows
//   it covers (S[r, c] = grid[r/32, c] for kAsStored), so stacked matrices with rows not a
//   multiple of 32 still line up row by row. For kTransposed the 32x32 blocks are read
//   transposed (W and Wᵀ share scales): S[j, c] = grid_p[c_local, j/32], where K-block c of
//   Pᵀ = rows [32c, 32c+32) of P must lie inside one part, so every part but the last needs
//   rows % 32 == 0, and 1x32 (activation) grids cannot be transposed. Violations throw
//   NumericsError naming the part.
//
// Layouts (ScaleLayout), all UE8M0 bytes; padding and gaps are written as 0 (2^-127, never
// 0xFF = NaN):
//   kRowMajor: S itself, uint8 [mn, kb] row-major ("k-major": a row's kb scales contiguous).
//     Element (r, c) at byte r·kb + c. Size mn·kb.
//   kBlockRowMajor: the unexpanded 32x32-block grid of the packed operand, uint8
//     [ceil(mn/32), kb] row-major, element (i, c) = S[32i, c]. This is the stacked G-stage
//     output (kAsStored) or its transpose (kTransposed). For kAsStored every part but the
//     last needs rows % 32 == 0 so blocks do not straddle parts; 1x32 parts give the per-row
//     grid (= kRowMajor).
//   kDeepGemmMnMajor (DeepGEMM sm100, gran_k = 32): 32-bit words, four consecutive K-blocks
//     per word (S[r, 4w] in bits 7:0, S[r, 4w+1] in 15:8, S[r, 4w+2] in 23:16, S[r, 4w+3]
//     in 31:24), tensor shape [mn, ceil(kb/4)] with strides (1, align(mn, 4)) in words:
//     word (r, w) at word index w·align(mn, 4) + r. Words are stored in host byte order
//     (little-endian on every platform sshsdp targets), i.e. what an int32 tensor holds.
//     Size 4·align(mn, 4)·ceil(kb/4) bytes. Gaps (K-blocks past kb in the last word, rows
//     mn..align(mn,4)) are 0.
//   kCublasSwizzle (cuBLASLt VEC32_UE8M0, sm100): rows padded to a multiple of 128 and
//     columns to a multiple of 4 with zeros, cut into 128x4 tiles stored tile-row-major;
//     element (r, c) at byte ((r/128)·nColTiles + c/4)·512 + (r%32)·16 + ((r%128)/32)·4 +
//     c%4 with nColTiles = ceil(kb/4). Size align(mn,128)·align(kb,4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace sshsdp {

enum class ScaleLayout : uint8_t {
  kRowMajor = 0,
  kBlockRowMajor = 1,
  kDeepGemmMnMajor = 2,
  kCublasSwizzle = 3,
};

inline constexpr int kNumScaleLayouts = 4;

// "row_major", "block_row_major", "deepgemm_mn_major", "cublas_swizzle".
std::string_view ScaleLayoutName(ScaleLayout layout);
// Throws NumericsError listing the accepted names.
ScaleLayout ParseScaleLayout(std::string_view name);

enum class MxOperand : uint8_t {
  kAsStored = 0,    // operand = P, the parts stacked by rows
  kTransposed = 1,  // operand = Pᵀ
};

// Per-matrix scale grid (input of a relayout).
struct MxScaleGrid {
  const uint8_t* scales;  // row-major [ceil(rows/block_rows), ceil(cols/32)]
  int64_t rows;           // matrix rows (elements)
  int64_t cols;           // matrix cols (elements) = K; equal across the parts of a packed weight
  int64_t block_rows;     // 32 (weights, 32x32 blocks) or 1 (activations, 1x32 blocks)
};

// Per-matrix scale grid to fill (output of the inverse).
struct MxScaleGridOut {
  uint8_t* scales;
  int64_t rows;
  int64_t cols;
  int64_t block_rows;
};

// Shape of the per-row scale matrix S of a packed operand: [mn, kb], kb = ceil(k/32).
// block_rows is the row height of kBlockRowMajor: 32, or 1 for activation (1x32) grids.
struct PackedScaleShape {
  int64_t mn;
  int64_t k;
  int64_t kb;
  int64_t block_rows;
};

// Validates the parts (non-empty, equal cols and block_rows, transposability) and returns
// the operand's scale shape. Throws NumericsError naming the offending part.
PackedScaleShape PackedScales(std::span<const MxScaleGrid> parts, MxOperand operand);

// Bytes a layout needs for a per-row scale matrix [mn, kb].
size_t ScaleLayoutBytes(ScaleLayout layout, const PackedScaleShape& shape);

// Byte offset of S[r, c] in the kCublasSwizzle layout of a matrix with kb columns.
inline size_t CublasSwizzleOffset(int64_t r, int64_t c, int64_t kb) {
  const int64_t n_col_tiles = (kb + 3) / 4;
  return static_cast<size_t>(((r / 128) * n_col_tiles + c / 4) * 512 + (r % 32) * 16 +
                             ((r % 128) / 32) * 4 + c % 4);
}

// Word index of word (r, w) (K-blocks 4w..4w+3 of row r) in the kDeepGemmMnMajor layout.
inline size_t DeepGemmWordIndex(int64_t r, int64_t w, int64_t mn) {
  return static_cast<size_t>(w * ((mn + 3) / 4 * 4) + r);
}

// Single-matrix relayout of a per-row scale matrix s (uint8 [shape.mn, shape.kb] row-major)
// into `layout` (dst: ScaleLayoutBytes(layout, shape) bytes, all written) and back.
// kBlockRowMajor takes rows 0, b, 2b, ... of s (b = shape.block_rows) and its inverse
// replicates them again. The inverse throws NumericsError if a padding byte is not 0.
void ScalesToLayout(const uint8_t* s, const PackedScaleShape& shape, ScaleLayout layout,
                    uint8_t* dst);
void ScalesFromLayout(const uint8_t* src, const PackedScaleShape& shape, ScaleLayout layout,
                      uint8_t* s);

// Batched Tw relayout: the scales of all parts of one packed runtime weight into one
// kernel-layout buffer, in one call, without an expanded temporary. dst_bytes must be at
// least ScaleLayoutBytes(layout, PackedScales(parts, operand)); exactly that many bytes are
// written (padding included).
void RelayoutPackedScales(std::span<const MxScaleGrid> parts, MxOperand operand, ScaleLayout layout,
                          uint8_t* dst, size_t dst_bytes);

// Inverse: recovers every part's block grid from a relaid-out buffer. Throws NumericsError if
// the buffer is not exactly what RelayoutPackedScales would write for the recovered grids
// (replicated rows disagree, padding not zero).
void UnrelayoutPackedScales(const uint8_t* src, size_t src_bytes, MxOperand operand,
                            ScaleLayout layout, std::span<const MxScaleGridOut> parts);

}  // namespace sshsdp
