// The MFU denominator of a job: the GEMM rate one rank reaches while every rank of the job
// multiplies at once, on the GEMM path the run's weights take (native bf16, bf16 widened to
// fp32, or fp32).
//
// Ranks that share cores (oversubscribed, or one socket for several ranks) share its peak
// too, so each round brackets one size³ product on every rank between barriers and credits
// the round to the slowest rank; the peak is the median over rounds. The spread over rounds
// is reported, so a noisy measurement is visible; --gemm-peak pins the figure instead.
//
//   GemmPeak peak = MeasureJobGemmPeak(*world, DType::kBF16, /*pinned_gflops=*/0);  // collective
//   double mfu = flops_per_token * tokens_per_s / (peak.per_rank * W);
//   fmt::print("MFU {}\n", FormatMfu(mfu, peak.pinned));  // "63.1%", or a warning above 100 %
#pragma once

#include <string>

#include "sshsdp/backend/backend.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

struct GemmPeak {
  double per_rank = 0;  // FLOP/s one rank reaches with all ranks multiplying at once
  bool pinned = false;  // from --gemm-peak, not measured
  int rounds = 0;       // measured rounds (0 when pinned)
  double spread = 0;    // (max - min) / median of the per-round rates
  int ranks = 0;        // ranks that measured together
  std::string path;     // kernels::GemmPathDescription of the dtype

  // "peak 45.1 GFLOP/s/rank (measured on 4 ranks at once, median of 9 rounds, spread 3%)".
  std::string ToString() const;
};

// Collective over `world`. pinned_gflops > 0 takes that figure (GFLOP/s per rank) and
// measures nothing; otherwise `rounds` rounds of one size³ product per rank.
GemmPeak MeasureJobGemmPeak(Communicator& world, DType dtype, double pinned_gflops, int rounds = 9,
                            int64_t size = 1024);
// The same over a device backend's Gemm (fp32) or GemmBf16 (bf16 `dtype`: the bf16 runtime
// weights' products) for `sshsdp train --backend`, each product waited for (Synchronize)
// inside its round.
GemmPeak MeasureBackendGemmPeak(Communicator& world, Backend& backend, DType dtype,
                                double pinned_gflops, int rounds = 9, int64_t size = 1024);

// "63.1%"; above 100 % the figure is followed by a note (an MFU above 100 % is never printed
// bare): a measured peak was under-measured, and how to pin it; a pinned one is too low.
std::string FormatMfu(double mfu, bool pinned);

}  // namespace sshsdp
