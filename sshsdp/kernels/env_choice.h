// A process-wide kernel switch read from an environment variable once, on first use: the
// bf16 GEMM kernel (SSHSDP_BF16_GEMM_KERNEL) and the bf16 attention's products engine
// (SSHSDP_BF16_ATTENTION_PRODUCTS) are each one EnvChoice. Unset or empty means "auto"; a
// value the parser refuses throws its NumericsError again with the variable named in front,
// so a launch fails naming what to fix. A setter (tests, benchmarks) overrides the variable.
//
//   EnvChoice<Bf16GemmKernel> g_kernel("SSHSDP_BF16_GEMM_KERNEL", &ParseBf16GemmKernel);
//   Bf16GemmKernel k = g_kernel.Get();   // "SSHSDP_BF16_GEMM_KERNEL=mkl: bf16 GEMM kernel ..."
//   g_kernel.Set(Bf16GemmKernel::kOneDnn);
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "sshsdp/base/error.h"

namespace sshsdp::kernels {

// parse(value of `var`, or "auto" when unset or empty); its NumericsError comes back as
// "VAR=value: <message>".
template <typename Parse>
auto ParseEnvChoice(const char* var, Parse&& parse) {
  const char* env = std::getenv(var);
  try {
    return parse(env && *env ? std::string_view(env) : std::string_view("auto"));
  } catch (const NumericsError& e) {
    throw NumericsError(fmt::format("{}={}: {}", var, env ? env : "", e.what()));
  }
}

// An enum choice resolved by ParseEnvChoice on the first Get and kept for the process. Any
// thread may call Get and Set; two first Gets racing both parse the same variable.
template <typename T>
class EnvChoice {
 public:
  constexpr EnvChoice(const char* var, T (*parse)(std::string_view)) : var_(var), parse_(parse) {}

  T Get() {
    int v = value_.load();
    if (v < 0) {
      v = static_cast<int>(ParseEnvChoice(var_, parse_));
      value_.store(v);
    }
    return static_cast<T>(v);
  }

  void Set(T value) { value_.store(static_cast<int>(value)); }  // the caller has validated it

 private:
  const char* var_;
  T (*parse_)(std::string_view);
  std::atomic<int> value_{-1};  // -1: not resolved yet
};

}  // namespace sshsdp::kernels
