// Test data for the GEMM tests (matmul_test, gemm_path_test): seeded normal fp32 arrays and
// their bf16 roundings, so both tests build operands the same way.
//
//   auto x = testing::Random(m * k, /*seed=*/1);
//   std::vector<bf16> xb = testing::ToBf16(x);        // round to nearest even
//   std::vector<float> xr = testing::RoundedToBf16(x);  // the same values, kept in fp32
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp::kernels::testing {

inline std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<bf16> ToBf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  FloatToBf16(v.data(), r.data(), v.size());
  return r;
}

inline std::vector<float> Widened(const std::vector<bf16>& v) {
  std::vector<float> r(v.size());
  Bf16ToFloat(v.data(), r.data(), v.size());
  return r;
}

inline std::vector<float> RoundedToBf16(const std::vector<float>& v) { return Widened(ToBf16(v)); }

}  // namespace sshsdp::kernels::testing
