// The state and helpers that matmul.h's implementation files share; not part of the API.
//
//   gemm_policy.cc    CPU probe and policy: the bf16 path (native / widened), the ISA, the
//                     one-line description of the GEMM path;
//   onednn_gemm.cc    oneDNN's primitive cache and execution;
//   gemm_provider.cc  the run-time loaded providers (MKL, BLIS) and the provider choice;
//   matmul.cc         dispatch: Gemm, GemmStrided, GemmBatchedStrided onto a provider, the AMX
//                     kernel or oneDNN;
//   linear.cc         the linear layers' products and their rounding of activations.
//
// One process-wide GemmState holds every cache and scratch buffer; every function ending in
// Locked runs with its mutex held (oneDNN's shared scratchpad and the scratch buffers are not
// safe for concurrent use), so any thread may call the public functions.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "sshsdp/kernels/gemm_provider.h"
#include "sshsdp/kernels/matmul.h"

namespace sshsdp::kernels::internal {

// One product, as the caches and providers see it.
struct GemmKey {
  bool trans_a, trans_b;
  int64_t batch, m, n, k;
  int64_t lda, ldb, ldc;  // row strides as stored
  DType ab, c;
  bool accumulate;
  float alpha;
  // GemmBatchedStrided: a [outer, batch] grid of products at these element strides (outer
  // and inner stride of A, B, C); outer == 0 for every other product.
  int64_t outer = 0;
  std::array<int64_t, 6> grid_strides{};
  auto Tie() const {
    return std::tie(trans_a, trans_b, batch, m, n, k, lda, ldb, ldc, ab, c, accumulate, alpha,
                    outer, grid_strides);
  }
  bool operator<(const GemmKey& o) const { return Tie() < o.Tie(); }
};

// A dense product: row strides are the stored widths.
GemmKey DenseKey(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab, DType c,
                 bool accumulate, int64_t batch);

struct OneDnnCache;  // onednn_gemm.cc

struct GemmState {
  std::mutex mu;
  OneDnnCache* onednn = nullptr;  // created on first use, never freed (as the state)
  std::vector<bf16> scratch_a, scratch_b;
  std::vector<float> scratch_c;
  std::vector<float> wide_a, wide_b;     // widened (or bf16-rounded) fp32 operands
  std::vector<float> pad_a;              // dy with padded rows (LinearBackwardWeight)
  std::optional<bool> native_bf16;       // probe: oneDNN runs bf16 (non-reference)
  bool hardware_bf16 = false;            // probe: the ISA has bf16 instructions
  std::optional<Bf16GemmPath> path;      // resolved on first use
  std::string probe_note;                // why the probe said no, for messages
  std::optional<GemmProvider> provider;  // resolved on first use
  std::string provider_reason;           // why it was chosen
  int64_t rounded_elements = 0;          // LinearRoundedElements
};

GemmState& GetGemmState();

// --- gemm_policy.cc
Bf16GemmPath PathLocked(GemmState& s);
GemmProvider ProviderLocked(GemmState& s);

// --- onednn_gemm.cc
// Runs `key` on a cached oneDNN matmul primitive (created on first use).
void OneDnnExecuteLocked(GemmState& s, const GemmKey& key, const void* a, const void* b, void* c);
// oneDNN's implementation name for `key` ("brg:avx512_core").
std::string OneDnnImplementationLocked(GemmState& s, const GemmKey& key);
// True when oneDNN offers a non-reference bf16 matmul; sets *note to the reason when not.
bool OneDnnProbeBf16(GemmState& s, std::string* note);
// True when oneDNN's effective ISA has AVX512-BF16 instructions (AMX has them too).
bool OneDnnHasBf16Instructions();
std::string OneDnnVersion();  // "2.6.3"

// --- gemm_provider.cc
// Runs an fp32 `key` (any batch or grid) on a loaded MKL or BLIS.
void BlasExecute(GemmProvider p, const GemmKey& key, const float* a, const float* b, float* c);

// --- matmul.cc
// Gemm with the lock held. key.c is the destination dtype; key.accumulate the mode.
void GemmLocked(GemmState& s, GemmKey key, const void* a, const void* b, void* c);
// An fp32 x fp32 -> fp32 product (any batch or grid) on the active provider.
void RunFp32Locked(GemmState& s, const GemmKey& key, const void* a, const void* b, void* c);
// Widens a bf16 matrix of `rows` rows of `cols` elements at row stride ld into dense fp32
// scratch `buf` (grown as needed) and returns it.
const float* WidenInto(std::vector<float>& buf, const void* src, int64_t rows, int64_t cols,
                       int64_t ld);

}  // namespace sshsdp::kernels::internal
