// Trains the GPT (BackendGpt) on one device backend and reports its losses and speed: the
// GPU check of the whole training step (scripts/gpu_check.sh runs it on cpu and cuda from the
// same weights and batches and compares the losses). A benchmark: nothing here asserts a
// speed; the exit status is non-zero only for bad arguments or a failed backend.
//
//   models_backend_gpt_check --backend=cuda --model=small --steps=50 --json=out.json
//   (also --batch=4 --microbatches=4 --seq-len=0 --seed=1: the defaults)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/base/error.h"
#include "sshsdp/models/backend_gpt.h"
#include "sshsdp/models/data.h"
#include "sshsdp/params/model.h"

namespace sshsdp {
namespace {

struct Args {
  std::string backend = "cpu", model = "small", json;
  int steps = 50, batch = 4, microbatches = 4, seq_len = 0;
  uint64_t seed = 1;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const auto eq = s.find('=');
    SSHSDP_CHECK(s.rfind("--", 0) == 0 && eq != std::string::npos, ConfigError,
                 "argument '{}': expected --name=value (--backend, --model, --steps, --batch, "
                 "--microbatches, --seq-len, --seed, --json)",
                 s);
    const std::string k = s.substr(2, eq - 2), v = s.substr(eq + 1);
    try {
      if (k == "backend")
        a.backend = v;
      else if (k == "model")
        a.model = v;
      else if (k == "json")
        a.json = v;
      else if (k == "steps")
        a.steps = std::stoi(v);
      else if (k == "batch")
        a.batch = std::stoi(v);
      else if (k == "microbatches")
        a.microbatches = std::stoi(v);
      else if (k == "seq-len")
        a.seq_len = std::stoi(v);
      else if (k == "seed")
        a.seed = std::stoull(v);
      else
        throw ConfigError(fmt::format("unknown option --{}", k));
    } catch (const std::logic_error&) {
      throw ConfigError(fmt::format("--{}: '{}' is not a number", k, v));
    }
  }
  SSHSDP_CHECK(a.steps >= 1 && a.batch >= 1 && a.microbatches >= 1 && a.seq_len >= 0, ConfigError,
               "--steps, --batch, --microbatches must be >= 1, --seq-len >= 0");
  return a;
}

int Run(const Args& a) {
  GptConfig c = GptConfig::Preset(a.model);
  const int T = a.seq_len ? a.seq_len : c.seq_len;
  std::unique_ptr<Backend> dev = MakeBackend(a.backend);
  BackendGpt gpt(*dev, c, a.batch, T);
  // The initial weights every run shares: Gpt's FillInit for this seed, on the host.
  {
    Gpt model(c);
    DenseParams p(model);
    p.Init(a.seed);
    std::vector<float> w;
    for (int g = 0; g < p.num_groups(); ++g)
      for (size_t i = 0; i < p.specs(g).size(); ++i) {
        const auto& m = p.master(g, static_cast<int>(i));
        w.insert(w.end(), m.begin(), m.end());
      }
    gpt.LoadWeights(w.data());
  }
  SyntheticTokens data(c.vocab, a.seed);
  const int64_t per_step = int64_t{a.microbatches} * a.batch * T;
  std::vector<int32_t> tok(static_cast<size_t>(per_step)), tgt(tok.size());
  const AdamWConfig adamw{
      .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  std::printf("%s: GPT %s d=%d L=%d H=%d T=%d, %d x %d x %d tokens per step, fp32, %lld params\n",
              dev->name().c_str(), a.model.c_str(), c.d_model, c.n_layer, c.n_head, T,
              a.microbatches, a.batch, T, static_cast<long long>(gpt.num_params()));
  std::vector<double> losses, secs;
  for (int s = 0; s < a.steps; ++s) {
    for (int mb = 0; mb < a.microbatches; ++mb)
      data.Batch(SampleIndex(s, mb, a.microbatches, 0, 1, 0, a.batch), a.batch, T,
                 tok.data() + int64_t{mb} * a.batch * T, tgt.data() + int64_t{mb} * a.batch * T);
    const auto t0 = std::chrono::steady_clock::now();
    double norm = 0;
    const double loss =
        gpt.TrainStep(tok.data(), tgt.data(), a.microbatches, adamw, 1.0f, s + 1, &norm);
    dev->Synchronize();
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    losses.push_back(loss);
    if (s < 5 || s % 10 == 9 || s == a.steps - 1)
      std::printf("step %4d | loss %.6f | norm %.4f | %.1f ms | %.0f tok/s\n", s + 1, loss, norm,
                  secs.back() * 1e3, per_step / secs.back());
  }
  // Speed over the steps after the first two (warm-up: allocation, cuBLAS handles).
  double t = 0;
  int n = 0;
  for (size_t i = std::min<size_t>(2, secs.size() - 1); i < secs.size(); ++i, ++n) t += secs[i];
  const double tps = per_step * n / t;
  Gpt shape(c);
  shape.SetBatch(tok.data(), tgt.data(), a.batch, T);
  const double flops = shape.FlopsPerToken() * tps;
  std::printf("%s: %.0f tokens/s, %.3f TFLOP/s (model FLOPs, fp32) over %d steps\n",
              dev->name().c_str(), tps, flops / 1e12, n);
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << "{\"backend\": \"" << dev->name() << "\", \"model\": \"" << a.model
      << "\", \"tokens_per_s\": " << tps << ", \"model_flops_per_s\": " << flops
      << ", \"losses\": [";
    for (size_t i = 0; i < losses.size(); ++i)
      f << (i ? ", " : "") << fmt::format("{:.9g}", losses[i]);
    f << "]}\n";
    SSHSDP_CHECK(f.good(), IoError, "--json {}: write failed", a.json);
  }
  return 0;
}

}  // namespace
}  // namespace sshsdp

int main(int argc, char** argv) {
  try {
    return sshsdp::Run(sshsdp::Parse(argc, argv));
  } catch (const sshsdp::Error& e) {
    std::fprintf(stderr, "models_backend_gpt_check: %s\n", e.what());
    return 2;
  }
}
