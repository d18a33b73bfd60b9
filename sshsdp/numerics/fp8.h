// FP8 (OCP OFP8) element formats and the UE8M0 shared-scale format: scalar and bulk
// conversions between fp32 and E4M3 / E5M2, and UE8M0 decoding.
//
// MXFP8 runtime weights store E4M3 elements with UE8M0 block scales (mx.h builds on this).
// FP8 codes are held as raw bytes (uint8_t), like every other buffer in sshsdp; the DType tag
// of the buffer says which format the bytes are in.
//
//   uint8_t q = FloatToE4M3(3.3f, Fp8Overflow::kSaturate);   // 0x45 (3.25)
//   float f = E4M3ToFloat(q);                                 // 3.25f
//   uint8_t h = FloatToE5M2(1e6f, Fp8Overflow::kNonSaturating); // 0x7C (+Inf)
//   float s = Ue8m0ToFloat(130);                              // 2^3 = 8.0f
//   FloatToE4M3(src, dst, n, Fp8Overflow::kSaturate);         // bulk
//
// Formats (OCP 8-bit Floating Point Specification / OCP MX v1.0):
//   E4M3 ("fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits. Max ±448 (S.1111.110).
//     NaN = S.1111.111 (0x7F / 0xFF). No infinity. Smallest normal 2^-6, subnormals are
//     multiples of 2^-9.
//   E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: Inf = S.11111.00,
//     NaN = S.11111.{01,10,11}. Max ±57344. Smallest normal 2^-14, subnormals k·2^-16.
//   UE8M0: unsigned 8-bit exponent, value 2^(e-127) for e in [0, 254]; 0xFF = NaN. No zero,
//     no infinity. Every UE8M0 value is exactly representable in fp32 (2^-127 is an fp32
//     subnormal).
//
// Conversion fp32 -> FP8 rounds to nearest, ties to even, at the target precision
// (including inside the subnormal range). A value "overflows" when its rounded magnitude is
// above the format's max; what happens then depends on Fp8Overflow:
//   kSaturate:      ±max (±448 / ±57344). ±Inf also becomes ±max (like PTX cvt .satfinite).
//                   This is the mode MX quantization uses.
//   kNonSaturating: E5M2 -> ±Inf, E4M3 -> NaN (E4M3 has no Inf). ±Inf in: E5M2 ±Inf,
//                   E4M3 NaN.
// In both modes NaN in gives NaN out (sign kept, canonical payload 0x7F / 0x7E|sign for E5M2
// quiet NaN S.11111.10), and ±0 keeps its sign. Examples with ties: E4M3 464 (halfway
// between 448 and 480) rounds to even = 448, so it does not overflow; 465 overflows.
// E5M2 61440 (halfway between 57344 and 65536) rounds to even = 65536: it overflows.
//
// FP8 -> fp32 is exact (table lookup).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace sshsdp {

enum class Fp8Overflow : uint8_t {
  kSaturate = 0,       // clamp to ±max (and ±Inf -> ±max)
  kNonSaturating = 1,  // E5M2 -> ±Inf, E4M3 -> NaN
};

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
inline constexpr uint8_t kE4M3MaxCode = 0x7E;  // 448
inline constexpr uint8_t kE4M3NaN = 0x7F;      // canonical (positive) NaN
inline constexpr uint8_t kE5M2MaxCode = 0x7B;  // 57344
inline constexpr uint8_t kE5M2Inf = 0x7C;
inline constexpr uint8_t kE5M2NaN = 0x7E;  // canonical quiet NaN
inline constexpr uint8_t kUe8m0NaN = 0xFF;
inline constexpr int kUe8m0Bias = 127;

namespace fp8_internal {

// Decoded value of every code of a format with `mbits` mantissa bits and exponent `bias`;
// `ieee` = the all-ones exponent encodes Inf/NaN (E5M2), otherwise only S.1..1.1..1 is NaN
// (E4M3 "fn"). Built from bit patterns so it is a compile-time constant.
constexpr std::array<float, 256> MakeDecodeTable(int ebits, int mbits, int bias, bool ieee) {
  std::array<float, 256> t{};
  const uint32_t emax_field = (1u << ebits) - 1;
  for (uint32_t c = 0; c < 256; ++c) {
    const uint32_t sign = (c >> 7) << 31;
    const uint32_t e = (c >> mbits) & emax_field;
    const uint32_t m = c & ((1u << mbits) - 1);
    uint32_t bits;
    if (ieee && e == emax_field) {
      bits = m == 0 ? 0x7F800000u : 0x7FC00000u;
    } else if (!ieee && e == emax_field && m == (1u << mbits) - 1) {
      bits = 0x7FC00000u;
    } else if (e == 0) {
      if (m == 0) {
        bits = 0;
      } else {
        // m·2^(1-bias-mbits): normalise m (its top set bit becomes the implicit one).
        int top = 31 - std::countl_zero(m);
        int exp = 1 - bias - mbits + top;  // unbiased fp32 exponent
        uint32_t frac = (m & ~(1u << top)) << (23 - top);
        bits = (static_cast<uint32_t>(exp + 127) << 23) | frac;
      }
    } else {
      bits = (static_cast<uint32_t>(static_cast<int>(e) - bias + 127) << 23) | (m << (23 - mbits));
    }
    t[c] = std::bit_cast<float>(bits | sign);
  }
  return t;
}

inline constexpr std::array<float, 256> kE4M3Table = MakeDecodeTable(4, 3, 7, false);
inline constexpr std::array<float, 256> kE5M2Table = MakeDecodeTable(5, 2, 15, true);

// Reference fp32 -> FP8 encoder for finite |x| (sign handled by the caller): round to
// nearest even at `mbits` mantissa bits with minimum normal exponent 1-bias. Returns the
// unsigned code, which may exceed the format's max code (the caller decides overflow).
inline uint32_t EncodeMagnitude(uint32_t a, int mbits, int bias) {
  if (a == 0) return 0;
  int exp_field = static_cast<int>(a >> 23);
  uint32_t sig = a & 0x7FFFFFu;
  int e;  // unbiased exponent of the leading significand bit (position 23 of sig)
  if (exp_field == 0) {
    e = -126;  // fp32 subnormal: no implicit bit
  } else {
    e = exp_field - 127;
    sig |= 0x800000u;
  }
  const int emin = 1 - bias;
  int shift = 23 - mbits + (e < emin ? emin - e : 0);
  if (shift > 25) return 0;  // below half the smallest subnormal
  uint32_t rounded = sig >> shift;
  uint32_t rem = sig & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (rounded & 1u))) ++rounded;
  // Normal: (e+bias-1)<<mbits plus a significand that carries its implicit bit, so a
  // rounding carry into the next binade lands in the exponent field by itself.
  if (e >= emin) return (static_cast<uint32_t>(e + bias - 1) << mbits) + rounded;
  return rounded;  // subnormal (may round up into the smallest normal code)
}

// Branch-free saturating encoder for FINITE inputs (no NaN/Inf), bit-identical to
// FloatToE4M3/FloatToE5M2(f, kSaturate) on them (tested). The hot loop of MX quantization.
// Normal range: round the fp32 pattern at the target mantissa width (RNE by integer add)
// and rebias. Subnormal range: adding 2^(24-bias-mbits), whose ulp is the FP8 subnormal
// quantum, makes the FPU round to nearest even; the difference of the bit patterns is the
// code (8 = smallest normal comes out right).
template <int kMbits, int kBias, uint32_t kMaxCode>
inline uint8_t EncodeSatFinite(float f) {
  constexpr int kShift = 23 - kMbits;
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(128 - kBias) << 23;  // 2^(1-bias)
  constexpr uint32_t kMagicBits = static_cast<uint32_t>(24 - kBias - kMbits + 127) << 23;
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  uint32_t normal = (a + ((1u << (kShift - 1)) - 1) + ((a >> kShift) & 1u)) >> kShift;
  normal -= static_cast<uint32_t>(127 - kBias) << kMbits;
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(a) + std::bit_cast<float>(kMagicBits)) -
      kMagicBits;
  // Select by mask, not `?:`: both paths are computed anyway, and a conditional around the
  // float add would keep the compiler from vectorizing callers' loops.
  const uint32_t is_sub = 0u - static_cast<uint32_t>(a < kMinNormalBits);
  uint32_t code = (sub & is_sub) | (normal & ~is_sub);
  code = code < kMaxCode ? code : kMaxCode;
  return static_cast<uint8_t>(code | sign);
}

inline uint8_t EncodeE4M3SatFinite(float f) { return EncodeSatFinite<3, 7, 0x7E>(f); }
inline uint8_t EncodeE5M2SatFinite(float f) { return EncodeSatFinite<2, 15, 0x7B>(f); }

}  // namespace fp8_internal

// fp32 -> E4M3, round to nearest even. See the header comment for overflow, NaN, Inf.
inline uint8_t FloatToE4M3(float f, Fp8Overflow mode) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | kE4M3NaN;
  if (a == 0x7F800000u) return sign | (mode == Fp8Overflow::kSaturate ? kE4M3MaxCode : kE4M3NaN);
  // 480 and above always overflow; checking first keeps the exponent arithmetic small.
  uint32_t code = a >= 0x43F00000u ? 0xFFu : fp8_internal::EncodeMagnitude(a, 3, 7);
  if (code > kE4M3MaxCode) code = mode == Fp8Overflow::kSaturate ? kE4M3MaxCode : kE4M3NaN;
  return static_cast<uint8_t>(sign | code);
}

// fp32 -> E5M2, round to nearest even. See the header comment for overflow, NaN, Inf.
inline uint8_t FloatToE5M2(float f, Fp8Overflow mode) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | kE5M2NaN;
  if (a == 0x7F800000u) return sign | (mode == Fp8Overflow::kSaturate ? kE5M2MaxCode : kE5M2Inf);
  // 65536 and above always overflow.
  uint32_t code = a >= 0x47800000u ? 0xFFu : fp8_internal::EncodeMagnitude(a, 2, 15);
  if (code > kE5M2MaxCode) code = mode == Fp8Overflow::kSaturate ? kE5M2MaxCode : kE5M2Inf;
  return static_cast<uint8_t>(sign | code);
}

// FP8 -> fp32, exact.
inline float E4M3ToFloat(uint8_t c) { return fp8_internal::kE4M3Table[c]; }
inline float E5M2ToFloat(uint8_t c) { return fp8_internal::kE5M2Table[c]; }

// UE8M0 -> fp32: 2^(e-127), exact; 0xFF -> NaN.
inline float Ue8m0ToFloat(uint8_t e) {
  if (e == kUe8m0NaN) return std::bit_cast<float>(0x7FC00000u);
  if (e == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127, an fp32 subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
}

// UE8M0 code of 2^exp for exp in [-127, 127]; throws NumericsError outside that range.
uint8_t Ue8m0FromExponent(int exp);

// Bulk conversions (n elements; src and dst must not overlap). Same semantics as the
// scalar functions.
void FloatToE4M3(const float* src, uint8_t* dst, size_t n, Fp8Overflow mode);
void FloatToE5M2(const float* src, uint8_t* dst, size_t n, Fp8Overflow mode);
void E4M3ToFloat(const uint8_t* src, float* dst, size_t n);
void E5M2ToFloat(const uint8_t* src, float* dst, size_t n);

}  // namespace sshsdp
