// The GEMM peak probe and measurement of matmul.h: size³ products through the public Gemm, so
// a peak is the rate of the path the models' products take (fp32, or bf16 native / widened).
#include <algorithm>
#include <chrono>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/matmul.h"

namespace sshsdp::kernels {

GemmPeakProbe::GemmPeakProbe(DType dtype, int64_t size) : dtype_(dtype), size_(size) {
  SSHSDP_CHECK(size > 0, NumericsError, "GemmPeakProbe: size {}", size);
  SSHSDP_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, NumericsError,
               "GemmPeakProbe: fp32 or bf16 operands, got {}", DTypeName(dtype));
  const size_t n = static_cast<size_t>(size * size);
  a_.resize(n * DTypeSize(dtype));
  b_.resize(n * DTypeSize(dtype));
  c_.resize(n);
  // Small finite values (bf16 1/8 is 0x3E00; fp32 0.125f).
  if (dtype == DType::kBF16) {
    std::fill_n(reinterpret_cast<bf16*>(a_.data()), n, FloatToBf16(0.125f));
    std::fill_n(reinterpret_cast<bf16*>(b_.data()), n, FloatToBf16(0.125f));
  } else {
    std::fill_n(reinterpret_cast<float*>(a_.data()), n, 0.125f);
    std::fill_n(reinterpret_cast<float*>(b_.data()), n, 0.125f);
  }
}

void GemmPeakProbe::Run(int count) {
  for (int i = 0; i < count; ++i) {
    Gemm(false, true, size_, size_, size_, a_.data(), b_.data(), dtype_, c_.data(), DType::kF32,
         false);
  }
}

double MeasureGemmPeak(DType dtype, int64_t size, int reps) {
  SSHSDP_CHECK(size > 0 && reps > 0, NumericsError, "MeasureGemmPeak: size {} reps {}", size, reps);
  GemmPeakProbe probe(dtype, size);
  probe.Run(1);  // warm-up: primitive creation, scratch growth
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    probe.Run(1);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return probe.FlopsPerProduct() / seconds[seconds.size() / 2];
}

}  // namespace sshsdp::kernels
