// MXFP8 block quantization (OCP Microscaling v1.0): FP8 elements sharing one UE8M0 scale
// per block of 32 elements. Used by the G stage (main fp32 weights -> runtime MXFP8 weights)
// and by CPU GEMMs that consume MXFP8 operands.
//
//   std::vector<uint8_t> q(rows * cols), s(MxWeightScaleCount(rows, cols));
//   MxQuantizeWeight(w, rows, cols, q.data(), s.data());          // 32x32 blocks, E4M3
//   MxDequantizeWeight(q.data(), s.data(), rows, cols, scratch);  // fp32 for a CPU GEMM
//   // G stage, one 32-row band at a time (band b = rows [32b, 32b+32)):
//   MxBand band = MxWeightBand(rows, cols, b);
//   MxQuantizeWeightBand(gathered_band_rows, rows, cols, b, q_band, s_band);
//
// Block shapes.
//   Weights: 32x32 blocks over a row-major [rows, cols] matrix. Scale grid: row-major
//     [ceil(rows/32), ceil(cols/32)], scale (i, j) covers rows [32i, 32i+32) and cols
//     [32j, 32j+32). Because the block is square, Wᵀ quantized the same way has exactly the
//     transposed codes and the transposed scale grid: W and Wᵀ share scales, so the forward
//     (rowwise) and dgrad (columnwise) GEMMs use one quantization. Edge blocks may be
//     partial (rows or cols not multiples of 32); their scale comes from the elements present.
//   Activations: 1x32 blocks along K of a row-major [rows = M, cols = K] matrix. Scale grid:
//     row-major [rows, ceil(cols/32)].
//
// Scale rule. amax = max |x| over the block. Two rules (MxScaleRule):
//   kCeil (default, what GPU libraries use: cuBLAS, Transformer Engine, torchao RCEIL,
//     DeepGEMM): e = ceil(log2(amax / max_elem)), max_elem = 448 (E4M3) or 57344 (E5M2).
//     Computed exactly (no fp32 division): e is the smallest integer with
//     amax <= max_elem·2^e. Hence |x / 2^e| <= max_elem for every element: this rule NEVER
//     saturates. (It also equals ceil_pow2(amax · fl(1/max_elem)) evaluated in fp32, the
//     way Transformer Engine computes it, whenever that product is a normal fp32 number:
//     the rounding is the same in every binade, and a test checks all 2^23 mantissas of
//     several binades for both element formats.)
//   kOcpFloor (OCP MX v1.0): e = floor(log2(amax)) - emax_elem (emax_elem = 8 for E4M3,
//     15 for E5M2). Scaled values reach up to 2·2^emax_elem > max_elem, which saturate to
//     ±max_elem.
//   Both rules then clamp e to the UE8M0 range [-127, 127] (code e + 127). For finite fp32
//   input the upper clamp never triggers (e <= 120); the lower clamp only makes the scale
//   larger, so kCeil still never saturates.
// Elements are x · 2^-e (exact: a power-of-two multiply) rounded to nearest even FP8,
// saturating (Fp8Overflow::kSaturate).
//
// Special blocks.
//   Zero block (amax = 0, including -0): scale code 0 (2^-127), elements ±0 (sign kept).
//     Reasons: it is the limit of the rule as amax -> 0 (the clamp), it is what Transformer
//     Engine and torchao produce, so scale buffers compare byte-for-byte with theirs, and it
//     is never 0xFF (NaN), which DeepGEMM forbids in its layouts. The dequantized block is
//     exactly ±0 whatever the scale.
//   NaN anywhere in a block: scale 0xFF (NaN), per OCP MX ("if X is NaN, every element of
//     the block is NaN"); every element is written as the E4M3 NaN code 0x7F (E5M2: 0x7E),
//     so the block dequantizes to NaN even if a consumer ignores the NaN scale.
//   ±Inf anywhere in a block (and no NaN): treated like NaN (scale 0xFF, NaN elements).
//     E4M3 has no Inf and no finite scale can represent the block; failing loudly beats
//     silently saturating an infinity to 448·2^127. (OCP leaves this implementation-defined.)
//
// Dequantization computes elem_value · 2^(code-127) in fp32, which is exact (no rounding:
// a FP8 value times a power of two is representable, down to 2^-9·2^-127). This is the very
// function an MX GPU GEMM applies to its operands before accumulating in fp32; CPU GEMMs
// consume MXFP8 weights by dequantizing into fp32 scratch. That is a numerical equivalence,
// not a speed claim. A NaN scale dequantizes to NaN.
//
// Bands (G stage units). Band b = rows [32b, min(32b+32, rows)) of a weight matrix: exactly
// one row of 32x32 blocks, so it can be quantized with nothing outside it. Fragment
// boundaries of a sharded matrix may fall anywhere inside a band; the owner of a band
// gathers its fragments (contiguous in row-major order), quantizes, and returns the FP8
// fragments and the band's scales. MxQuantizeWeight is by definition band-by-band
// quantization, so the results are bit-identical to quantizing the unsharded matrix.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

inline constexpr int64_t kMxBlock = 32;

enum class MxScaleRule : uint8_t {
  kCeil = 0,      // e = ceil(log2(amax / max_elem)): GPU libraries; never saturates
  kOcpFloor = 1,  // e = floor(log2(amax)) - emax_elem: OCP MX v1.0; saturates
};

struct MxOptions {
  DType elem = DType::kE4M3;  // element format: kE4M3 (MXFP8 default) or kE5M2
  MxScaleRule rule = MxScaleRule::kCeil;
};

// Number of 32-blocks covering n elements: ceil(n / 32).
constexpr int64_t MxBlocks(int64_t n) { return (n + kMxBlock - 1) / kMxBlock; }

// Scale counts: weights ceil(rows/32)·ceil(cols/32); activations rows·ceil(cols/32).
constexpr int64_t MxWeightScaleCount(int64_t rows, int64_t cols) {
  return MxBlocks(rows) * MxBlocks(cols);
}
constexpr int64_t MxActivationScaleCount(int64_t rows, int64_t cols) {
  return rows * MxBlocks(cols);
}

// NumericsError unless opt.elem is kE4M3 or kE5M2 and opt.rule one of the two rules (every
// quantizer, on any backend, checks its options with it).
void CheckMxOptions(const MxOptions& opt);

// UE8M0 scale code of a block whose largest magnitude has fp32 bits `amax_bits` (sign bit
// clear; NaN/Inf bit patterns allowed). Applies the rule, the clamp and the special cases
// described above.
uint8_t MxScaleCode(uint32_t amax_bits, const MxOptions& opt = {});

// Weights: w, q row-major [rows, cols]; scales row-major [ceil(rows/32), ceil(cols/32)].
void MxQuantizeWeight(const float* w, int64_t rows, int64_t cols, uint8_t* q, uint8_t* scales,
                      const MxOptions& opt = {});
// out row-major [rows, cols]. Only opt.elem is used.
void MxDequantizeWeight(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                        float* out, const MxOptions& opt = {});
// out row-major [cols, rows] = dequantized Wᵀ (the dgrad operand), same codes and scales.
void MxDequantizeWeightTransposed(const uint8_t* q, const uint8_t* scales, int64_t rows,
                                  int64_t cols, float* out_t, const MxOptions& opt = {});

// Activations: x, q row-major [rows, cols]; scales row-major [rows, ceil(cols/32)].
void MxQuantizeActivation(const float* x, int64_t rows, int64_t cols, uint8_t* q, uint8_t* scales,
                          const MxOptions& opt = {});
void MxDequantizeActivation(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                            float* out, const MxOptions& opt = {});

// One 32-row band of a [rows, cols] weight matrix, as offsets into the row-major element
// array (elements and FP8 codes) and into the scale grid.
struct MxBand {
  int64_t row_begin, row_end;      // rows [row_begin, row_end)
  int64_t elem_begin, elem_end;    // = row_begin·cols, row_end·cols
  int64_t scale_begin, scale_end;  // = band·ceil(cols/32), (band+1)·ceil(cols/32)
};

inline int64_t MxNumBands(int64_t rows) { return MxBlocks(rows); }

// Band b of a [rows, cols] matrix; throws NumericsError if b is out of range.
MxBand MxWeightBand(int64_t rows, int64_t cols, int64_t band);

// Bands touched by the flat element range [elem_begin, elem_end) of a row-major [rows, cols]
// matrix (e.g. one rank's shard): returns [first, last) band indices (empty if the range is).
void MxBandsTouching(int64_t rows, int64_t cols, int64_t elem_begin, int64_t elem_end,
                     int64_t* first_band, int64_t* last_band);

// Quantizes band `band` of a [rows, cols] weight matrix. band_src holds the band's elements
// contiguously (rows [row_begin, row_end), row-major, (row_end-row_begin)·cols floats);
// band_q receives as many FP8 codes and band_scales the band's ceil(cols/32) scales.
// Bit-identical to the corresponding part of MxQuantizeWeight on the whole matrix.
void MxQuantizeWeightBand(const float* band_src, int64_t rows, int64_t cols, int64_t band,
                          uint8_t* band_q, uint8_t* band_scales, const MxOptions& opt = {});

}  // namespace sshsdp
