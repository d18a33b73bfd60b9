// Job-wide GEMM peak for MFU (see gemm_peak.h).
#include "sshsdp/cli/gemm_peak.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/matmul.h"

namespace sshsdp {

std::string GemmPeak::ToString() const {
  if (pinned)
    return fmt::format("peak {:.1f} GFLOP/s/rank (pinned by --gemm-peak)", per_rank / 1e9);
  return fmt::format(
      "peak {:.1f} GFLOP/s/rank (measured on {} rank{} at once, median of {} rounds, spread "
      "{:.0f}%)",
      per_rank / 1e9, ranks, ranks == 1 ? "" : "s", rounds, 100 * spread);
}

namespace {

// The pinned figure, or nothing measured yet; ConfigError for a bad figure or round count.
GemmPeak Start(Communicator& world, std::string path, double pinned_gflops, int rounds) {
  SSHSDP_CHECK(pinned_gflops >= 0, ConfigError,
               "--gemm-peak must be a positive GFLOP/s figure per rank (0: measure), got {}",
               pinned_gflops);
  SSHSDP_CHECK(rounds >= 1, ConfigError, "MeasureJobGemmPeak: rounds {}", rounds);
  GemmPeak peak;
  peak.path = std::move(path);
  peak.ranks = world.size();
  if (pinned_gflops > 0) {
    peak.per_rank = pinned_gflops * 1e9;
    peak.pinned = true;
  }
  return peak;
}

// `rounds` rounds of `product` (one warm-up first) on every rank between barriers, each round
// credited to its slowest rank: the median rate and the spread.
void MeasureRounds(Communicator& world, const std::function<void()>& product, double flops,
                   int rounds, GemmPeak* peak) {
  product();  // warm-up: primitive creation, scratch growth
  const int W = world.size();
  std::vector<float> mine(static_cast<size_t>(rounds));
  for (int r = 0; r < rounds; ++r) {
    world.Barrier();
    const auto t0 = std::chrono::steady_clock::now();
    product();
    mine[static_cast<size_t>(r)] = static_cast<float>(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<float> all(static_cast<size_t>(rounds) * W);
  world.AllGather(mine.data(), all.data(), static_cast<size_t>(rounds), DType::kF32);
  std::vector<double> rates(static_cast<size_t>(rounds));
  for (int r = 0; r < rounds; ++r) {
    float slowest = 0;
    for (int w = 0; w < W; ++w)
      slowest = std::max(slowest, all[static_cast<size_t>(w) * rounds + r]);
    rates[static_cast<size_t>(r)] = flops / std::max(slowest, 1e-9f);
  }
  std::sort(rates.begin(), rates.end());
  peak->per_rank = rates[rates.size() / 2];
  peak->rounds = rounds;
  peak->spread = (rates.back() - rates.front()) / peak->per_rank;
}

}  // namespace

GemmPeak MeasureJobGemmPeak(Communicator& world, DType dtype, double pinned_gflops, int rounds,
                            int64_t size) {
  const DType gemm = dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  GemmPeak peak = Start(world, kernels::GemmPathDescription(gemm), pinned_gflops, rounds);
  if (peak.pinned) return peak;
  kernels::GemmPeakProbe probe(gemm, size);
  MeasureRounds(
      world, [&] { probe.Run(1); }, probe.FlopsPerProduct(), rounds, &peak);
  return peak;
}

GemmPeak MeasureBackendGemmPeak(Communicator& world, Backend& backend, DType dtype,
                                double pinned_gflops, int rounds, int64_t size) {
  const bool b16 = dtype == DType::kBF16;
  GemmPeak peak =
      Start(world, fmt::format("{} GEMM on backend {}", b16 ? "bf16" : "fp32", backend.name()),
            pinned_gflops, rounds);
  if (peak.pinned) return peak;
  SSHSDP_CHECK(size >= 1, ConfigError, "MeasureBackendGemmPeak: size {}", size);
  const int64_t n = size * size;
  struct Matrices {
    Backend& b;
    float* m[3] = {};
    ~Matrices() {
      for (float* p : m) b.Free(p);
    }
  } mats{backend};
  for (float*& p : mats.m) {
    p = static_cast<float*>(backend.Alloc(static_cast<size_t>(n) * sizeof(float)));
    backend.Fill(p, n, 0.5f);
  }
  // bf16 operands: the fp32 fills cast into the first halves of A's and B's buffers.
  bf16* a16 = reinterpret_cast<bf16*>(mats.m[0]);
  bf16* b16p = reinterpret_cast<bf16*>(mats.m[1]);
  if (b16) {
    backend.CastF32ToBf16(mats.m[2], a16, n);
    backend.CastF32ToBf16(mats.m[2], b16p, n);
  }
  MeasureRounds(
      world,
      [&] {
        if (b16)
          backend.GemmBf16(false, false, size, size, size, a16, b16p, mats.m[2], false);
        else
          backend.Gemm(false, false, size, size, size, mats.m[0], mats.m[1], mats.m[2], false);
        backend.Synchronize();
      },
      2.0 * static_cast<double>(size) * size * size, rounds, &peak);
  return peak;
}

std::string FormatMfu(double mfu, bool pinned) {
  if (mfu <= 1.0) return fmt::format("{:.1f}%", 100 * mfu);
  return fmt::format("{:.1f}% (above 100%: {})", 100 * mfu,
                     pinned ? "the pinned --gemm-peak is below what this machine reaches"
                            : "the GEMM peak was under-measured; pin it with --gemm-peak GFLOPS");
}

}  // namespace sshsdp
