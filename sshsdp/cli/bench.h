// `sshsdp bench`: framework presets (or the ablation ladder) back to back in ONE job on the
// same workload, so the comparison the paper makes against FSDP2, Megatron-FSDP and
// veScale-FSDP can be repeated honestly on the user's own machine (docs/design.md, Baselines and
// Measurement rules).
//
//   mpirun -np 2 sshsdp bench --model small --batch-size 1,2,4,8 --json out/bench.json
//   mpirun -np 2 sshsdp bench --ablation            # fsdp2 → +one optimization at a time
//   mpirun -np 4 sshsdp bench --presets fsdp2,sshsdp --comm-path collective,direct
//       --ranks-per-node 2 --batch-size 1,4,16,64     # (one line) the paper's Figure 8 here
//   mpirun -np 2 sshsdp bench --peer-inputs out/peer  # also writes init weights + batches
//   mpirun -np 2 sshsdp bench --presets sshsdp,fsdp2 --optimizer muon   # p2p units vs ⑥
//       full_tensor; an "update phase" table adds Newton–Schulz FLOPs and update bytes per rank
//
// For every workload (samples per microbatch per rank) and every configuration it builds a
// fresh model and engine and runs warm-up steps; then it times steps round-robin over the
// configurations (--sequential: back to back), so load changes on a shared machine hit every
// configuration alike, and reports the median step (slowest rank) as tokens/s, its ratio to the
// `sshsdp` row, MFU against the GEMM peak this binary measures, peak RSS (the process
// baseline plus the configuration's growth during its build and warm-up) and
// framework-accounted memory by category, bytes copied per step (weight / gradient
// paths), bytes communicated per step (intra / inter node, per rank) and the step time by category
// (compute, exposed communication wait, copies, casts, adds, optimizer, other; mean over ranks and
// timed steps). Every configuration trains the same model on the same data from the same initial
// weights, so their first losses must agree; the table says how closely they do.
//
// --profile adds the step profile (bench_profile.h): the model's kernel time by category
// (GEMM, attention, norms, activations, loss, ...) next to the engine's split, per
// configuration, in ms and % of the step (and "profile" in the JSON rows).
//
// --peer-inputs DIR writes, per workload, DIR/b<B>/{init.safetensors, batches.bin,
// workload.json}: the initial weights (update-parameter names), the exact token batches of
// every step ([steps, microbatches, ranks, B, T] int32 tokens, then targets) and the
// workload with this run's per-step losses and rows, for bench/peers/fsdp2_peer.py.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace sshsdp {

struct BenchOptions {
  std::string model = "small";
  std::string model_config;     // a Hugging Face config.json (the Llama family), instead of model
  bool model_given = false;     // --model on the command line (main.cc)
  std::string recorded_config;  // every option as text (set by main): ranks must agree
  int layers = 0, d_model = 0, heads = 0, seq_len = 0;  // 0: the preset's value
  std::vector<int> batch_sizes = {4};                   // workload sweep (samples/microbatch/rank)
  int microbatches = 4;
  int sw = 0, sg = 0, so = 0, ranks_per_node = 0;  // 0: the world size
  std::string weight_dtype = "bf16";
  std::string attention_dtype = "auto";  // auto | fp32 (as sshsdp train's)
  std::vector<std::string> presets;      // empty: all
  // Per-microbatch AG/RS paths (comm_path.h): every preset runs on each; direct rows are
  // labelled "<preset>+direct".
  std::vector<std::string> comm_paths = {"collective"};
  std::vector<std::string> overlap_outer = {"on"};  // on | off (EngineConfig::overlap_outer)
  bool ablation = false;
  bool sequential = false;  // time configurations back to back (default: round-robin steps)
  int warmup = 2, steps = 5;
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, clip = 1.0f;
  // adamw | muon (Muon for matrices in units of muon_unit, AdamW for the rest). With muon,
  // megatron-fsdp (no structured updates) is left out of the default presets and refused when
  // named.
  std::string optimizer = "adamw";
  std::string muon_unit = "head";
  float muon_lr = 0.02f;
  uint64_t seed = 1;
  double gemm_peak = 0;       // GFLOP/s per rank for MFU; 0: measured (cli/gemm_peak.h)
  double comm_timeout = 600;  // watchdog seconds (comm/watchdog.h); 0: off
  std::string json;
  std::string trace;  // Chrome trace of each configuration's first timed step (trace_file.h)
  std::string peer_inputs;
  bool profile = false;  // time the model's kernels by category (bench_profile.h)
};

void AddBenchOptions(CLI::App& app, BenchOptions& o);
// Initializes MPI, runs the benchmark, returns the exit code (errors end the whole job).
int RunBench(int argc, char** argv, const BenchOptions& o);

}  // namespace sshsdp
