// Reports the GEMM peak the MFU denominator uses and the forward+backward time of a GPT or
// MoE GPT preset, for fp32 and bf16 runtime weights (medians over steps after warm-up). MoE
// MFU counts active-expert FLOPs only (MoeGpt::FlopsPerToken).
//
//   OMP_NUM_THREADS=1 models_gpt_bench [preset=small|moe-small|...] [B=4] [steps=10]
#include <fmt/format.h>

#include <algorithm>
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

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "small";
  const int B = argc > 2 ? std::atoi(argv[2]) : 4;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 10;
  const double peak32 = sshsdp::kernels::MeasureGemmPeak(DType::kF32);
  const double peak16 = sshsdp::kernels::MeasureGemmPeak(DType::kBF16);
  fmt::print(
      "GEMM peak 1024^3: fp32 {:.1f} GFLOP/s ({}), bf16 {:.1f} GFLOP/s ({})\n", peak32 / 1e9,
      sshsdp::kernels::GemmImplementation(false, true, 1024, 1024, 1024, DType::kF32, DType::kF32),
      peak16 / 1e9,
      sshsdp::kernels::GemmImplementation(false, true, 1024, 1024, 1024, DType::kBF16,
                                          DType::kF32));

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
  for (DType w : {DType::kF32, DType::kBF16}) {
    sshsdp::DenseParams params(model, w, DType::kF32);
    params.Init(1);
    std::vector<double> fwd, total;
    for (int s = 0; s < steps + 2; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      model.SetBatch(tok.data(), tgt.data(), B, T);
      for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, params.Weights(g));
      auto t1 = std::chrono::steady_clock::now();
      for (int g = model.num_groups() - 1; g >= 0; --g) {
        model.Backward(g, params.Weights(g), params.Grads(g), sshsdp::GradWrite::kOverwrite);
      }
      auto t2 = std::chrono::steady_clock::now();
      if (s >= 2) {  // two warm-up steps (arena allocation, primitive creation)
        fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
        total.push_back(std::chrono::duration<double>(t2 - t0).count());
      }
    }
    const double sec = Median(total);
    const double flops = model.FlopsPerToken() * B * T;
    fmt::print(
        "{} B={} T={} weights {}: forward {:.2f} ms, forward+backward {:.2f} ms, {:.0f} tok/s, "
        "{:.1f} GFLOP/s (MFU {:.1f}% of the {} peak), loss {:.3f}, {} params, {:.1f} MiB "
        "activations\n",
        preset, B, T, sshsdp::DTypeName(w), Median(fwd) * 1e3, sec * 1e3, B * T / sec,
        flops / sec / 1e9, 100 * flops / sec / (w == DType::kF32 ? peak32 : peak16),
        sshsdp::DTypeName(w), model.Loss(), model.NumParams(), model.ActivationBytes() / 1048576.0);
  }
  return 0;
}
