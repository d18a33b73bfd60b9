// Dispatch of matmul.h's products: shapes checked, bf16 operands widened on the widened path,
// fp32 products onto the active provider (gemm_provider.h), bf16 ones onto sshsdp's AMX kernel
// or oneDNN.
//
// Widening costs one pass over each bf16 operand per call (O(rows·cols) against the product's
// O(m·n·k)); a bf16 operand passed to Gemm / GemmStrided is widened on every call (linear.cc
// rounds a linear layer's fp32 activation straight into fp32 scratch instead).
#include "sshsdp/kernels/matmul.h"

#include <algorithm>
#include <mutex>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/gemm_internal.h"

namespace sshsdp::kernels {
namespace internal {

GemmState& GetGemmState() {
  static GemmState* state = new GemmState();  // never destroyed: usable from static destructors
  return *state;
}

GemmKey DenseKey(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab, DType c,
                 bool accumulate, int64_t batch) {
  return GemmKey{trans_a,         trans_b, batch, m, n,          k,   trans_a ? m : k,
                 trans_b ? k : n, n,       ab,    c, accumulate, 1.0f};
}

const float* WidenInto(std::vector<float>& buf, const void* src, int64_t rows, int64_t cols,
                       int64_t ld) {
  const size_t count = static_cast<size_t>(rows * cols);
  if (buf.size() < count) buf.resize(count);
  const bf16* in = static_cast<const bf16*>(src);
  if (ld == cols) {
    WidenBf16(in, buf.data(), static_cast<int64_t>(count));
  } else {
    for (int64_t r = 0; r < rows; ++r) WidenBf16(in + r * ld, buf.data() + r * cols, cols);
  }
  return buf.data();
}

void RunFp32Locked(GemmState& s, const GemmKey& key, const void* a, const void* b, void* c) {
  const GemmProvider p = ProviderLocked(s);
  if (p == GemmProvider::kOneDnn) return OneDnnExecuteLocked(s, key, a, b, c);
  BlasExecute(p, key, static_cast<const float*>(a), static_cast<const float*>(b),
              static_cast<float*>(c));
}

namespace {

void CheckDtype(DType t) {
  SSHSDP_CHECK(t == DType::kF32 || t == DType::kBF16, NumericsError,
               "matmul supports fp32 and bf16 operands, got {} (dequantize MX weights first)",
               DTypeName(t));
}

void CheckShape(const GemmKey& key) {
  SSHSDP_CHECK(key.m >= 0 && key.n >= 0 && key.k >= 0 && key.batch >= 1, NumericsError,
               "Gemm: invalid shape m={} n={} k={} batch={}", key.m, key.n, key.k, key.batch);
  CheckDtype(key.ab);
  CheckDtype(key.c);
  if (key.m == 0 || key.n == 0) return;
  const int64_t a_width = key.trans_a ? key.m : key.k, b_width = key.trans_b ? key.k : key.n;
  SSHSDP_CHECK(
      key.lda >= a_width && key.ldb >= b_width && key.ldc >= key.n &&
          (key.batch == 1 || (key.lda == a_width && key.ldb == b_width && key.ldc == key.n)),
      NumericsError,
      "Gemm: leading dimensions lda={} ldb={} ldc={} too small for m={} n={} k={} "
      "(batched products must be dense)",
      key.lda, key.ldb, key.ldc, key.m, key.n, key.k);
}

// Widened path: bf16 operands become fp32 scratch and the key an fp32 product.
void WidenOperands(GemmState& s, GemmKey& key, const void** a, const void** b) {
  // Stored shapes: A [m,k] (or [k,m] when trans_a), B [k,n] (or [n,k]); a dense batch is
  // batch times as many rows.
  const int64_t a_rows = key.batch * (key.trans_a ? key.k : key.m);
  const int64_t a_cols = key.trans_a ? key.m : key.k;
  const int64_t b_rows = key.batch * (key.trans_b ? key.n : key.k);
  const int64_t b_cols = key.trans_b ? key.k : key.n;
  *a = WidenInto(s.wide_a, *a, a_rows, a_cols, key.lda);
  *b = WidenInto(s.wide_b, *b, b_rows, b_cols, key.ldb);
  key.lda = a_cols;
  key.ldb = b_cols;
  key.ab = DType::kF32;
}

void ZeroOutput(const GemmKey& key, void* c) {
  const size_t esize = DTypeSize(key.c);
  for (int64_t r = 0; r < key.batch * key.m; ++r) {
    std::fill_n(static_cast<char*>(c) + r * key.ldc * esize, key.n * esize, 0);
  }
}

// A bf16 destination from a product that sums in fp32 (fp32 operands: no provider writes
// bf16; the AMX kernel writes fp32): compute into fp32 scratch and round once.
void RunIntoBf16(GemmState& s, const GemmKey& key, bool amx, const void* a, const void* b,
                 void* c) {
  const int64_t rows = key.batch * key.m;
  const size_t count = static_cast<size_t>(rows * key.n);
  if (s.scratch_c.size() < count) s.scratch_c.resize(count);
  float* tmp = s.scratch_c.data();
  if (amx) {
    amx::GemmBf16(key.trans_a, key.trans_b, key.m, key.n, key.k, static_cast<const bf16*>(a),
                  key.lda, static_cast<const bf16*>(b), key.ldb, tmp, key.n, key.alpha, false);
  } else {
    GemmKey f32 = key;
    f32.c = DType::kF32;
    f32.accumulate = false;
    f32.ldc = key.n;
    RunFp32Locked(s, f32, a, b, tmp);
  }
  for (int64_t r = 0; r < rows; ++r) {
    WriteOrAccumulate(tmp + r * key.n, static_cast<bf16*>(c) + r * key.ldc, DType::kBF16, key.n,
                      key.accumulate);
  }
}

}  // namespace

void GemmLocked(GemmState& s, GemmKey key, const void* a, const void* b, void* c) {
  CheckShape(key);
  if (key.m == 0 || key.n == 0) return;
  if (key.k == 0) {
    if (!key.accumulate) ZeroOutput(key, c);
    return;
  }
  if (key.ab == DType::kBF16 && PathLocked(s) == Bf16GemmPath::kWidened) {
    WidenOperands(s, key, &a, &b);
  }
  const bool amx =
      key.ab == DType::kBF16 && key.batch == 1 && ActiveBf16GemmKernel() == Bf16GemmKernel::kAmx;
  if (amx && key.c == DType::kF32) {
    amx::GemmBf16(key.trans_a, key.trans_b, key.m, key.n, key.k, static_cast<const bf16*>(a),
                  key.lda, static_cast<const bf16*>(b), key.ldb, static_cast<float*>(c), key.ldc,
                  key.alpha, key.accumulate);
    return;
  }
  if (key.c == DType::kBF16 && (amx || key.ab == DType::kF32))
    return RunIntoBf16(s, key, amx, a, b, c);
  if (key.ab == DType::kF32) return RunFp32Locked(s, key, a, b, c);
  OneDnnExecuteLocked(s, key, a, b, c);  // bf16 operands, native path
}

}  // namespace internal

using internal::GemmKey;
using internal::GemmState;

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
          DType ab_dtype, void* c, DType c_dtype, bool accumulate, int64_t batch) {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  internal::GemmLocked(
      s, internal::DenseKey(trans_a, trans_b, m, n, k, ab_dtype, c_dtype, accumulate, batch), a, b,
      c);
}

void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                 int64_t lda, const void* b, int64_t ldb, DType ab_dtype, void* c, int64_t ldc,
                 DType c_dtype, bool accumulate, float alpha) {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  internal::GemmLocked(
      s, GemmKey{trans_a, trans_b, 1, m, n, k, lda, ldb, ldc, ab_dtype, c_dtype, accumulate, alpha},
      a, b, c);
}

void GemmBatchedStrided(bool trans_a, bool trans_b, int64_t outer, int64_t inner, int64_t m,
                        int64_t n, int64_t k, const float* a, int64_t lda, GridStrides sa,
                        const float* b, int64_t ldb, GridStrides sb, float* c, int64_t ldc,
                        GridStrides sc, bool accumulate, float alpha) {
  SSHSDP_CHECK(outer >= 0 && inner >= 0 && m >= 0 && n >= 0 && k >= 0, NumericsError,
               "GemmBatchedStrided: invalid shape {}x{} grid, m={} n={} k={}", outer, inner, m, n,
               k);
  SSHSDP_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n, NumericsError,
               "GemmBatchedStrided: leading dimensions lda={} ldb={} ldc={} too small for m={} "
               "n={} k={}",
               lda, ldb, ldc, m, n, k);
  if (outer == 0 || inner == 0 || m == 0 || n == 0) return;  // nothing is written
  SSHSDP_CHECK(sa.outer >= 0 && sa.inner >= 0 && sb.outer >= 0 && sb.inner >= 0 && sc.outer >= 0 &&
                   sc.inner >= 0 && (outer <= 1 || sc.outer > 0) && (inner <= 1 || sc.inner > 0),
               NumericsError,
               "GemmBatchedStrided: grid strides A {}/{} B {}/{} C {}/{} for a {}x{} grid (all "
               ">= 0; C's > 0 along a dimension of more than one product, or the products "
               "overwrite each other)",
               sa.outer, sa.inner, sb.outer, sb.inner, sc.outer, sc.inner, outer, inner);
  if (k == 0) {
    if (accumulate) return;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        for (int64_t r = 0; r < m; ++r)
          std::fill_n(c + o * sc.outer + i * sc.inner + r * ldc, n, 0.0f);
      }
    }
    return;
  }
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  GemmKey key{trans_a, trans_b, inner,       m,           n,          k,    lda,
              ldb,     ldc,     DType::kF32, DType::kF32, accumulate, alpha};
  key.outer = outer;
  key.grid_strides = {sa.outer, sa.inner, sb.outer, sb.inner, sc.outer, sc.inner};
  internal::RunFp32Locked(s, key, a, b, c);
}

}  // namespace sshsdp::kernels
