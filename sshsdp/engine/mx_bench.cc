// mx_bench: step-time ratios, in ONE run, of runtime-weight precisions and weight reuse
// (docs/design.md, Measurement rules: ratios within one run, medians after warm-up):
//   bf16          bf16 runtime weights (cast once per step, reused across microbatches)
//   mxfp8         MXFP8 runtime weights, quantized + scales relaid out once per step (reuse)
//   mxfp8-every   MXFP8 with ② "quantize every microbatch": fp32 shards gathered and the
//                 layer quantized + relaid out on every gather (FSDP2 / veScale style)
// Engines are built side by side and stepped in round-robin, so machine noise hits all
// alike. On CPU an MXFP8 GEMM dequantizes its weight into fp32 scratch (kernels/mx_linear.h):
// MXFP8 vs bf16 here measures that emulation, not a GPU's FP8 tensor cores.
// --moe moe-tiny|moe-small benches the MoE preset instead (expert groups: only the experts'
// packed [E, out, in] weights are MXFP8, the paper's headline case for weight reuse).
//
//   mpirun -np 2 build/sshsdp/engine/mx_bench [--d 256] [--layers 4] [--steps 12] [--mb 4]
//   mpirun -np 2 build/sshsdp/engine/mx_bench --moe moe-small [--seq 64] [--batch 2]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"

using namespace sshsdp;

static int Bench(int argc, char** argv);

int main(int argc, char** argv) {
  return RunMpiMain(argc, argv, [&] { return Bench(argc, argv); });
}

static int Bench(int argc, char** argv) {
  int d = 256, layers = 4, steps = 12, warmup = 3, mb = 4, seq = 64, batch = 2;
  std::string moe;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--moe")
      moe = argv[i + 1];
    else if (a == "--d")
      d = v;
    else if (a == "--layers")
      layers = v;
    else if (a == "--steps")
      steps = v;
    else if (a == "--warmup")
      warmup = v;
    else if (a == "--mb")
      mb = v;
    else if (a == "--seq")
      seq = v;
    else if (a == "--batch")
      batch = v;
  }
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  auto world = MpiCommunicator::World(world_size);  // one node
  const int W = world->size(), rank = world->rank();
  GptConfig gc;
  gc.d_model = d;
  gc.n_layer = layers;
  gc.n_head = std::max(1, d / 64);
  gc.seq_len = seq;
  gc.vocab = 512;
  MoeConfig mc;
  if (!moe.empty()) {
    mc = MoeConfig::Preset(moe);
    mc.trunk.seq_len = seq;
    mc.expert_group = true;  // the same groups for every variant; only experts are MX
    gc = mc.trunk;
  }
  auto make_model = [&]() -> std::unique_ptr<Model> {
    if (moe.empty()) return std::make_unique<Gpt>(gc);
    return std::make_unique<MoeGpt>(mc);
  };
  struct Variant {
    std::string name;
    DType wdt;
    bool every;
    std::unique_ptr<Model> model;
    std::unique_ptr<Engine> engine;
    std::vector<double> secs, prep;
    uint64_t preps = 0, relayouts = 0;
  };
  std::vector<Variant> vs;
  vs.push_back({"bf16", DType::kBF16, false, {}, {}, {}, {}});
  vs.push_back({"mxfp8", DType::kE4M3, false, {}, {}, {}, {}});
  vs.push_back({"mxfp8-every", DType::kE4M3, true, {}, {}, {}, {}});
  for (Variant& v : vs) {
    EngineConfig cfg;
    cfg.sw = cfg.sg = cfg.so = W;
    cfg.ranks_per_node = W;
    cfg.microbatches = mb;
    cfg.batch_size = batch;
    cfg.seq_len = seq;
    cfg.weight_dtype = v.wdt;
    cfg.redundancies.cast_every_gather = v.every;
    v.model = make_model();
    v.engine = std::make_unique<Engine>(*v.model, *world, cfg);
    v.engine->InitWeights(1);
  }
  auto batch_fn = [&](int64_t step) {
    return [=](int m, int32_t* tok, int32_t* tgt) {
      for (int i = 0; i < batch * seq; ++i) {
        uint64_t x = (static_cast<uint64_t>(step * mb + m) * W + rank) * 7919u + i * 104729u;
        x ^= x >> 17;
        x *= 0x9E3779B97F4A7C15ull;
        tok[i] = static_cast<int32_t>((x >> 40) % gc.vocab);
        tgt[i] = static_cast<int32_t>((x >> 20) % gc.vocab);
      }
    };
  };
  for (int s = 0; s < warmup + steps; ++s)
    for (Variant& v : vs) {
      StepStats st = v.engine->Step(batch_fn(s));
      float t[1] = {static_cast<float>(st.seconds)};  // an fp32 buffer for an fp32 reduction
      world->AllReduce(t, 1, DType::kF32);            // (sum; ratios are unaffected)
      if (s >= warmup) {
        v.secs.push_back(t[0] / W);
        v.prep.push_back(st.time.cast);
      }
      v.preps = st.counters.weight_preps;
      v.relayouts = st.counters.scale_relayouts;
    }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  if (rank == 0) {
    std::printf(
        "mx_bench: W=%d %s d=%d layers=%d seq=%d batch=%d microbatches=%d; median of %d "
        "steps after %d warm-up\n",
        W, moe.empty() ? "GPT" : moe.c_str(), gc.d_model, gc.n_layer, seq, batch, mb, steps,
        warmup);
    const double base = median(vs[0].secs);
    for (Variant& v : vs)
      std::printf(
          "  %-12s step %8.2f ms  ratio vs bf16 %.3f  G/Tw time %7.2f ms  weight_preps %3lu "
          "scale_relayouts %3lu per step\n",
          v.name.c_str(), 1e3 * median(v.secs), median(v.secs) / base, 1e3 * median(v.prep),
          static_cast<unsigned long>(v.preps), static_cast<unsigned long>(v.relayouts));
    std::printf("  weight reuse: mxfp8-every / mxfp8 = %.3f\n",
                median(vs[2].secs) / median(vs[1].secs));
  }
  return 0;
}
