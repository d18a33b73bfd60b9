// Time of the fused causal attention (attention.h) against the per-head reference it replaced
// (testing/attention_reference.h), forward and backward, on the reference GPTs' shapes, in
// one process, alternating so both see the same machine state: medians of 7 repetitions per
// round, 3 rounds. Nothing is asserted.
//
//   OMP_NUM_THREADS=1 build/sshsdp/kernels/kernels_attention_bench [B=4] [T=256] [H=8] [dh=32]
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <vector>

#include "sshsdp/base/bench_util.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/parallel.h"
#include "sshsdp/kernels/testing/attention_reference.h"
#include "sshsdp/kernels/testing/gemm_data.h"

namespace {

double Seconds(const std::function<void()>& f) { return sshsdp::MedianSeconds(7, f); }

}  // namespace

int main(int argc, char** argv) {
  namespace k = sshsdp::kernels;
  const int B = argc > 1 ? std::atoi(argv[1]) : 4, T = argc > 2 ? std::atoi(argv[2]) : 256;
  const int H = argc > 3 ? std::atoi(argv[3]) : 8, dh = argc > 4 ? std::atoi(argv[4]) : 32;
  const int64_t d = static_cast<int64_t>(H) * dh, BT = static_cast<int64_t>(B) * T;
  const std::vector<float> qkv = k::testing::Random(BT * 3 * d, 1);
  const std::vector<float> dout = k::testing::Random(BT * d, 2);
  std::vector<float> out(BT * d), dqkv(BT * 3 * d), lse(static_cast<size_t>(B) * H * T);
  std::vector<float> scratch(k::AttentionScratchFloats(B, T, H));
  std::vector<float> att(static_cast<size_t>(B) * H * T * T), dp(static_cast<size_t>(T) * T);
  fmt::print("causal attention B={} T={} H={} dh={} (fp32, {} kernel thread(s))\n", B, T, H, dh,
             k::KernelThreads());
  std::vector<double> fwd, bwd;
  for (int round = 0; round < 3; ++round) {
    const double ff = Seconds([&] {
      k::CausalAttentionForward(qkv.data(), out.data(), lse.data(), scratch.data(), B, T, H, dh);
    });
    const double fb = Seconds([&] {
      k::CausalAttentionBackward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                                 scratch.data(), B, T, H, dh);
    });
    const double rf = Seconds([&] {
      k::testing::ReferenceAttentionForward(qkv.data(), att.data(), out.data(), B, T, H, dh);
    });
    const double rb = Seconds([&] {
      k::testing::ReferenceAttentionBackward(dout.data(), qkv.data(), att.data(), dqkv.data(),
                                             dp.data(), B, T, H, dh);
    });
    fwd.push_back(rf / ff);
    bwd.push_back(rb / fb);
    fmt::print(
        "round {}: forward fused {:.2f} ms, reference {:.2f} ms; backward fused {:.2f} ms, "
        "reference {:.2f} ms\n",
        round, ff * 1e3, rf * 1e3, fb * 1e3, rb * 1e3);
  }
  fmt::print("reference / fused, median of rounds: forward {:.2f}x, backward {:.2f}x\n",
             sshsdp::Median(fwd), sshsdp::Median(bwd));
  return 0;
}
