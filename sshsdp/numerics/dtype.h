// Element types of sshsdp buffers and the scalar conversions between them.
//
// DType names every element type a buffer can hold: fp32 main weights/gradients/state,
// bf16 runtime weights and gradients, FP8 E4M3/E5M2 runtime weights (MXFP8 elements) and
// UE8M0 shared scales. bf16 is stored as its raw 16 bits (struct bf16) so that buffers of
// it are plain bytes; conversion from fp32 rounds to nearest, ties to even, and keeps
// NaN a (quiet) NaN and ±Inf as ±Inf.
//
//   size_t n = DTypeSize(DType::kBF16);            // 2
//   bf16 h = FloatToBf16(1.00390625f);             // tie -> even: 1.0
//   float f = Bf16ToFloat(h);
//   DType t = ParseDType("e4m3");                  // throws NumericsError on unknown names
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace sshsdp {

enum class DType : uint8_t {
  kF32 = 0,    // IEEE binary32
  kBF16 = 1,   // bfloat16: 1 sign, 8 exponent, 7 mantissa bits
  kE4M3 = 2,   // OCP FP8 E4M3 ("fn": no Inf, NaN = S.1111.111, max 448)
  kE5M2 = 3,   // OCP FP8 E5M2 (IEEE-like: Inf and NaN, max 57344)
  kUE8M0 = 4,  // OCP MX shared scale: 2^(e-127), 0xFF = NaN
};

inline constexpr int kNumDTypes = 5;

// Bytes per element.
constexpr size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : t == DType::kBF16 ? 2 : 1; }

// Canonical lower-case name: "fp32", "bf16", "e4m3", "e5m2", "ue8m0".
std::string_view DTypeName(DType t);

// Parses a canonical name (also accepts "f32", "float32", "bfloat16", "fp8_e4m3",
// "fp8_e5m2", "e8m0"). Throws NumericsError naming the accepted spellings otherwise.
DType ParseDType(std::string_view name);

// Raw bfloat16 bits.
struct bf16 {
  uint16_t bits;
  friend bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fp32 -> bf16, round to nearest, ties to even. NaN stays NaN (quiet bit set, sign kept);
// values that round past the bf16 maximum become ±Inf, as IEEE rounding requires.
inline bf16 FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// bf16 -> fp32 is exact.
inline float Bf16ToFloat(bf16 h) { return BitsToFloat(static_cast<uint32_t>(h.bits) << 16); }

// Rounds fp32 values through bf16 and back (what storing in a bf16 buffer does).
inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

// Bulk conversions (n elements; src and dst must not overlap).
void FloatToBf16(const float* src, bf16* dst, size_t n);
void Bf16ToFloat(const bf16* src, float* dst, size_t n);

}  // namespace sshsdp
