// Which library runs the fp32 GEMMs: oneDNN (Debian's, linked), Intel MKL (PyPI's, installed by
// scripts/setup.sh into ~/.cache/sshsdp) or BLIS (Debian's), the last two loaded at run time.
// MKL runs in strict conditional-numerical-reproducibility mode (bits independent of alignment).
//
// Every fp32 product of matmul.h — Gemm, GemmStrided, GemmBatchedStrided, the linear layers,
// and bf16 products on the widened path, which multiply in fp32 — runs on the active provider;
// native bf16 products stay on oneDNN or sshsdp's AMX kernel. The provider is chosen once per
// process from the CPU kind by a table of what measured fastest on that kind (docs/
// performance.md, "GEMM providers": measured on AMD Zen 5; the Intel row rests on PyTorch's MKL
// against oneDNN on a Xeon), or forced with SSHSDP_GEMM=auto|onednn|mkl|blis (or
// SetGemmProvider), so every provider that scripts/setup.sh installed is tested on any machine.
// The choice is per process and not agreed between ranks (every rank of a job normally runs on
// the same kind of CPU and installation); rank 0's header names it. Providers differ only in
// summation order: results agree to fp32 rounding, not bit for bit (a run's header and the
// bench JSON name the provider, through GemmPathDescription).
//
//   GemmProvider p = ActiveGemmProvider();           // SSHSDP_GEMM, else the table's choice
//   fmt::print("{}\n", GemmProviderDescription(p));  // "MKL 2025.3.1 (.../libmkl_rt.so.2)"
//   SetGemmProvider(GemmProvider::kBlis);            // throws if libblis.so.4 cannot load
#pragma once

#include <string>
#include <string_view>

namespace sshsdp::kernels {

enum class GemmProvider { kOneDnn, kMkl, kBlis };

// "onednn" / "mkl" / "blis" (SSHSDP_GEMM's values).
std::string_view GemmProviderName(GemmProvider p);
// "oneDNN" / "MKL" / "BLIS", for headers.
std::string_view GemmProviderLabel(GemmProvider p);

// What the automatic choice looks at: the CPU's vendor and widest vector ISA.
struct CpuKind {
  enum class Vendor { kIntel, kAmd, kOther } vendor = Vendor::kOther;
  bool avx512 = false;           // AVX-512F
  std::string Describe() const;  // "AMD, AVX-512"
};

// This process's CPU (cpuid, through the compiler's builtins).
CpuKind DetectCpuKind();

// The table: the provider measured fastest on this kind of CPU, given whether MKL could load
// (the only provider the table picks that may be missing). Sets *why to the measurement
// behind the choice, for the run header.
GemmProvider ChooseGemmProvider(const CpuKind& cpu, bool mkl_loads, std::string* why);

// Parses "auto" (the table's choice for this CPU), "onednn", "mkl" or "blis". Throws
// NumericsError naming the accepted values, or, for a provider whose library does not load,
// naming the library path tried, the loader's reason and the fix.
GemmProvider ParseGemmProvider(std::string_view name);

// The provider fp32 products take in this process: SSHSDP_GEMM if set, else the table's
// choice. Resolved once, on first use; throws NumericsError for a bad SSHSDP_GEMM.
GemmProvider ActiveGemmProvider();

// Forces the provider for the rest of the process (tests, benchmarks). Loads its library
// first and throws NumericsError where it cannot.
void SetGemmProvider(GemmProvider p);

// True when the provider's library loads (oneDNN always does); *why gets the reason if not.
bool GemmProviderLoads(GemmProvider p, std::string* why = nullptr);

// The provider with its version and, for a loaded library, its path: "oneDNN 2.6.3",
// "MKL 2025.3.1 (/root/.cache/sshsdp/mkl-2025.3.1/lib/libmkl_rt.so.2)".
std::string GemmProviderDescription(GemmProvider p);

// Why the active provider was chosen: "SSHSDP_GEMM=mkl", or the table's reason.
std::string GemmProviderReason();

}  // namespace sshsdp::kernels
