// Time per element of the vectorised GELU forward/backward against the scalar reference
// formula (FastTanh, one libm expf per element), in one process, alternating so both see
// the same machine state; medians of 15 repetitions, 3 rounds. Nothing is asserted.
//
//   OMP_NUM_THREADS=1 build/sshsdp/models/models_layers_bench [elements=4194304]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <vector>

#include "sshsdp/base/bench_util.h"
#include "sshsdp/models/layers.h"

namespace {

using sshsdp::layers::FastTanh;
using sshsdp::layers::kGeluC;

double Seconds(const std::function<void()>& f) { return sshsdp::MedianSeconds(15, f); }

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : int64_t{1} << 22;
  std::vector<float> x(n), y(n), d(n, 1.0f);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 2001 - 1000) * 0.004f;
  std::vector<double> fwd, bwd;
  for (int round = 0; round < 3; ++round) {
    const double vf = Seconds([&] { sshsdp::layers::GeluForward(x.data(), y.data(), n); });
    const double sf = Seconds([&] {
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + FastTanh(kGeluC * (v + 0.044715f * v * v * v)));
      }
    });
    const double vb = Seconds([&] { sshsdp::layers::GeluBackwardInPlace(x.data(), d.data(), n); });
    const double sb = Seconds([&] {
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float t = FastTanh(kGeluC * (v + 0.044715f * v * v * v));
        const float dt = (1.0f - t * t) * kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
        d[i] *= 0.5f * (1.0f + t) + 0.5f * v * dt;
      }
    });
    fwd.push_back(sf / vf);
    bwd.push_back(sb / vb);
    fmt::print(
        "round {}: forward scalar {:.2f} ms, vectorised {:.2f} ms; backward scalar {:.2f} "
        "ms, vectorised {:.2f} ms ({} elements)\n",
        round, sf * 1e3, vf * 1e3, sb * 1e3, vb * 1e3, n);
  }
  fmt::print("scalar / vectorised, median of rounds: forward {:.2f}x, backward {:.2f}x\n",
             sshsdp::Median(fwd), sshsdp::Median(bwd));
  return 0;
}
