// MX-weight linear GEMMs on CPU: dequantize into fp32 scratch with the kernel-layout scales,
// then the fp32 GEMM of matmul.h (see mx_linear.h).
#include "sshsdp/kernels/mx_linear.h"

#include <algorithm>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/numerics/fp8.h"
#include "sshsdp/numerics/mx.h"

namespace sshsdp::kernels {

void MxDequantizeOperand(const uint8_t* codes, DType elem, const uint8_t* scales,
                         ScaleLayout layout, int64_t mn, int64_t k, float* out) {
  SSHSDP_CHECK(IsMxElement(elem), NumericsError, "MX operand elements must be e4m3 or e5m2, got {}",
               DTypeName(elem));
  SSHSDP_CHECK(scales != nullptr, NumericsError, "MX operand [{}, {}] has no scales", mn, k);
  const PackedScaleShape shape{mn, k, MxBlocks(k), 32};
  thread_local std::vector<uint8_t> s;  // per-row scale matrix [mn, kb], row-major
  s.resize(static_cast<size_t>(mn * shape.kb));
  ScalesFromLayout(scales, shape, layout, s.data());
  const float* table =
      elem == DType::kE4M3 ? fp8_internal::kE4M3Table.data() : fp8_internal::kE5M2Table.data();
  for (int64_t r = 0; r < mn; ++r) {
    const uint8_t* q = codes + r * k;
    float* o = out + r * k;
    for (int64_t c = 0; c < shape.kb; ++c) {
      const float sc = Ue8m0ToFloat(s[r * shape.kb + c]);
      const int64_t e = std::min(k, (c + 1) * kMxBlock);
      for (int64_t j = c * kMxBlock; j < e; ++j) o[j] = table[q[j]] * sc;
    }
  }
}

namespace {

// fp32 (dequantized) weight pointer for an MX view, or the view's own data otherwise.
const void* Operand(const WeightView& w, int64_t n, int64_t k, DType* dt) {
  if (!IsMxElement(w.dtype)) {
    *dt = w.dtype;
    return w.data;
  }
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(n * k));
  MxDequantizeOperand(static_cast<const uint8_t*>(w.data), w.dtype, w.scales, w.layout, n, k,
                      scratch.data());
  *dt = DType::kF32;
  return scratch.data();
}

}  // namespace

void LinearForward(LinearInput x, const WeightView& w, float* y, int64_t m, int64_t n, int64_t k) {
  DType dt;
  const void* p = Operand(w, n, k, &dt);
  LinearForward(x, p, dt, y, m, n, k);
}

void LinearBackwardData(LinearInput dy, const WeightView& w, float* dx, int64_t m, int64_t n,
                        int64_t k, bool accumulate) {
  DType dt;
  const void* p = Operand(w, n, k, &dt);
  LinearBackwardData(dy, p, dt, dx, m, n, k, accumulate);
}

}  // namespace sshsdp::kernels
