// Scale relayout for packed MX runtime weights: expansion of block scales to per-row scales
// and the row-major, block-row-major, DeepGEMM MN-major packed and cuBLAS 128x4-swizzled
// layouts, with their inverses (see scale_layout.h for the exact semantics).
#include "sshsdp/numerics/scale_layout.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/numerics/mx.h"

namespace sshsdp {
namespace {

int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

void CheckShape(const PackedScaleShape& shape) {
  SSHSDP_CHECK(shape.mn >= 0 && shape.kb >= 0 && (shape.block_rows == 1 || shape.block_rows == 32),
               NumericsError,
               "invalid scale matrix shape [mn={}, kb={}] with block_rows={} (must be 1 or 32)",
               shape.mn, shape.kb, shape.block_rows);
}

// Writes row r (kb scales) of the per-row scale matrix into a zero-initialised layout buffer.
void WriteRow(ScaleLayout layout, const PackedScaleShape& sh, int64_t r, const uint8_t* row,
              uint8_t* dst) {
  const int64_t kb = sh.kb;
  switch (layout) {
    case ScaleLayout::kRowMajor:
      std::memcpy(dst + r * kb, row, static_cast<size_t>(kb));
      return;
    case ScaleLayout::kBlockRowMajor:
      if (r % sh.block_rows == 0) {
        std::memcpy(dst + (r / sh.block_rows) * kb, row, static_cast<size_t>(kb));
      }
      return;
    case ScaleLayout::kDeepGemmMnMajor:
      for (int64_t w = 0; w * 4 < kb; ++w) {
        uint32_t word = 0;
        if (std::endian::native == std::endian::little && w * 4 + 4 <= kb) {
          std::memcpy(&word, row + w * 4, 4);  // e[4w] lands in bits 7:0
        } else {
          for (int64_t j = 0; j < 4 && w * 4 + j < kb; ++j) {
            word |= static_cast<uint32_t>(row[w * 4 + j]) << (8 * j);
          }
        }
        std::memcpy(dst + 4 * DeepGemmWordIndex(r, w, sh.mn), &word, 4);
      }
      return;
    case ScaleLayout::kCublasSwizzle:
      for (int64_t c = 0; c < kb; c += 4) {
        std::memcpy(dst + CublasSwizzleOffset(r, c, kb), row + c,
                    static_cast<size_t>(std::min<int64_t>(4, kb - c)));
      }
      return;
  }
  throw NumericsError(fmt::format("unknown scale layout {}", static_cast<int>(layout)));
}

// Reads row r of the per-row scale matrix from a layout buffer.
void ReadRow(ScaleLayout layout, const PackedScaleShape& sh, int64_t r, const uint8_t* src,
             uint8_t* row) {
  const int64_t kb = sh.kb;
  switch (layout) {
    case ScaleLayout::kRowMajor:
      std::memcpy(row, src + r * kb, static_cast<size_t>(kb));
      return;
    case ScaleLayout::kBlockRowMajor:
      std::memcpy(row, src + (r / sh.block_rows) * kb, static_cast<size_t>(kb));
      return;
    case ScaleLayout::kDeepGemmMnMajor:
      for (int64_t w = 0; w * 4 < kb; ++w) {
        uint32_t word;
        std::memcpy(&word, src + 4 * DeepGemmWordIndex(r, w, sh.mn), 4);
        for (int64_t j = 0; j < 4 && w * 4 + j < kb; ++j) {
          row[w * 4 + j] = static_cast<uint8_t>(word >> (8 * j));
        }
      }
      return;
    case ScaleLayout::kCublasSwizzle:
      for (int64_t c = 0; c < kb; c += 4) {
        std::memcpy(row + c, src + CublasSwizzleOffset(r, c, kb),
                    static_cast<size_t>(std::min<int64_t>(4, kb - c)));
      }
      return;
  }
  throw NumericsError(fmt::format("unknown scale layout {}", static_cast<int>(layout)));
}

// Walks the rows of the packed operand's per-row scale matrix S. For kAsStored a row is a
// row of some part's grid (no copy); for kTransposed it is gathered from the column of
// 32x32 blocks of every part. Calls fn(r, row_ptr) in row order.
template <typename Fn>
void ForEachPackedRow(std::span<const MxScaleGrid> parts, MxOperand operand,
                      const PackedScaleShape& sh, Fn&& fn) {
  if (operand == MxOperand::kAsStored) {
    int64_t r = 0;
    for (const MxScaleGrid& p : parts) {
      for (int64_t i = 0; i < p.rows; ++i, ++r) fn(r, p.scales + (i / p.block_rows) * sh.kb);
    }
    return;
  }
  // kTransposed: K-block c of Pᵀ is block row `local[c]` of part `owner[c]`.
  std::vector<const uint8_t*> block_row(static_cast<size_t>(sh.kb));
  int64_t c = 0;
  for (const MxScaleGrid& p : parts) {
    const int64_t pcols_b = MxBlocks(p.cols);
    for (int64_t lb = 0; lb < MxBlocks(p.rows); ++lb) block_row[c++] = p.scales + lb * pcols_b;
  }
  std::vector<uint8_t> row(static_cast<size_t>(sh.kb));
  for (int64_t j = 0; j < sh.mn; ++j) {
    for (int64_t k = 0; k < sh.kb; ++k) row[k] = block_row[k][j / kMxBlock];
    fn(j, row.data());
  }
}

const char* OperandName(MxOperand op) {
  return op == MxOperand::kAsStored ? "as-stored" : "transposed";
}

template <typename Grid>
PackedScaleShape PackedShapeOf(std::span<const Grid> parts, MxOperand operand, ScaleLayout layout,
                               bool check_layout) {
  SSHSDP_CHECK(!parts.empty(), NumericsError, "packed scale relayout needs at least one part");
  SSHSDP_CHECK(operand == MxOperand::kAsStored || operand == MxOperand::kTransposed, NumericsError,
               "unknown MX operand {}", static_cast<int>(operand));
  const int64_t cols = parts[0].cols, block_rows = parts[0].block_rows;
  int64_t total_rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Grid& p = parts[i];
    SSHSDP_CHECK(p.rows > 0 && p.cols > 0, NumericsError,
                 "packed scales: part {} has empty shape [{}, {}]", i, p.rows, p.cols);
    SSHSDP_CHECK(p.block_rows == 1 || p.block_rows == kMxBlock, NumericsError,
                 "packed scales: part {} has block_rows {}; use 32 (32x32 weight blocks) or 1 "
                 "(1x32 activation blocks)",
                 i, p.block_rows);
    SSHSDP_CHECK(p.cols == cols, NumericsError,
                 "packed scales: part {} has {} columns but part 0 has {}; matrices stacked by "
                 "rows must share K",
                 i, p.cols, cols);
    SSHSDP_CHECK(p.block_rows == block_rows, NumericsError,
                 "packed scales: part {} has block_rows {} but part 0 has {}", i, p.block_rows,
                 block_rows);
    SSHSDP_CHECK(p.scales != nullptr, NumericsError, "packed scales: part {} has no buffer", i);
    const bool last = i + 1 == parts.size();
    const bool blocks_cross = block_rows == kMxBlock && p.rows % kMxBlock != 0 && !last;
    if (operand == MxOperand::kTransposed) {
      SSHSDP_CHECK(block_rows == kMxBlock, NumericsError,
                   "packed scales: the transposed operand needs 32x32 block scales; 1x32 "
                   "(activation) scales are rowwise only");
      SSHSDP_CHECK(!blocks_cross, NumericsError,
                   "packed scales: part {} has {} rows, not a multiple of 32, so in the "
                   "transposed operand a 32-wide K-block would span parts {} and {}",
                   i, p.rows, i, i + 1);
    } else if (check_layout && layout == ScaleLayout::kBlockRowMajor) {
      SSHSDP_CHECK(!blocks_cross, NumericsError,
                   "packed scales: part {} has {} rows, not a multiple of 32, so a 32x32 block "
                   "of the packed weight would span parts {} and {}; use an expanded layout",
                   i, p.rows, i, i + 1);
    }
    total_rows += p.rows;
  }
  PackedScaleShape sh;
  if (operand == MxOperand::kAsStored) {
    sh = {total_rows, cols, MxBlocks(cols), block_rows};
  } else {
    sh = {cols, total_rows, MxBlocks(total_rows), kMxBlock};
  }
  return sh;
}

}  // namespace

std::string_view ScaleLayoutName(ScaleLayout layout) {
  switch (layout) {
    case ScaleLayout::kRowMajor:
      return "row_major";
    case ScaleLayout::kBlockRowMajor:
      return "block_row_major";
    case ScaleLayout::kDeepGemmMnMajor:
      return "deepgemm_mn_major";
    case ScaleLayout::kCublasSwizzle:
      return "cublas_swizzle";
  }
  return "?";
}

ScaleLayout ParseScaleLayout(std::string_view name) {
  for (int i = 0; i < kNumScaleLayouts; ++i) {
    if (ScaleLayoutName(static_cast<ScaleLayout>(i)) == name) return static_cast<ScaleLayout>(i);
  }
  throw NumericsError(fmt::format(
      "unknown scale layout '{}': use one of row_major, block_row_major, deepgemm_mn_major, "
      "cublas_swizzle",
      std::string(name)));
}

PackedScaleShape PackedScales(std::span<const MxScaleGrid> parts, MxOperand operand) {
  return PackedShapeOf(parts, operand, ScaleLayout::kRowMajor, false);
}

size_t ScaleLayoutBytes(ScaleLayout layout, const PackedScaleShape& sh) {
  CheckShape(sh);
  switch (layout) {
    case ScaleLayout::kRowMajor:
      return static_cast<size_t>(sh.mn * sh.kb);
    case ScaleLayout::kBlockRowMajor:
      return static_cast<size_t>((sh.mn + sh.block_rows - 1) / sh.block_rows * sh.kb);
    case ScaleLayout::kDeepGemmMnMajor:
      return static_cast<size_t>(4 * AlignUp(sh.mn, 4) * ((sh.kb + 3) / 4));
    case ScaleLayout::kCublasSwizzle:
      return static_cast<size_t>(AlignUp(sh.mn, 128) * AlignUp(sh.kb, 4));
  }
  throw NumericsError(fmt::format("unknown scale layout {}", static_cast<int>(layout)));
}

void ScalesToLayout(const uint8_t* s, const PackedScaleShape& shape, ScaleLayout layout,
                    uint8_t* dst) {
  const size_t bytes = ScaleLayoutBytes(layout, shape);
  std::memset(dst, 0, bytes);
  for (int64_t r = 0; r < shape.mn; ++r) WriteRow(layout, shape, r, s + r * shape.kb, dst);
}

void ScalesFromLayout(const uint8_t* src, const PackedScaleShape& shape, ScaleLayout layout,
                      uint8_t* s) {
  const size_t bytes = ScaleLayoutBytes(layout, shape);
  for (int64_t r = 0; r < shape.mn; ++r) ReadRow(layout, shape, r, src, s + r * shape.kb);
  // Every byte not read back must be padding, and padding is 0: re-layout and compare.
  std::vector<uint8_t> check(bytes);
  ScalesToLayout(s, shape, layout, check.data());
  SSHSDP_CHECK(std::memcmp(check.data(), src, bytes) == 0, NumericsError,
               "{} scale buffer for [mn={}, kb={}] has non-zero padding or gap bytes",
               ScaleLayoutName(layout), shape.mn, shape.kb);
}

void RelayoutPackedScales(std::span<const MxScaleGrid> parts, MxOperand operand, ScaleLayout layout,
                          uint8_t* dst, size_t dst_bytes) {
  const PackedScaleShape sh = PackedShapeOf(parts, operand, layout, true);
  const size_t bytes = ScaleLayoutBytes(layout, sh);
  SSHSDP_CHECK(dst_bytes >= bytes, NumericsError,
               "{} scales of the {} packed operand [mn={}, kb={}] need {} bytes, buffer has {}",
               ScaleLayoutName(layout), OperandName(operand), sh.mn, sh.kb, bytes, dst_bytes);
  std::memset(dst, 0, bytes);
  ForEachPackedRow(parts, operand, sh,
                   [&](int64_t r, const uint8_t* row) { WriteRow(layout, sh, r, row, dst); });
}

void UnrelayoutPackedScales(const uint8_t* src, size_t src_bytes, MxOperand operand,
                            ScaleLayout layout, std::span<const MxScaleGridOut> parts) {
  const PackedScaleShape sh = PackedShapeOf(parts, operand, layout, true);
  const size_t bytes = ScaleLayoutBytes(layout, sh);
  SSHSDP_CHECK(src_bytes >= bytes, NumericsError,
               "{} scales of the {} packed operand [mn={}, kb={}] need {} bytes, buffer has {}",
               ScaleLayoutName(layout), OperandName(operand), sh.mn, sh.kb, bytes, src_bytes);
  std::vector<uint8_t> row(static_cast<size_t>(sh.kb));
  if (operand == MxOperand::kAsStored) {
    int64_t r = 0;
    for (const MxScaleGridOut& p : parts) {
      for (int64_t i = 0; i < p.rows; ++i, ++r) {
        if (i % p.block_rows != 0) continue;  // replicas: checked below
        ReadRow(layout, sh, r, src, p.scales + (i / p.block_rows) * sh.kb);
      }
    }
  } else {
    std::vector<uint8_t*> block_row;
    for (const MxScaleGridOut& p : parts) {
      for (int64_t lb = 0; lb < MxBlocks(p.rows); ++lb) {
        block_row.push_back(p.scales + lb * MxBlocks(p.cols));
      }
    }
    for (int64_t j = 0; j < sh.mn; j += kMxBlock) {
      ReadRow(layout, sh, j, src, row.data());
      for (int64_t k = 0; k < sh.kb; ++k) block_row[k][j / kMxBlock] = row[k];
    }
  }
  // The buffer must be exactly the relayout of what was read back: replicated rows agree,
  // padding and gaps are 0.
  std::vector<MxScaleGrid> in(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    in[i] = {parts[i].scales, parts[i].rows, parts[i].cols, parts[i].block_rows};
  }
  std::vector<uint8_t> check(bytes);
  RelayoutPackedScales(in, operand, layout, check.data(), bytes);
  SSHSDP_CHECK(std::memcmp(check.data(), src, bytes) == 0, NumericsError,
               "{} scale buffer is not a relayout of {} block scales for the {} packed operand "
               "[mn={}, kb={}]: replicated rows disagree or padding is not zero",
               ScaleLayoutName(layout), parts.size(), OperandName(operand), sh.mn, sh.kb);
}

}  // namespace sshsdp
