// The linear layers' products of matmul.h (LinearForward, LinearBackwardData,
// LinearBackwardWeight) and how they round activations for a bf16 weight.
//
// A linear layer's fp32 activation meets a bf16 weight rounded to bf16: into bf16 scratch on
// the native path, or through bf16 into fp32 scratch on the widened path, so it is touched once
// either way and both paths multiply the same values. An activation rounded already (a bf16
// LinearInput) is used as it is (native) or widened (widened), never rounded again.
#include <cstring>
#include <mutex>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/gemm_internal.h"

namespace sshsdp::kernels {
namespace {

using internal::DenseKey;
using internal::GemmKey;
using internal::GemmState;

// Rounds n fp32 values into `buf` (grown as needed) and returns it.
const bf16* ToBf16Scratch(std::vector<bf16>& buf, const float* src, int64_t n) {
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  CastToBf16(src, buf.data(), n);
  return buf.data();
}

// A linear layer's activation as the bf16 product consumes it (see the top of this file).
const void* Bf16Activation(GemmState& s, std::vector<bf16>& narrow, std::vector<float>& wide,
                           LinearInput src, int64_t n) {
  const bool native = internal::PathLocked(s) == Bf16GemmPath::kNative;
  if (src.dtype == DType::kBF16) {
    return native ? src.data : internal::WidenInto(wide, src.data, n, 1, 1);
  }
  const float* x = static_cast<const float*>(src.data);
  s.rounded_elements += n;
  if (native) return ToBf16Scratch(narrow, x, n);
  if (wide.size() < static_cast<size_t>(n)) wide.resize(static_cast<size_t>(n));
  RoundThroughBf16(x, wide.data(), n);
  return wide.data();
}

// A rounded activation goes with a bf16 product only.
void CheckInput(LinearInput in, DType compute_dtype, const char* what) {
  SSHSDP_CHECK(in.dtype == DType::kF32 || compute_dtype == DType::kBF16, NumericsError,
               "{}: a bf16 activation needs a bf16 weight, got a {} weight (pass the fp32 "
               "activation)",
               what, DTypeName(compute_dtype));
  SSHSDP_CHECK(compute_dtype == DType::kF32 || compute_dtype == DType::kBF16, NumericsError,
               "{}: matmul supports fp32 and bf16 weights, got {} (dequantize MX weights first)",
               what, DTypeName(compute_dtype));
}

// The operands of a linear layer's product with weight w [n, k] in *ab (fp32 or bf16): for
// bf16, the activation `act` (act_n elements) as the product consumes it, and on the
// widened path the weight widened too, with *ab then fp32. fp32 operands pass unchanged.
void LinearOperands(GemmState& s, LinearInput act, int64_t act_n, int64_t n, int64_t k,
                    const void** a, const void** w, DType* ab, const char* what) {
  CheckInput(act, *ab, what);
  if (*ab != DType::kBF16) return;
  *a = Bf16Activation(s, s.scratch_a, s.wide_a, act, act_n);
  if (internal::PathLocked(s) == Bf16GemmPath::kWidened) {
    *w = internal::WidenInto(s.wide_b, *w, n, k, k);
    *ab = DType::kF32;
  }
}

// LinearBackwardWeight pads dy's rows when they are a multiple of this many fp32 (2 KiB).
constexpr int64_t kPadRowsFrom = 512;

// dy [m, n] into rows of n + 16 floats (s.pad_a), rounded through bf16 on the widened path.
const float* PadRows(GemmState& s, LinearInput dy, bool widened, int64_t m, int64_t n) {
  const int64_t lda = n + 16;
  if (s.pad_a.size() < static_cast<size_t>(m * lda)) s.pad_a.resize(static_cast<size_t>(m * lda));
  for (int64_t r = 0; r < m; ++r) {
    float* row = s.pad_a.data() + r * lda;
    if (dy.dtype == DType::kBF16) {
      WidenBf16(static_cast<const bf16*>(dy.data) + r * n, row, n);
    } else if (widened) {
      RoundThroughBf16(static_cast<const float*>(dy.data) + r * n, row, n);
      s.rounded_elements += n;
    } else {
      std::memcpy(row, static_cast<const float*>(dy.data) + r * n, n * 4);
    }
  }
  return s.pad_a.data();
}

}  // namespace

void LinearForward(LinearInput x, const void* w, DType w_dtype, float* y, int64_t m, int64_t n,
                   int64_t k) {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  const void* a = x.data;
  DType ab = w_dtype;
  LinearOperands(s, x, m * k, n, k, &a, &w, &ab, "LinearForward");
  internal::GemmLocked(s, DenseKey(false, true, m, n, k, ab, DType::kF32, false, 1), a, w, y);
}

void LinearBackwardData(LinearInput dy, const void* w, DType w_dtype, float* dx, int64_t m,
                        int64_t n, int64_t k, bool accumulate) {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  const void* a = dy.data;
  DType ab = w_dtype;
  LinearOperands(s, dy, m * n, n, k, &a, &w, &ab, "LinearBackwardData");
  internal::GemmLocked(s, DenseKey(false, false, m, k, n, ab, DType::kF32, accumulate, 1), a, w,
                       dx);
}

void LinearBackwardWeight(LinearInput dy, LinearInput x, DType compute_dtype, void* dw,
                          DType dw_dtype, int64_t m, int64_t n, int64_t k, bool accumulate) {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  CheckInput(dy, compute_dtype, "LinearBackwardWeight (dy)");
  CheckInput(x, compute_dtype, "LinearBackwardWeight (x)");
  const void* a = dy.data;
  const void* b = x.data;
  DType ab = compute_dtype;
  const bool widened =
      compute_dtype == DType::kBF16 && internal::PathLocked(s) == Bf16GemmPath::kWidened;
  // dyᵀ is read down columns of rows 2 / 4 KiB apart, which map to the same cache sets: on
  // AVX2 (Zen 3) oneDNN's fp32 GEMM runs at 30-37 GFLOP/s there against 60-76 with rows
  // 16 floats longer (fc1's weight gradient, n = d_ff = 1024: 29 -> 14 ms at m = 2048). dy
  // goes into rows of n + 16 in the same pass that (widened path) rounds or widens it. The
  // other providers are left the layout they are given.
  const bool pad = (compute_dtype == DType::kF32 || widened) && n >= kPadRowsFrom &&
                   n % kPadRowsFrom == 0 && internal::ProviderLocked(s) == GemmProvider::kOneDnn;
  if (compute_dtype == DType::kBF16) {
    if (!pad) a = Bf16Activation(s, s.scratch_a, s.wide_a, dy, m * n);
    b = Bf16Activation(s, s.scratch_b, s.wide_b, x, m * k);
    if (widened) ab = DType::kF32;
  }
  if (pad) {
    internal::GemmLocked(
        s, GemmKey{true, false, 1, n, k, m, n + 16, k, k, ab, dw_dtype, accumulate, 1.0f},
        PadRows(s, dy, widened, m, n), b, dw);
    return;
  }
  internal::GemmLocked(s, DenseKey(true, false, n, k, m, ab, dw_dtype, accumulate, 1), a, b, dw);
}

int64_t LinearRoundedElements() {
  GemmState& s = internal::GetGemmState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.rounded_elements;
}

}  // namespace sshsdp::kernels
