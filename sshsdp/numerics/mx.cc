// MXFP8 block quantization and dequantization: scale rule, 32x32 weight blocks, 1x32
// activation blocks, 32-row bands (see mx.h for the numerics contract).
#include "sshsdp/numerics/mx.h"

#include <algorithm>
#include <bit>

#include "sshsdp/base/error.h"
#include "sshsdp/numerics/fp8.h"

namespace sshsdp {
void CheckMxOptions(const MxOptions& opt) {
  SSHSDP_CHECK(opt.elem == DType::kE4M3 || opt.elem == DType::kE5M2, NumericsError,
               "MX element type must be e4m3 or e5m2, got {}", DTypeName(opt.elem));
  SSHSDP_CHECK(opt.rule == MxScaleRule::kCeil || opt.rule == MxScaleRule::kOcpFloor, NumericsError,
               "unknown MX scale rule {}", static_cast<int>(opt.rule));
}

namespace {

void CheckShape(const char* what, int64_t rows, int64_t cols) {
  SSHSDP_CHECK(rows >= 0 && cols >= 0, NumericsError,
               "{}: matrix shape must be non-negative, got [{}, {}]", what, rows, cols);
}

// Quantizes `nrows` (1..32) consecutive rows of a row-major matrix with `cols` columns as one
// row of nrows x 32 blocks: writes nrows·cols codes and ceil(cols/32) scales.
template <uint8_t (*Encode)(float), uint8_t kNaNCode>
void QuantizeBlockRow(const float* src, int64_t nrows, int64_t cols, uint8_t* q, uint8_t* scales,
                      const MxOptions& opt) {
  const int64_t nblocks = MxBlocks(cols);
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t c0 = b * kMxBlock;
    const int64_t width = std::min<int64_t>(kMxBlock, cols - c0);
    // amax on the bit patterns: |x| as uint32 orders like the value, NaN patterns sort
    // above +Inf, and integer max vectorises.
    uint32_t amax = 0;
    for (int64_t r = 0; r < nrows; ++r) {
      const float* row = src + r * cols + c0;
      for (int64_t c = 0; c < width; ++c) {
        const uint32_t a = std::bit_cast<uint32_t>(row[c]) & 0x7FFFFFFFu;
        amax = a > amax ? a : amax;
      }
    }
    const uint8_t code = MxScaleCode(amax, opt);
    scales[b] = code;
    if (code == kUe8m0NaN) {
      for (int64_t r = 0; r < nrows; ++r) std::fill_n(q + r * cols + c0, width, kNaNCode);
      continue;
    }
    // 2^-e = 2^(127-code): UE8M0 code 254-code. Multiplying by it is exact (see mx.h).
    const float inv = Ue8m0ToFloat(static_cast<uint8_t>(254 - code));
    for (int64_t r = 0; r < nrows; ++r) {
      const float* row = src + r * cols + c0;
      uint8_t* qrow = q + r * cols + c0;
      for (int64_t c = 0; c < width; ++c) qrow[c] = Encode(row[c] * inv);
    }
  }
}

void QuantizeRows(const float* src, int64_t nrows, int64_t cols, uint8_t* q, uint8_t* scales,
                  const MxOptions& opt) {
  if (opt.elem == DType::kE4M3) {
    QuantizeBlockRow<fp8_internal::EncodeE4M3SatFinite, kE4M3NaN>(src, nrows, cols, q, scales, opt);
  } else {
    QuantizeBlockRow<fp8_internal::EncodeE5M2SatFinite, kE5M2NaN>(src, nrows, cols, q, scales, opt);
  }
}

const float* DecodeTable(const MxOptions& opt) {
  CheckMxOptions(opt);
  return opt.elem == DType::kE4M3 ? fp8_internal::kE4M3Table.data()
                                  : fp8_internal::kE5M2Table.data();
}

// out[r·ld_r + c·ld_c] = table[q] · scale over a row-major [rows, cols] code matrix whose
// scale for (r, c) is scales[(r / block_rows)·ceil(cols/32) + c/32].
void Dequantize(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                int64_t block_rows, float* out, bool transpose, const float* table) {
  const int64_t nblocks = MxBlocks(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* srow = scales + (r / block_rows) * nblocks;
    const uint8_t* qrow = q + r * cols;
    for (int64_t b = 0; b < nblocks; ++b) {
      const float s = Ue8m0ToFloat(srow[b]);
      const int64_t c0 = b * kMxBlock;
      const int64_t c1 = std::min<int64_t>(c0 + kMxBlock, cols);
      if (!transpose) {
        float* orow = out + r * cols;
        for (int64_t c = c0; c < c1; ++c) orow[c] = table[qrow[c]] * s;
      } else {
        for (int64_t c = c0; c < c1; ++c) out[c * rows + r] = table[qrow[c]] * s;
      }
    }
  }
}

}  // namespace

uint8_t MxScaleCode(uint32_t amax_bits, const MxOptions& opt) {
  const uint32_t a = amax_bits & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return kUe8m0NaN;  // NaN or Inf in the block
  if (a == 0) return 0;                    // zero block: 2^-127 (see mx.h)
  int exp;                                 // amax = 1.m · 2^exp
  uint32_t mant;                           // the 23 fraction bits of 1.m
  if ((a >> 23) == 0) {
    const int top = 31 - std::countl_zero(a);  // fp32 subnormal: normalise
    exp = -149 + top;
    mant = (a << (23 - top)) & 0x7FFFFFu;
  } else {
    exp = static_cast<int>(a >> 23) - 127;
    mant = a & 0x7FFFFFu;
  }
  const int emax_elem = opt.elem == DType::kE5M2 ? 15 : 8;
  int e = exp - emax_elem;  // OCP floor rule
  // Ceil rule: max_elem = 1.75·2^emax_elem for both formats, so amax <= max_elem·2^e holds
  // for e = exp - emax_elem iff 1.m <= 1.75 (fraction bits <= 0x600000), else one more.
  if (opt.rule == MxScaleRule::kCeil && mant > 0x600000u) ++e;
  e = std::clamp(e, -kUe8m0Bias, kUe8m0Bias);
  return static_cast<uint8_t>(e + kUe8m0Bias);
}

MxBand MxWeightBand(int64_t rows, int64_t cols, int64_t band) {
  CheckShape("MxWeightBand", rows, cols);
  SSHSDP_CHECK(band >= 0 && band < MxNumBands(rows), NumericsError,
               "band {} out of range: a [{}, {}] matrix has {} bands of 32 rows", band, rows, cols,
               MxNumBands(rows));
  MxBand b;
  b.row_begin = band * kMxBlock;
  b.row_end = std::min(rows, b.row_begin + kMxBlock);
  b.elem_begin = b.row_begin * cols;
  b.elem_end = b.row_end * cols;
  b.scale_begin = band * MxBlocks(cols);
  b.scale_end = b.scale_begin + MxBlocks(cols);
  return b;
}

void MxBandsTouching(int64_t rows, int64_t cols, int64_t elem_begin, int64_t elem_end,
                     int64_t* first_band, int64_t* last_band) {
  CheckShape("MxBandsTouching", rows, cols);
  SSHSDP_CHECK(0 <= elem_begin && elem_begin <= elem_end && elem_end <= rows * cols, NumericsError,
               "element range [{}, {}) is outside a [{}, {}] matrix", elem_begin, elem_end, rows,
               cols);
  if (elem_begin == elem_end) {
    *first_band = *last_band = 0;
    return;
  }
  const int64_t band_elems = kMxBlock * cols;
  *first_band = elem_begin / band_elems;
  *last_band = (elem_end - 1) / band_elems + 1;
}

void MxQuantizeWeightBand(const float* band_src, int64_t rows, int64_t cols, int64_t band,
                          uint8_t* band_q, uint8_t* band_scales, const MxOptions& opt) {
  CheckMxOptions(opt);
  const MxBand b = MxWeightBand(rows, cols, band);
  QuantizeRows(band_src, b.row_end - b.row_begin, cols, band_q, band_scales, opt);
}

void MxQuantizeWeight(const float* w, int64_t rows, int64_t cols, uint8_t* q, uint8_t* scales,
                      const MxOptions& opt) {
  CheckMxOptions(opt);
  CheckShape("MxQuantizeWeight", rows, cols);
  for (int64_t band = 0; band < MxNumBands(rows); ++band) {
    const MxBand b = MxWeightBand(rows, cols, band);
    MxQuantizeWeightBand(w + b.elem_begin, rows, cols, band, q + b.elem_begin,
                         scales + b.scale_begin, opt);
  }
}

void MxDequantizeWeight(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                        float* out, const MxOptions& opt) {
  CheckShape("MxDequantizeWeight", rows, cols);
  Dequantize(q, scales, rows, cols, kMxBlock, out, false, DecodeTable(opt));
}

void MxDequantizeWeightTransposed(const uint8_t* q, const uint8_t* scales, int64_t rows,
                                  int64_t cols, float* out_t, const MxOptions& opt) {
  CheckShape("MxDequantizeWeightTransposed", rows, cols);
  Dequantize(q, scales, rows, cols, kMxBlock, out_t, true, DecodeTable(opt));
}

void MxQuantizeActivation(const float* x, int64_t rows, int64_t cols, uint8_t* q, uint8_t* scales,
                          const MxOptions& opt) {
  CheckMxOptions(opt);
  CheckShape("MxQuantizeActivation", rows, cols);
  const int64_t nblocks = MxBlocks(cols);
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeRows(x + r * cols, 1, cols, q + r * cols, scales + r * nblocks, opt);
  }
}

void MxDequantizeActivation(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                            float* out, const MxOptions& opt) {
  CheckShape("MxDequantizeActivation", rows, cols);
  Dequantize(q, scales, rows, cols, 1, out, false, DecodeTable(opt));
}

}  // namespace sshsdp
