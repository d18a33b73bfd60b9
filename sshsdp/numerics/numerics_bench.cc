// Single-core throughput of the numerics kernels: MXFP8 weight quantization (G stage) and
// dequantization (CPU GEMM scratch), packed scale relayout (Tw) into each kernel layout,
// Philox, and bf16 stochastic rounding. Reports the median of several repetitions after one
// warm-up, in GB/s of the bytes named on each line, timed by this thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID) so that other processes on a shared machine do not count; wall
// time is shown too. Absolute numbers on shared machines are noise; compare within one run.
//
//   numerics_bench [--quick]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "sshsdp/numerics/mx.h"
#include "sshsdp/numerics/philox.h"
#include "sshsdp/numerics/scale_layout.h"
#include "sshsdp/numerics/stochastic_rounding.h"

namespace sshsdp {
namespace {

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double WallSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Timing {
  double cpu, wall;  // medians, seconds
};

template <typename Fn>
Timing Measure(int reps, Fn&& fn) {
  fn();  // warm-up
  std::vector<double> cpu, wall;
  for (int i = 0; i < reps; ++i) {
    const double c0 = ThreadCpuSeconds(), w0 = WallSeconds();
    fn();
    cpu.push_back(ThreadCpuSeconds() - c0);
    wall.push_back(WallSeconds() - w0);
  }
  std::sort(cpu.begin(), cpu.end());
  std::sort(wall.begin(), wall.end());
  return {cpu[cpu.size() / 2], wall[wall.size() / 2]};
}

void Report(const char* what, double bytes, Timing t) {
  std::printf("%-62s %7.2f GB/s  cpu %8.3f ms  wall %8.3f ms\n", what, bytes / t.cpu * 1e-9,
              t.cpu * 1e3, t.wall * 1e3);
}

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int reps = quick ? 3 : 7;
  const int64_t rows = quick ? 1024 : 4096, cols = 4096;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(rows * cols);
  for (auto& x : w) x = normal(rng);
  std::vector<uint8_t> q(w.size()), s(MxWeightScaleCount(rows, cols));
  std::vector<float> y(w.size());
  std::printf("matrix [%lld, %lld] fp32 = %.0f MiB, median of %d after 1 warm-up\n",
              static_cast<long long>(rows), static_cast<long long>(cols),
              w.size() * 4.0 / (1 << 20), reps);

  Timing t = Measure(reps, [&] { MxQuantizeWeight(w.data(), rows, cols, q.data(), s.data()); });
  Report("MxQuantizeWeight e4m3 32x32, ceil (fp32 bytes read)", w.size() * 4.0, t);
  t = Measure(reps, [&] {
    MxQuantizeWeight(w.data(), rows, cols, q.data(), s.data(),
                     MxOptions{DType::kE4M3, MxScaleRule::kOcpFloor});
  });
  Report("MxQuantizeWeight e4m3 32x32, OCP floor (fp32 bytes read)", w.size() * 4.0, t);
  std::vector<uint8_t> sa(MxActivationScaleCount(rows, cols));
  t = Measure(reps, [&] { MxQuantizeActivation(w.data(), rows, cols, q.data(), sa.data()); });
  Report("MxQuantizeActivation e4m3 1x32 (fp32 bytes read)", w.size() * 4.0, t);
  t = Measure(reps, [&] { MxDequantizeWeight(q.data(), s.data(), rows, cols, y.data()); });
  Report("MxDequantizeWeight (fp32 bytes written)", w.size() * 4.0, t);

  // Tw: Q projection of `heads` heads of 128 rows each, K = cols, as one packed operand.
  const int64_t heads = rows / 128;
  std::vector<MxScaleGrid> parts;
  for (int64_t h = 0; h < heads; ++h) {
    parts.push_back({s.data() + h * 4 * MxBlocks(cols), 128, cols, 32});
  }
  for (MxOperand op : {MxOperand::kAsStored, MxOperand::kTransposed}) {
    const PackedScaleShape sh = PackedScales(parts, op);
    for (ScaleLayout layout :
         {ScaleLayout::kRowMajor, ScaleLayout::kDeepGemmMnMajor, ScaleLayout::kCublasSwizzle}) {
      std::vector<uint8_t> dst(ScaleLayoutBytes(layout, sh));
      t = Measure(reps, [&] { RelayoutPackedScales(parts, op, layout, dst.data(), dst.size()); });
      char name[128];
      std::snprintf(name, sizeof(name), "RelayoutPackedScales %lld heads %s %s (bytes out)",
                    static_cast<long long>(heads), op == MxOperand::kAsStored ? "P " : "Pᵀ",
                    std::string(ScaleLayoutName(layout)).c_str());
      Report(name, static_cast<double>(dst.size()), t);
    }
  }

  const size_t nblocks = w.size() / 8;
  std::vector<uint32_t> words(4 * nblocks);
  t = Measure(reps, [&] { PhiloxBlocks(0, 1, 2, {3, 4}, nblocks, words.data()); });
  Report("PhiloxBlocks (random bytes out)", nblocks * 16.0, t);
  std::vector<bf16> h(w.size());
  t = Measure(reps, [&] { StochasticRoundBf16(w.data(), h.data(), w.size(), SrKey{1, 2, 3}, 0); });
  Report("StochasticRoundBf16 (fp32 bytes read)", w.size() * 4.0, t);
  t = Measure(reps, [&] { FloatToBf16(w.data(), h.data(), w.size()); });
  Report("FloatToBf16 round-to-nearest, for reference (fp32 bytes read)", w.size() * 4.0, t);
  return 0;
}

}  // namespace
}  // namespace sshsdp

int main(int argc, char** argv) { return sshsdp::Main(argc, argv); }
