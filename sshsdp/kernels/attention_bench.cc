// Time of the fused causal attention (attention.h) against the per-head reference it replaced
// (testing/attention_reference.h), and of the bf16 attention's paths (the AVX512-BF16 kernel
// where the CPU has it, the widened path) against the fp32 kernel, forward and backward, on
// the reference GPTs' shapes, in one process, alternating so all see the same machine state:
// medians of 7 repetitions per round, 3 rounds. Nothing is asserted.
//
//   OMP_NUM_THREADS=1 build/sshsdp/kernels/kernels_attention_bench [B=4] [T=256] [H=8] [dh=32]
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <vector>

#include "sshsdp/base/bench_util.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/matmul.h"
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

  // bf16: each path's time ÷ the fp32 kernel's, per round (the native kernel with each
  // products engine the CPU has).
  struct Variant {
    const char* name;
    k::Bf16GemmPath path;
    k::Bf16AttentionProducts products;
  };
  std::vector<Variant> variants;
  const bool native = __builtin_cpu_supports("avx512bf16") && k::NativeBf16GemmSupported();
  const k::Bf16AttentionProducts saved_products = k::ActiveBf16AttentionProducts();
  if (native && saved_products == k::Bf16AttentionProducts::kAmx) {
    variants.push_back({"native amx", k::Bf16GemmPath::kNative, k::Bf16AttentionProducts::kAmx});
  }
  if (native) {
    variants.push_back(
        {"native avx512bf16", k::Bf16GemmPath::kNative, k::Bf16AttentionProducts::kAvx512Bf16});
  }
  variants.push_back({"widened", k::Bf16GemmPath::kWidened, saved_products});
  const k::Bf16GemmPath saved = k::ActiveBf16GemmPath();
  for (const Variant& v : variants) {
    k::SetBf16GemmPath(v.path);
    k::SetBf16AttentionProducts(v.products);
    std::vector<float> bscratch(k::AttentionBf16ScratchFloats(B, T, H, dh));
    const auto n = static_cast<int64_t>(bscratch.size());
    std::vector<double> rf_bf16, rb_bf16;
    for (int round = 0; round < 3; ++round) {
      const double ff = Seconds([&] {
        k::CausalAttentionForward(qkv.data(), out.data(), lse.data(), scratch.data(), B, T, H, dh);
      });
      const double bf = Seconds([&] {
        k::CausalAttentionForwardBf16(qkv.data(), out.data(), lse.data(), bscratch.data(), n, B, T,
                                      H, dh);
      });
      const double fb = Seconds([&] {
        k::CausalAttentionBackward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                                   scratch.data(), B, T, H, dh);
      });
      const double bb = Seconds([&] {
        k::CausalAttentionBackwardBf16(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                                       bscratch.data(), n, B, T, H, dh);
      });
      rf_bf16.push_back(bf / ff);
      rb_bf16.push_back(bb / fb);
      fmt::print(
          "bf16 {} round {}: forward {:.2f} ms (fp32 {:.2f}), backward {:.2f} ms (fp32 {:.2f})\n",
          v.name, round, bf * 1e3, ff * 1e3, bb * 1e3, fb * 1e3);
    }
    fmt::print("bf16 {} / fp32 time, median of rounds: forward {:.2f}, backward {:.2f}\n", v.name,
               sshsdp::Median(rf_bf16), sshsdp::Median(rb_bf16));
  }
  k::SetBf16GemmPath(saved);
  k::SetBf16AttentionProducts(saved_products);
  return 0;
}
