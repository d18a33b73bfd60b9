// The GEMM providers of gemm_provider.h: MKL and BLIS loaded at run time through their CBLAS
// sgemm, and the table that picks one per CPU kind.
//
// Loading with dlopen keeps both optional at build time and keeps MKL's 370 MB out of every
// binary: the build links only oneDNN, and a provider's library is looked for when it is first
// asked for. MKL is told to thread on GNU OpenMP (libgomp, the runtime oneDNN and ParallelFor
// already use), so the process holds one OpenMP runtime; before each product a provider is
// given omp_get_max_threads() threads, following SetKernelThreads.
#include "sshsdp/kernels/gemm_provider.h"

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <functional>
#include <mutex>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/env_choice.h"
#include "sshsdp/kernels/gemm_internal.h"

namespace sshsdp::kernels {
namespace {

// CBLAS's enums, the same in every implementation.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
// MKL's cblas_sgemm_batch_strided: the same product over `batch` matrices a stride apart.
using CblasSgemmBatchStrided = void (*)(int, int, int, int, int, int, float, const float*, int, int,
                                        const float*, int, int, float, float*, int, int, int);

struct BlasLibrary {
  bool loaded = false;
  std::string path, version, error;
  CblasSgemm sgemm = nullptr;
  CblasSgemmBatchStrided sgemm_batch_strided = nullptr;  // MKL only; else a loop of sgemm
  std::function<void(int)> set_threads;
  int threads = -1;
};

// What scripts/install_mkl.py installs: ${XDG_CACHE_HOME:-~/.cache}/sshsdp/mkl-<v>/lib.
std::string DefaultMklPath() {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string root = cache && *cache ? cache : fmt::format("{}/.cache", home ? home : "");
  return root + "/sshsdp/mkl-2025.3.1/lib/libmkl_rt.so.2";
}

template <typename F>
F Symbol(void* handle, const char* name, BlasLibrary& lib) {
  void* p = dlsym(handle, name);
  if (!p && lib.error.empty()) lib.error = fmt::format("{} has no symbol {}", lib.path, name);
  return reinterpret_cast<F>(p);
}

void* Open(BlasLibrary& lib, const char* env, std::string fallback, const char* fix) {
  const char* forced = std::getenv(env);
  lib.path = forced && *forced ? forced : std::move(fallback);
  void* handle = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) lib.error = fmt::format("{} ({})", dlerror(), fix);  // dlerror names the path
  return handle;
}

BlasLibrary LoadMkl() {
  BlasLibrary lib;
  void* h = Open(lib, "SSHSDP_MKL_LIB", DefaultMklPath(),
                 "run scripts/setup.sh, which installs MKL from PyPI, or set SSHSDP_MKL_LIB to a "
                 "libmkl_rt.so.2");
  if (!h) return lib;
  auto set_layer = Symbol<int (*)(int)>(h, "MKL_Set_Threading_Layer", lib);
  auto set_interface = Symbol<int (*)(int)>(h, "MKL_Set_Interface_Layer", lib);
  auto version = Symbol<void (*)(char*, int)>(h, "MKL_Get_Version_String", lib);
  auto cbwr = Symbol<int (*)(int)>(h, "MKL_CBWR_Set", lib);
  auto set_threads = Symbol<void (*)(int)>(h, "MKL_Set_Num_Threads", lib);
  lib.sgemm = Symbol<CblasSgemm>(h, "cblas_sgemm", lib);
  if (!lib.error.empty()) return lib;
  // Optional (MKL 2020 update 2 and later): without it, batches run as a loop of sgemm.
  lib.sgemm_batch_strided =
      reinterpret_cast<CblasSgemmBatchStrided>(dlsym(h, "cblas_sgemm_batch_strided"));
  set_interface(0);  // MKL_INTERFACE_LP64: 32-bit integers
  set_layer(3);      // MKL_THREADING_GNU: libgomp
  // Conditional numerical reproducibility, strict: the same bits for the same inputs whatever
  // the operands' memory alignment (sshsdp's resume and evaluation are bit-exact).
  cbwr(2 | 0x10000);  // MKL_CBWR_AUTO | MKL_CBWR_STRICT
  // "Intel(R) oneAPI Math Kernel Library Version 2025.3-Product Build ..." -> "MKL 2025.3".
  char buf[256] = {};
  version(buf, sizeof(buf) - 1);
  const std::string text = buf;
  const size_t at = text.find("Version ");
  const std::string number = at == std::string::npos ? text : text.substr(at + 8);
  lib.version = "MKL " + number.substr(0, number.find_first_of("- "));
  lib.set_threads = set_threads;
  lib.loaded = true;
  return lib;
}

BlasLibrary LoadBlis() {
  BlasLibrary lib;
  void* h = Open(lib, "SSHSDP_BLIS_LIB", "libblis.so.4",
                 "run scripts/setup.sh, which installs Debian's libblis4-openmp, or set "
                 "SSHSDP_BLIS_LIB to a libblis.so.4");
  if (!h) return lib;
  auto version = Symbol<const char* (*)()>(h, "bli_info_get_version_str", lib);
  // BLIS's thread count is a dim_t, a long on x86-64.
  auto set_threads = Symbol<void (*)(long)>(h, "bli_thread_set_num_threads", lib);
  lib.sgemm = Symbol<CblasSgemm>(h, "cblas_sgemm", lib);
  if (!lib.error.empty()) return lib;
  lib.version = fmt::format("BLIS {}", version());
  lib.set_threads = [set_threads](int n) { set_threads(n); };
  lib.loaded = true;
  return lib;
}

// Each library is loaded once, on first use, and never unloaded.
BlasLibrary& Library(GemmProvider p) {
  SSHSDP_CHECK(p != GemmProvider::kOneDnn, NumericsError, "oneDNN is linked, not loaded");
  static std::once_flag mkl_once, blis_once;
  static BlasLibrary mkl, blis;
  if (p == GemmProvider::kMkl) {
    std::call_once(mkl_once, [] { mkl = LoadMkl(); });
    return mkl;
  }
  std::call_once(blis_once, [] { blis = LoadBlis(); });
  return blis;
}

int CheckedInt(int64_t v, const char* what) {
  SSHSDP_CHECK(
      v <= INT_MAX, NumericsError,
      "GEMM {} = {} exceeds the 32-bit integers of the BLAS providers (SSHSDP_GEMM=onednn)", what,
      v);
  return static_cast<int>(v);
}

// The table's choice for this CPU; MKL is loaded (to see whether it can be) only where the
// table would pick it.
GemmProvider AutoProvider(std::string* why) {
  const CpuKind cpu = DetectCpuKind();
  const bool mkl = cpu.vendor == CpuKind::Vendor::kIntel && GemmProviderLoads(GemmProvider::kMkl);
  return ChooseGemmProvider(cpu, mkl, why);
}

GemmProvider ParseProvider(std::string_view name) {
  if (name == "auto") {
    std::string why;
    return AutoProvider(&why);
  }
  GemmProvider p;
  if (name == "onednn") {
    p = GemmProvider::kOneDnn;
  } else if (name == "mkl") {
    p = GemmProvider::kMkl;
  } else {
    SSHSDP_CHECK(name == "blis", NumericsError,
                 "GEMM provider '{}' is not one of auto, onednn, mkl, blis", name);
    p = GemmProvider::kBlis;
  }
  std::string why;
  SSHSDP_CHECK(GemmProviderLoads(p, &why), NumericsError, "GEMM provider {}: {}", name, why);
  return p;
}

}  // namespace

std::string_view GemmProviderName(GemmProvider p) {
  switch (p) {
    case GemmProvider::kOneDnn:
      return "onednn";
    case GemmProvider::kMkl:
      return "mkl";
    case GemmProvider::kBlis:
      return "blis";
  }
  return "?";
}

std::string_view GemmProviderLabel(GemmProvider p) {
  return p == GemmProvider::kOneDnn ? "oneDNN" : p == GemmProvider::kMkl ? "MKL" : "BLIS";
}

std::string CpuKind::Describe() const {
  const char* v = vendor == Vendor::kIntel ? "Intel" : vendor == Vendor::kAmd ? "AMD" : "other";
  return fmt::format("{}, {}", v, avx512 ? "AVX-512" : "no AVX-512");
}

CpuKind DetectCpuKind() {
  CpuKind k;
  __builtin_cpu_init();
  if (__builtin_cpu_is("intel")) k.vendor = CpuKind::Vendor::kIntel;
  if (__builtin_cpu_is("amd")) k.vendor = CpuKind::Vendor::kAmd;
  k.avx512 = __builtin_cpu_supports("avx512f");
  return k;
}

// The measurements behind each row are in docs/performance.md, "GEMM providers".
GemmProvider ChooseGemmProvider(const CpuKind& cpu, bool mkl_loads, std::string* why) {
  if (cpu.vendor == CpuKind::Vendor::kIntel) {
    if (mkl_loads) {
      *why = "Intel CPU: MKL (PyTorch's fp32 GEMMs, MKL, ran 1.2x oneDNN 2.6 on a Xeon)";
      return GemmProvider::kMkl;
    }
    *why = "Intel CPU, but MKL does not load (scripts/setup.sh installs it): oneDNN";
    return GemmProvider::kOneDnn;
  }
  if (cpu.vendor == CpuKind::Vendor::kAmd && cpu.avx512) {
    *why = "AMD with AVX-512: oneDNN (1.5-3.9x MKL and BLIS on Zen 5, which run AVX2 code)";
  } else {
    *why =
        fmt::format("{}: oneDNN (MKL and BLIS not measured faster on this kind)", cpu.Describe());
  }
  return GemmProvider::kOneDnn;
}

GemmProvider ParseGemmProvider(std::string_view name) { return ParseProvider(name); }

bool GemmProviderLoads(GemmProvider p, std::string* why) {
  if (p == GemmProvider::kOneDnn) return true;
  BlasLibrary& lib = Library(p);
  if (!lib.loaded && why) *why = lib.error;
  return lib.loaded;
}

std::string GemmProviderDescription(GemmProvider p) {
  if (p == GemmProvider::kOneDnn) return "oneDNN " + internal::OneDnnVersion();
  BlasLibrary& lib = Library(p);
  if (!lib.loaded) return fmt::format("{} (not loaded: {})", GemmProviderName(p), lib.error);
  return fmt::format("{} ({})", lib.version, lib.path);
}

namespace internal {

GemmProvider ProviderLocked(GemmState& s) {
  if (!s.provider) {
    const char* env = std::getenv("SSHSDP_GEMM");
    s.provider = ParseEnvChoice("SSHSDP_GEMM", &ParseProvider);
    if (env && *env && std::string_view(env) != "auto") {
      s.provider_reason = fmt::format("SSHSDP_GEMM={}", env);
    } else {
      AutoProvider(&s.provider_reason);
    }
  }
  return *s.provider;
}

void BlasExecute(GemmProvider p, const GemmKey& key, const float* a, const float* b, float* c) {
  BlasLibrary& lib = Library(p);
  SSHSDP_CHECK(lib.loaded, NumericsError, "GEMM provider {}: {}", GemmProviderName(p), lib.error);
  const int threads = omp_get_max_threads();
  if (threads != lib.threads) lib.set_threads(lib.threads = threads);
  const int m = CheckedInt(key.m, "m"), n = CheckedInt(key.n, "n"), k = CheckedInt(key.k, "k");
  const int lda = CheckedInt(key.lda, "lda"), ldb = CheckedInt(key.ldb, "ldb");
  const int ldc = CheckedInt(key.ldc, "ldc");
  const int ta = key.trans_a ? kTrans : kNoTrans, tb = key.trans_b ? kTrans : kNoTrans;
  const float beta = key.accumulate ? 1.0f : 0.0f;  // beta 0: C is written, never read
  // Element strides between the products: a grid's, or a dense batch's matrix sizes.
  const auto& g = key.grid_strides;
  const bool grid = key.outer > 0;
  const int64_t outer = grid ? key.outer : 1;
  const int64_t sa = grid ? g[1] : m * static_cast<int64_t>(k);
  const int64_t sb = grid ? g[3] : k * static_cast<int64_t>(n);
  const int64_t sc = grid ? g[5] : m * static_cast<int64_t>(n);
  // One batched call per outer index where MKL takes it: its C matrices must not overlap
  // (stride ≥ ldc·m: attention's output written into packed rows, a head's dh columns apart,
  // is refused with "Parameter 17 was incorrect" and nothing computed), and every offset
  // within the batch must fit its 32-bit integers.
  const int64_t span = std::max({sa, sb, sc}) * key.batch;
  if (lib.sgemm_batch_strided && key.batch > 1 && sc >= ldc * static_cast<int64_t>(m) &&
      span <= INT_MAX) {
    for (int64_t o = 0; o < outer; ++o)
      lib.sgemm_batch_strided(kRowMajor, ta, tb, m, n, k, key.alpha, a + o * g[0], lda,
                              static_cast<int>(sa), b + o * g[2], ldb, static_cast<int>(sb), beta,
                              c + o * g[4], ldc, static_cast<int>(sc), static_cast<int>(key.batch));
    return;
  }
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < key.batch; ++i) {
      lib.sgemm(kRowMajor, ta, tb, m, n, k, key.alpha, a + o * g[0] + i * sa, lda,
                b + o * g[2] + i * sb, ldb, beta, c + o * g[4] + i * sc, ldc);
    }
  }
}

}  // namespace internal

void SetGemmProvider(GemmProvider p) {
  internal::GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.provider = ParseProvider(GemmProviderName(p));
  s.provider_reason = "SetGemmProvider";
}

GemmProvider ActiveGemmProvider() {
  internal::GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  return internal::ProviderLocked(s);
}

std::string GemmProviderReason() {
  internal::GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  internal::ProviderLocked(s);
  return s.provider_reason;
}

}  // namespace sshsdp::kernels
