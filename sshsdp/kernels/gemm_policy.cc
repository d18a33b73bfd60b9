// The CPU probe and policy of matmul.h: which path bf16 products take (native or widened, see
// matmul.h), and the one-line description of the GEMM path a run header prints.
//
// The bf16 path is probed once: a bf16 matmul primitive for a representative shape is
// created; if oneDNN refuses it (no bf16 on this ISA), only offers its reference
// implementation, or the CPU lacks bf16 instructions (AVX-512 without BF16, where oneDNN
// emulates them), bf16 products are widened by default.
#include <mutex>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/env_choice.h"
#include "sshsdp/kernels/gemm_internal.h"

namespace sshsdp::kernels {
namespace {

using internal::GemmState;

bool NativeSupportedLocked(GemmState& s) {
  if (!s.native_bf16) {
    s.native_bf16 = internal::OneDnnProbeBf16(s, &s.probe_note);
    s.hardware_bf16 = internal::OneDnnHasBf16Instructions();
    if (*s.native_bf16 && !s.hardware_bf16) {
      s.probe_note = "oneDNN only emulates bf16 matmul (SSHSDP_BF16_GEMM=native uses it)";
    }
  }
  return *s.native_bf16;
}

// The probe's choice: native where the CPU multiplies bf16 itself.
bool AutoIsNative(GemmState& s) { return NativeSupportedLocked(s) && s.hardware_bf16; }

std::string NoNativeMessage(GemmState& s) {
  return fmt::format("{} on this CPU: ISA {}, native bf16 GEMMs need AVX512-BF16 or AMX",
                     s.probe_note, CpuIsaName());
}

Bf16GemmPath ParseLocked(GemmState& s, std::string_view name) {
  if (name == "auto") {
    return AutoIsNative(s) ? Bf16GemmPath::kNative : Bf16GemmPath::kWidened;
  }
  if (name == "widened") return Bf16GemmPath::kWidened;
  SSHSDP_CHECK(name == "native", NumericsError,
               "bf16 GEMM path '{}' is not one of auto, native, widened", name);
  SSHSDP_CHECK(NativeSupportedLocked(s), NumericsError,
               "bf16 GEMM path 'native' requested, but {} (use 'auto' or 'widened': bf16 "
               "operands widened to fp32; or --weight-dtype fp32)",
               NoNativeMessage(s));
  return Bf16GemmPath::kNative;
}

// "oneDNN brg:avx512_core" for oneDNN (its implementation for a 1024³ product), else the
// provider's description.
std::string Fp32PathName() {
  const GemmProvider p = ActiveGemmProvider();
  if (p != GemmProvider::kOneDnn) return GemmProviderDescription(p);
  return "oneDNN " + GemmImplementation(false, true, 1024, 1024, 1024, DType::kF32, DType::kF32);
}

}  // namespace

namespace internal {

Bf16GemmPath PathLocked(GemmState& s) {
  if (!s.path) {
    s.path =
        ParseEnvChoice("SSHSDP_BF16_GEMM", [&](std::string_view v) { return ParseLocked(s, v); });
  }
  return *s.path;
}

}  // namespace internal

std::string_view Bf16GemmPathName(Bf16GemmPath path) {
  return path == Bf16GemmPath::kNative ? "native" : "widened";
}

Bf16GemmPath ParseBf16GemmPath(std::string_view name) {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  return ParseLocked(s, name);
}

bool NativeBf16GemmSupported() {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  return NativeSupportedLocked(s);
}

Bf16GemmPath ActiveBf16GemmPath() {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  return internal::PathLocked(s);
}

void SetBf16GemmPath(Bf16GemmPath path) {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.path = ParseLocked(s, Bf16GemmPathName(path));
}

std::string GemmPathDescription(DType dtype) {
  const std::string fp32 = Fp32PathName();
  if (dtype != DType::kBF16) return fmt::format("{} ({})", DTypeName(dtype), fp32);
  if (ActiveBf16GemmPath() == Bf16GemmPath::kNative) {
    const std::string onednn =
        GemmImplementation(false, true, 1024, 1024, 1024, dtype, DType::kF32);
    if (ActiveBf16GemmKernel() == Bf16GemmKernel::kAmx) {
      return fmt::format("bf16 native (AMX tiles, sshsdp's kernel; oneDNN {} for batched products)",
                         onednn);
    }
    return fmt::format("bf16 native (oneDNN {})", onednn);
  }
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::string why = AutoIsNative(s)
                              ? std::string("forced by SSHSDP_BF16_GEMM / SetBf16GemmPath")
                              : NoNativeMessage(s);
  return fmt::format("bf16 widened to fp32 ({}), fp32 {}", why, fp32);
}

std::string GemmImplementation(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               DType ab_dtype, DType c_dtype) {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  if (c_dtype == DType::kBF16 && ab_dtype == DType::kF32) c_dtype = DType::kF32;
  if (ab_dtype == DType::kBF16 && internal::PathLocked(s) == Bf16GemmPath::kWidened) {
    ab_dtype = DType::kF32;
    if (c_dtype == DType::kBF16) c_dtype = DType::kF32;
  }
  const GemmProvider provider = internal::ProviderLocked(s);
  if (ab_dtype == DType::kF32 && provider != GemmProvider::kOneDnn) {
    return GemmProviderDescription(provider);
  }
  return internal::OneDnnImplementationLocked(
      s, internal::DenseKey(trans_a, trans_b, m, n, k, ab_dtype, c_dtype, false, 1));
}

}  // namespace sshsdp::kernels
