// DType names and bulk fp32 <-> bf16 conversion loops.
#include "sshsdp/numerics/dtype.h"

#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kBF16:
      return "bf16";
    case DType::kE4M3:
      return "e4m3";
    case DType::kE5M2:
      return "e5m2";
    case DType::kUE8M0:
      return "ue8m0";
  }
  return "?";
}

DType ParseDType(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "e4m3" || name == "fp8_e4m3") return DType::kE4M3;
  if (name == "e5m2" || name == "fp8_e5m2") return DType::kE5M2;
  if (name == "ue8m0" || name == "e8m0") return DType::kUE8M0;
  throw NumericsError(fmt::format("unknown dtype '{}': use one of fp32, bf16, e4m3, e5m2, ue8m0",
                                  std::string(name)));
}

void FloatToBf16(const float* src, bf16* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

void Bf16ToFloat(const bf16* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}

}  // namespace sshsdp
