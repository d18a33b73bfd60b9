// Batched Newton–Schulz iteration on fp32 GEMMs (see newton_schulz.h).
#include "sshsdp/kernels/newton_schulz.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/matmul.h"

namespace sshsdp {
namespace {

constexpr size_t kMaxWorkFloats = size_t{16} << 20;  // 64 MiB of fp32 work buffers

}  // namespace

double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return steps * (4 * m * m * n + 2 * m * m * m);
}

void NewtonSchulz::Run(const void* const* in, DType in_dtype, float* const* out, int64_t batch,
                       int64_t rows, int64_t cols, int steps, const NsCoefficients& coef,
                       float out_scale) {
  SSHSDP_CHECK(in_dtype == DType::kF32 || in_dtype == DType::kBF16, NumericsError,
               "Newton–Schulz input must be fp32 or bf16, got {}", DTypeName(in_dtype));
  SSHSDP_CHECK(rows > 0 && cols > 0 && batch >= 0 && steps >= 0, NumericsError,
               "Newton–Schulz on {} matrices [{}, {}] with {} steps", batch, rows, cols, steps);
  const bool tall = rows > cols;
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  const size_t mat = static_cast<size_t>(rows * cols), gram = static_cast<size_t>(m * m);
  const size_t per = 2 * mat + 2 * gram;
  const int64_t chunk =
      std::max<int64_t>(1, std::min<int64_t>(batch, static_cast<int64_t>(kMaxWorkFloats / per)));
  if (work_.size() < per * static_cast<size_t>(chunk)) work_.resize(per * chunk);

  for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, batch - b0);
    float* X = work_.data();
    float* Y = X + mat * nb;
    float* A = Y + mat * nb;
    float* B = A + gram * nb;
    // Load, normalize by the Frobenius norm.
    for (int64_t i = 0; i < nb; ++i) {
      float* x = X + mat * i;
      kernels::ToFloat(in[b0 + i], in_dtype, x, static_cast<int64_t>(mat));
      const double norm = std::sqrt(kernels::SumSquares(x, static_cast<int64_t>(mat)));
      kernels::Scale(x, static_cast<int64_t>(mat), static_cast<float>(1.0 / (norm + 1e-7)));
    }
    for (int s = 0; s < steps; ++s) {
      // A = X·Xᵀ (wide) or Xᵀ·X (tall): the m×m Gram matrix.
      if (tall)
        kernels::Gemm(true, false, m, m, n, X, X, DType::kF32, A, DType::kF32, false, nb);
      else
        kernels::Gemm(false, true, m, m, n, X, X, DType::kF32, A, DType::kF32, false, nb);
      // B = A·A, then B = a·I + b·A + c·A² (symmetric).
      kernels::Gemm(false, false, m, m, m, A, A, DType::kF32, B, DType::kF32, false, nb);
      for (int64_t i = 0; i < nb; ++i) {
        float* __restrict bb = B + gram * i;
        const float* __restrict aa = A + gram * i;
        for (size_t k = 0; k < gram; ++k) bb[k] = coef.b * aa[k] + coef.c * bb[k];
        for (int64_t d = 0; d < m; ++d) bb[d * m + d] += coef.a;
      }
      // X ← B·X (wide) or X·B (tall).
      if (tall)
        kernels::Gemm(false, false, n, m, m, X, B, DType::kF32, Y, DType::kF32, false, nb);
      else
        kernels::Gemm(false, false, m, n, m, B, X, DType::kF32, Y, DType::kF32, false, nb);
      std::swap(X, Y);
    }
    for (int64_t i = 0; i < nb; ++i) {
      const float* __restrict x = X + mat * i;
      float* __restrict o = out[b0 + i];
      for (size_t k = 0; k < mat; ++k) o[k] = out_scale * x[k];
    }
  }
}

}  // namespace sshsdp
