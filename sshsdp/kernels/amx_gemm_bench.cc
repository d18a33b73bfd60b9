// The linear layers' bf16 products (matmul.h: LinearForward, LinearBackwardData and
// LinearBackwardWeight, both backward products accumulating, as a model's backward runs them)
// on oneDNN's matmul against the same calls on the AMX kernel (amx_gemm.h), on GPT base's
// shapes (d = 256, d_ff = 1,024) with M rows, in one process: per repetition each product runs on
// one kernel then the other, so both see the same machine state; the fastest of 12 repetitions is
// reported. Nothing is asserted. Prints nothing useful without AMX-BF16.
//
//   OMP_NUM_THREADS=1 build/sshsdp/kernels/kernels_amx_gemm_bench [M=1024]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/amx_pairs.h"
#include "sshsdp/kernels/matmul.h"

int main(int argc, char** argv) {
  namespace k = sshsdp::kernels;
  using sshsdp::bf16;
  using sshsdp::DType;
  if (!k::amx::Available()) {
    fmt::print("this CPU has no AMX-BF16: nothing to compare\n");
    return 0;
  }
  const int64_t M = argc > 1 ? std::atoll(argv[1]) : 1024;
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {
      {"qkv", 768, 256}, {"proj", 256, 256}, {"fc1", 1024, 256}, {"fc2", 256, 1024}};
  const k::Bf16GemmKernel saved = k::ActiveBf16GemmKernel();
  fmt::print("bf16 linear products, M = {}, GFLOP/s oneDNN -> AMX kernel (fastest of 12)\n", M);
  double total[2] = {0, 0};
  for (const Shape& s : shapes) {
    std::vector<bf16> x(M * s.k, sshsdp::FloatToBf16(0.01f)),
        w(s.n * s.k, sshsdp::FloatToBf16(0.02f)), dy(M * s.n, sshsdp::FloatToBf16(0.01f));
    std::vector<float> y(M * std::max(s.n, s.k)), dw(s.n * s.k);
    double best[2][3];
    for (auto& b : best) std::fill(b, b + 3, 1e30);
    for (int rep = 0; rep < 12; ++rep) {
      for (int e = 0; e < 2; ++e) {
        for (int op = 0; op < 3; ++op) {
          k::SetBf16GemmKernel(e ? k::Bf16GemmKernel::kAmx : k::Bf16GemmKernel::kOneDnn);
          const auto t0 = std::chrono::steady_clock::now();
          if (op == 0) k::LinearForward(x.data(), w.data(), DType::kBF16, y.data(), M, s.n, s.k);
          if (op == 1) {
            k::LinearBackwardData(dy.data(), w.data(), DType::kBF16, y.data(), M, s.n, s.k, true);
          }
          if (op == 2) {
            k::LinearBackwardWeight(dy.data(), x.data(), DType::kBF16, dw.data(), DType::kF32, M,
                                    s.n, s.k, true);
          }
          const double t =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          best[e][op] = std::min(best[e][op], t);
        }
      }
    }
    const double flop = 2.0 * static_cast<double>(M * s.n * s.k) / 1e9;
    for (int e = 0; e < 2; ++e) total[e] += best[e][0] + best[e][1] + best[e][2];
    fmt::print(
        "{:<5} n={:>5} k={:>5}  forward {:6.1f} -> {:6.1f}  backward-data {:6.1f} -> {:6.1f}  "
        "backward-weight {:6.1f} -> {:6.1f}\n",
        s.name, s.n, s.k, flop / best[0][0], flop / best[1][0], flop / best[0][1],
        flop / best[1][1], flop / best[0][2], flop / best[1][2]);
  }
  fmt::print("all twelve products: oneDNN {:.2f} ms, AMX kernel {:.2f} ms (AMX / oneDNN {:.2f})\n",
             total[0] * 1e3, total[1] * 1e3, total[1] / total[0]);
  k::SetBf16GemmKernel(saved);
  return 0;
}
