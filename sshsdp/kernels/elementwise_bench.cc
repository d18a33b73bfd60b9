// The fp32 -> bf16 cast on this CPU: CastToBf16 (512-bit where the CPU has AVX512-BW/VL),
// CastToBf16Portable (GCC's vectorisation, what other CPUs run) and the scalar FloatToBf16,
// on an L2-resident tensor and a memory-bound one. The three run round-robin, one call each
// per round, and each is reported as the median over rounds of its time ÷ the portable loop's
// in the same round. A benchmark: nothing is asserted.
//
//   OMP_NUM_THREADS=1 kernels_elementwise_bench [rounds=51]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <vector>

#include <fmt/core.h>

#include "sshsdp/kernels/elementwise.h"

namespace sshsdp::kernels {
namespace {

double Seconds(void (*fn)(const float*, bf16*, int64_t), const float* x, bf16* y, int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  fn(x, y, n);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ScalarCast(const float* x, bf16* y, int64_t n) { FloatToBf16(x, y, static_cast<size_t>(n)); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
}  // namespace sshsdp::kernels

int main(int argc, char** argv) {
  using namespace sshsdp;
  using namespace sshsdp::kernels;
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 51;
  struct Fn {
    const char* name;
    void (*fn)(const float*, bf16*, int64_t);
  };
  const Fn fns[] = {{"CastToBf16Portable", CastToBf16Portable},
                    {"CastToBf16", CastToBf16},
                    {"FloatToBf16 (scalar)", ScalarCast}};
  fmt::print("bf16 cast, {} rounds, ratio = median over rounds of time / CastToBf16Portable's\n",
             rounds);
  for (const int64_t n : {int64_t{256} * 1024, int64_t{4} * 1024 * 1024}) {
    std::vector<float> x(static_cast<size_t>(n));
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    for (float& v : x) v = nd(rng);
    std::vector<bf16> y(x.size());
    std::vector<std::vector<double>> t(3), ratio(3);
    for (const Fn& f : fns) f.fn(x.data(), y.data(), n);  // warm-up
    for (int r = 0; r < rounds; ++r) {
      double s[3];
      for (int i = 0; i < 3; ++i) {
        const int j = (i + r) % 3;  // rotate the first
        s[j] = Seconds(fns[j].fn, x.data(), y.data(), n);
      }
      for (int j = 0; j < 3; ++j) {
        t[j].push_back(s[j]);
        ratio[j].push_back(s[j] / s[0]);
      }
    }
    fmt::print("{} elements ({} KiB of fp32):\n", n, n * 4 / 1024);
    for (int j = 0; j < 3; ++j) {
      fmt::print("  {:<22} {:8.3f} ms  {:6.1f} Gelem/s  ratio {:.3f}\n", fns[j].name,
                 Median(t[j]) * 1e3, n / Median(t[j]) / 1e9, Median(ratio[j]));
    }
  }
}
