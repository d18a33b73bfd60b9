// Bulk fp32 <-> FP8 conversion loops and UE8M0 construction (scalar kernels are in fp8.h).
#include "sshsdp/numerics/fp8.h"

#include "sshsdp/base/error.h"

namespace sshsdp {

uint8_t Ue8m0FromExponent(int exp) {
  SSHSDP_CHECK(exp >= -kUe8m0Bias && exp <= kUe8m0Bias, NumericsError,
               "UE8M0 exponent {} is outside the representable range [-127, 127]", exp);
  return static_cast<uint8_t>(exp + kUe8m0Bias);
}

void FloatToE4M3(const float* src, uint8_t* dst, size_t n, Fp8Overflow mode) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToE4M3(src[i], mode);
}

void FloatToE5M2(const float* src, uint8_t* dst, size_t n, Fp8Overflow mode) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToE5M2(src[i], mode);
}

void E4M3ToFloat(const uint8_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fp8_internal::kE4M3Table[src[i]];
}

void E5M2ToFloat(const uint8_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fp8_internal::kE5M2Table[src[i]];
}

}  // namespace sshsdp
