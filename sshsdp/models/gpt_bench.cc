// Forward+backward step time of a GPT or MoE GPT preset on one process, for the GEMM paths
// this CPU has: fp32 weights, bf16 weights widened to fp32 (the path of CPUs without bf16
// matmul, forced here on any CPU), and bf16 native (where oneDNN has it). Configurations run
// round-robin, one step each per round with the first rotated, and each is reported as the
// median over rounds of its per-round step-time ratio to fp32; a second fp32 configuration
// gives the A/A noise floor of those ratios. Nothing here is asserted: it is a benchmark.
// MoE MFU counts active-expert FLOPs only (MoeGpt::FlopsPerToken).
//
//   OMP_NUM_THREADS=1 models_gpt_bench [preset=small|base|moe-small|...] [B=4] [rounds=10]
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/base/bench_util.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"

namespace {

using sshsdp::DType;
using sshsdp::Median;
using sshsdp::kernels::Bf16GemmPath;

struct Config {
  std::string label;
  DType weights;
  Bf16GemmPath path;  // for bf16 weights
  std::unique_ptr<sshsdp::DenseParams> params;
  std::vector<double> fwd, total, ratio;
  double loss = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "small";
  const int B = argc > 2 ? std::atoi(argv[2]) : 4;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 10;
  namespace k = sshsdp::kernels;

  std::unique_ptr<sshsdp::Model> owned;
  sshsdp::GptConfig config;
  if (preset.rfind("moe-", 0) == 0) {
    sshsdp::MoeConfig mc = sshsdp::MoeConfig::Preset(preset);
    config = mc.trunk;
    owned = std::make_unique<sshsdp::MoeGpt>(mc);
  } else {
    config = sshsdp::GptConfig::Preset(preset);
    owned = std::make_unique<sshsdp::Gpt>(config);
  }
  sshsdp::Model& model = *owned;
  const int T = config.seq_len;
  sshsdp::SyntheticTokens data(config.vocab, 1);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  data.Batch(0, B, T, tok.data(), tgt.data());

  std::vector<Config> configs;
  configs.push_back({"fp32", DType::kF32, Bf16GemmPath::kWidened, nullptr, {}, {}, {}});
  configs.push_back({"fp32 (A/A)", DType::kF32, Bf16GemmPath::kWidened, nullptr, {}, {}, {}});
  configs.push_back(
      {"bf16 widened to fp32", DType::kBF16, Bf16GemmPath::kWidened, nullptr, {}, {}, {}});
  if (k::NativeBf16GemmSupported()) {
    configs.push_back({"bf16 native", DType::kBF16, Bf16GemmPath::kNative, nullptr, {}, {}, {}});
  }
  for (Config& c : configs) {
    c.params = std::make_unique<sshsdp::DenseParams>(model, c.weights, DType::kF32);
    c.params->Init(1);
  }
  double peak32 = k::MeasureGemmPeak(DType::kF32);
  fmt::print("CPU ISA {} | fp32 GEMM peak 1024^3 {:.1f} GFLOP/s ({}) | {} B={} T={}, {} rounds\n",
             k::CpuIsaName(), peak32 / 1e9, k::GemmPathDescription(DType::kF32), preset, B, T,
             rounds);

  auto step = [&](Config& c, bool record) {
    k::SetBf16GemmPath(c.path);
    auto t0 = std::chrono::steady_clock::now();
    model.SetBatch(tok.data(), tgt.data(), B, T);
    for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, c.params->Weights(g));
    auto t1 = std::chrono::steady_clock::now();
    for (int g = model.num_groups() - 1; g >= 0; --g) {
      model.Backward(g, c.params->Weights(g), c.params->Grads(g), sshsdp::GradWrite::kOverwrite);
    }
    auto t2 = std::chrono::steady_clock::now();
    c.loss = model.Loss();
    if (record) {
      c.fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
      c.total.push_back(std::chrono::duration<double>(t2 - t0).count());
    }
  };
  for (Config& c : configs) {  // warm-up: arenas, primitives, scratch
    step(c, false);
    step(c, false);
  }
  const size_t n = configs.size();
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < n; ++i) step(configs[(i + r) % n], true);
    for (Config& c : configs) c.ratio.push_back(c.total.back() / configs[0].total.back());
  }
  const double flops = model.FlopsPerToken() * B * T;
  fmt::print("{:<22} {:>10} {:>12} {:>9} {:>9} {:>12} {:>8}\n", "weights / GEMM path", "fwd ms",
             "fwd+bwd ms", "tok/s", "ratio", "GFLOP/s", "loss");
  for (Config& c : configs) {
    const double sec = Median(c.total);
    fmt::print("{:<22} {:>10.2f} {:>12.2f} {:>9.0f} {:>9.3f} {:>12.1f} {:>8.4f}\n", c.label,
               Median(c.fwd) * 1e3, sec * 1e3, B * T / sec, Median(c.ratio), flops / sec / 1e9,
               c.loss);
  }
  fmt::print(
      "ratio: median over rounds of the step time / the fp32 step of the same round; the A/A "
      "row is the noise floor. {} params, {:.1f} MiB activations\n",
      model.NumParams(), model.ActivationBytes() / 1048576.0);
  return 0;
}
