// update_bench: Muon vs AdamW step time on the same workload and layout, in ONE run (issue 4;
// the paper's §5.2 reports +2.5–4.1 % at 128 GPUs, our target is at most +5 % on 2 ranks with
// several microbatches).
//
// Two engines train the same GPT on the same synthetic data from the same initial weights: one
// with AdamW everywhere, one with Muon for the block matrices (per head, or per matrix) and
// AdamW for norms, embeddings and the LM head. After warm-up steps they run round-robin (the
// order alternates every step), so load changes on a shared machine hit both alike. Reported:
// the median step time (slowest rank) of each and their ratio, the median update-phase time
// (norm + F, slowest rank) and Muon's extra update time as a share of the AdamW step (less noisy
// than the step ratio on a shared machine), the share of parameters Muon updates, Newton–Schulz
// FLOPs per step and their balance over ranks (max / mean), and the point-to-point bytes per
// step.
// Newton–Schulz runs in fp32 on the CPU (oneDNN GEMMs) on bf16 inputs.
//
//   mpirun -np 2 -x OMP_NUM_THREADS=1 update_bench --model small --microbatches 8
//       --batch-size 8 --steps 10 [--muon-unit matrix] [--json out/update_bench.json]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sshsdp/base/bench_util.h"
#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {
namespace {

struct Options {
  std::string model = "small";
  int layers = 0, d_model = 0, heads = 0, seq_len = 0;
  int microbatches = 8, batch_size = 8;
  int sw = 0, sg = 0, so = 0;  // 0: the world size
  std::string weight_dtype = "bf16", muon_unit = "head";
  int warmup = 2, steps = 10;
  std::string json;
};

// Largest value over ranks.
double MaxOverRanks(Communicator& world, double x) {
  std::vector<float> all(world.size());
  const float mine = static_cast<float>(x);
  world.AllGather(&mine, all.data(), 1, DType::kF32);
  return *std::max_element(all.begin(), all.end());
}

int Run(const Options& o) {
  auto world = MpiCommunicator::World(WorldSize());
  const int W = world->size(), r = world->rank();
  GptConfig gc = GptConfig::Preset(o.model);
  if (o.layers) gc.n_layer = o.layers;
  if (o.d_model) gc.d_model = o.d_model;
  if (o.heads) gc.n_head = o.heads;
  if (o.seq_len) gc.seq_len = o.seq_len;
  gc.Validate();
  EngineConfig base;
  base.sw = o.sw ? o.sw : W;
  base.sg = o.sg ? o.sg : W;
  base.so = o.so ? o.so : W;
  base.microbatches = o.microbatches;
  base.batch_size = o.batch_size;
  base.seq_len = gc.seq_len;
  base.weight_dtype = ParseDType(o.weight_dtype);
  SSHSDP_CHECK(o.muon_unit == "head" || o.muon_unit == "matrix", ConfigError,
               "--muon-unit must be head or matrix, got '{}'", o.muon_unit);
  SSHSDP_CHECK(o.steps >= 1 && o.warmup >= 0, ConfigError, "--steps >= 1 and --warmup >= 0");
  EngineConfig adam_cfg = base, muon_cfg = base;
  muon_cfg.optimizer = OptimizerKind::kMuon;
  muon_cfg.muon_unit = ParseUnitRule(o.muon_unit);
  muon_cfg.muon.scale = MuonScale::kRms;  // AdamW's lr and weight decay carry over
  muon_cfg.muon.lr = base.adamw.lr;
  muon_cfg.muon.weight_decay = base.adamw.weight_decay;

  Gpt adam_model(gc), muon_model(gc);
  Engine adam(adam_model, *world, adam_cfg), muon(muon_model, *world, muon_cfg);
  adam.InitWeights(1);
  muon.InitWeights(1);
  SyntheticTokens data(gc.vocab, 1);
  const int M = o.microbatches, B = o.batch_size, T = gc.seq_len;
  int64_t step = 0;
  BatchFn batch = [&](int mb, int32_t* tok, int32_t* tgt) {
    data.Batch(SampleIndex(step, mb, M, r, W, 0, B), B, T, tok, tgt);
  };

  const UpdatePlan* plan = muon.structured_update().plan(OptimizerKind::kMuon);
  SSHSDP_CHECK(plan != nullptr, ConfigError, "the model has no matrix for Muon");
  double max_cost = 0, sum_cost = 0;
  uint64_t p2p = 0;
  for (int rr : plan->ranks()) {
    max_cost = std::max(max_cost, plan->ExecCost(rr));
    sum_cost += plan->ExecCost(rr);
    p2p += plan->BytesSent(rr);
  }
  const double balance = sum_cost > 0 ? max_cost / (sum_cost / plan->ranks().size()) : 1.0;
  if (r == 0) {
    fmt::print(
        "update_bench: GPT d={} L={} H={} T={} params={:.2f}M | {} | weights {} | {} microbatches "
        "x {} samples x {} tokens per rank\n",
        gc.d_model, gc.n_layer, gc.n_head, T, adam_model.NumParams() / 1e6,
        adam.topology().ToString(), o.weight_dtype, M, B, T);
    fmt::print(
        "Muon per {}: {:.1f}% of parameters, {} units ({} split), Newton-Schulz {:.3f} GFLOP per "
        "step (fp32 on bf16 u), max/mean over ranks {:.3f}, {} P2P bytes per step\n",
        o.muon_unit, 100 * muon.structured_update().muon_share(), plan->units().size(),
        plan->num_split(), sum_cost / 1e9, balance, p2p);
    std::fflush(stdout);
  }

  std::vector<double> t_adam, t_muon, u_adam, u_muon, ratios;
  // Per-category step time (compute, exposed communication wait, update, other), this rank.
  std::vector<double> c_adam, c_muon, w_adam, w_muon;
  double loss_adam = 0, loss_muon = 0;
  for (step = 0; step < o.warmup + o.steps; ++step) {
    for (int k = 0; k < 2; ++k) {
      const bool run_muon = (k == 0) == (step % 2 == 1);
      Engine& e = run_muon ? muon : adam;
      StepStats st = e.Step(batch);
      const double secs = MaxOverRanks(*world, st.seconds);
      const double upd = MaxOverRanks(*world, st.time.optimizer);
      (run_muon ? loss_muon : loss_adam) = st.loss;
      if (step < o.warmup) continue;
      (run_muon ? t_muon : t_adam).push_back(secs);
      (run_muon ? u_muon : u_adam).push_back(upd);
      (run_muon ? c_muon : c_adam).push_back(st.time.compute);
      (run_muon ? w_muon : w_adam).push_back(st.time.comm_wait);
    }
    if (step >= o.warmup) ratios.push_back(t_muon.back() / t_adam.back());
  }
  const double ta = Median(t_adam), tm = Median(t_muon);
  const double ua = Median(u_adam), um = Median(u_muon);
  if (r == 0) {
    fmt::print(
        "median step (slowest rank, {} timed after {} warm-up): AdamW {:.1f} ms, Muon {:.1f} ms, "
        "ratio {:.3f} ({:+.1f}%)\n",
        o.steps, o.warmup, 1e3 * ta, 1e3 * tm, tm / ta, 100 * (tm / ta - 1));
    fmt::print(
        "median update phase (norm + F): AdamW {:.1f} ms, Muon {:.1f} ms; Muon's extra update "
        "work = {:+.2f}% of the AdamW step\n",
        1e3 * ua, 1e3 * um, 100 * (um - ua) / ta);
    fmt::print("median of per-step ratios (adjacent AdamW/Muon steps): {:.3f} ({:+.1f}%)\n",
               Median(ratios), 100 * (Median(ratios) - 1));
    fmt::print(
        "rank 0 medians: compute AdamW {:.1f} ms / Muon {:.1f} ms, exposed comm wait {:.1f} / "
        "{:.1f} ms\n",
        1e3 * Median(c_adam), 1e3 * Median(c_muon), 1e3 * Median(w_adam), 1e3 * Median(w_muon));
    fmt::print("last loss: AdamW {:.4f}, Muon {:.4f}\n", loss_adam, loss_muon);
    if (!o.json.empty()) {
      nlohmann::json j = {{"model", o.model},
                          {"layout", adam.topology().ToString()},
                          {"microbatches", M},
                          {"batch_size", B},
                          {"seq_len", T},
                          {"weight_dtype", o.weight_dtype},
                          {"muon_unit", o.muon_unit},
                          {"muon_share", muon.structured_update().muon_share()},
                          {"units", plan->units().size()},
                          {"split_units", plan->num_split()},
                          {"ns_gflop_per_step", sum_cost / 1e9},
                          {"ns_balance_max_over_mean", balance},
                          {"p2p_bytes_per_step", p2p},
                          {"step_ms_adamw", 1e3 * ta},
                          {"step_ms_muon", 1e3 * tm},
                          {"ratio", tm / ta},
                          {"median_paired_ratio", Median(ratios)},
                          {"update_ms_adamw", 1e3 * ua},
                          {"update_ms_muon", 1e3 * um},
                          {"update_overhead", (um - ua) / ta},
                          {"warmup", o.warmup},
                          {"steps", o.steps}};
      std::ofstream(o.json) << j.dump(2) << "\n";
    }
  }
  return 0;
}

}  // namespace
}  // namespace sshsdp

int main(int argc, char** argv) {
  sshsdp::Options o;
  CLI::App app("Muon vs AdamW step time on the same workload and layout (run under mpirun)");
  app.add_option("--model", o.model, "GPT preset: tiny | small | base")->capture_default_str();
  app.add_option("--layers", o.layers, "override the preset's blocks");
  app.add_option("--d-model", o.d_model, "override the preset's width");
  app.add_option("--heads", o.heads, "override the preset's heads");
  app.add_option("--seq-len", o.seq_len, "override the preset's sequence length");
  app.add_option("--microbatches", o.microbatches, "microbatches per step")->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "samples per microbatch per rank")
      ->capture_default_str();
  app.add_option("--sw", o.sw, "ZeRO-3 degree (default: world)");
  app.add_option("--sg", o.sg, "ZeRO-2 degree (default: world)");
  app.add_option("--so", o.so, "ZeRO-1 degree (default: world)");
  app.add_option("--weight-dtype", o.weight_dtype, "runtime weights: bf16 | fp32")
      ->capture_default_str();
  app.add_option("--muon-unit", o.muon_unit, "head | matrix")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps per optimizer")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per optimizer")->capture_default_str();
  app.add_option("--json", o.json, "write the figures as JSON");
  CLI11_PARSE(app, argc, argv);
  return sshsdp::RunMpiMain(argc, argv, [&] { return sshsdp::Run(o); });
}
