// `sshsdp train`: options, progress line, metrics file and final weights export.
//
//   mpirun -np 4 sshsdp train --model tiny --sw 2 --sg 2 --so 4 --microbatches 2 --steps 50
//       (plus --metrics out/metrics.jsonl --save-weights out/final.safetensors
//        --save-every 100 --ckpt-dir out/ckpt --keep 3; later: --resume out/ckpt)
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sshsdp/engine/engine.h"

namespace sshsdp {

struct TrainOptions {
  std::string model = "tiny";
  int layers = 0, d_model = 0, heads = 0, seq_len = 0;  // 0: the preset's value
  // 0: unset. so: world size; sg: sw if given, else so; sw: sg (ResolveLayout) — without any
  // degree fully sharded.
  int sw = 0, sg = 0, so = 0, ranks_per_node = 0;
  int microbatches = 1, batch_size = 4;
  int steps = 50, warmup = 0;
  std::string lr_schedule = "constant";  // constant | cosine | wsd (update/lr_schedule.h)
  float lr_min = -1;                     // < 0: lr / 10
  int decay_steps = 0;                   // wsd; 0: 20 % of steps
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, clip = 1.0f;
  std::string on_nonfinite = "stop";     // stop | skip (EngineConfig::on_nonfinite)
  std::string weight_dtype = "bf16";     // bf16 | fp32 | mxfp8
  std::string attention_dtype = "auto";  // auto (bf16 with bf16 QKV weights) | fp32
  // MXFP8 scale layout of Tw (scale_layout.h); auto: cublas_swizzle on the CPU, row_major
  // with --mx-gemm bf16 or on a device (what its dequantize-for-the-GEMM reads).
  std::string scale_layout = "auto";
  std::string mx_gemm = "fp32";  // GEMM dtype of MXFP8 weights (dense presets): fp32 | bf16
  std::string reduce = "fp32";   // gradient reduction: fp32 | bf16+fp32 | bf16sr
  uint64_t sr_seed = 0;          // bf16sr stochastic-rounding seed
  uint64_t seed = 1;
  std::string data = "synthetic";
  int vocab_size = 0;  // 0: from the data
  std::string val_data;
  int eval_every = 0;
  int64_t eval_tokens = 16384;
  bool allow_data_change = false;
  bool dump_config = false;
  std::string config;  // --config TOML file (run_config.h)
  int log_every = 10;
  double gemm_peak = 0;  // GFLOP/s per rank for MFU; 0: measured (cli/gemm_peak.h)
  std::string metrics;
  std::string trace;                // Chrome trace of the --trace-steps window (trace_file.h)
  std::string trace_steps = "1:8";  // A:B, 1-based inclusive
  std::string save_weights;
  std::string init_weights;
  // The Llama family from Hugging Face: a config.json (random init), or a model directory
  // (config.json + safetensors: the weights too).
  std::string model_config;
  std::string init_from_hf;
  bool no_prefetch = false, keep_gathered = false, no_overlap_outer = false;
  std::string comm_path = "collective";  // runtime AG/RS: collective (ring) | direct (ZeroSM)
  std::string backend = "cpu";           // cpu | cuda | cuda:N (train_backend.h)
  // Optimizer (sshsdp/update): AdamW everywhere, or Muon for matrices — per head (every update
  // parameter; experts of stacked MoE weights one by one) or per matrix (the packed QKV as one
  // [3d, d] unit) — with AdamW for norm gains, embeddings and the LM head.
  std::string optimizer = "adamw", muon_unit = "head", muon_scale = "reference";
  float muon_lr = 0.02f, muon_momentum = 0.95f, muon_weight_decay = 0.0f;
  bool muon_nesterov = true;
  int muon_ns_steps = 5;
  // MoE presets (--model moe-tiny | moe-small); kUnset / empty / NaN: the preset's value (any
  // value given, 0 and negatives included, reaches MoeConfig::Validate).
  static constexpr int kUnset = std::numeric_limits<int>::min();
  int experts = kUnset, top_k = kUnset, moe_every = kUnset, d_expert = kUnset;
  std::string gating, expert_mlp;  // softmax | sigmoid, swiglu | gelu
  float aux_loss_weight = std::numeric_limits<float>::quiet_NaN();
  bool shared_expert = false;
  // Checkpoints (sshsdp/ckpt): every `save_every` steps into `ckpt_dir`, keeping the last
  // `keep` (0: all); `resume` is a checkpoint root (its latest) or step directory.
  int save_every = 0, keep = 0;
  std::string ckpt_dir, resume;
  std::string ckpt_fault;             // hidden, tests only: kill a rank during a save (see ckpt)
  std::string fault;                  // hidden, tests only: RANK:STEP throws inside that step
  double comm_timeout = 600;          // watchdog seconds (comm/watchdog.h); 0: off
  bool model_given = false;           // --model on the command line (main.cc)
  bool layout_given = true;           // false: no --sw/--sg/--so (a resume adopts the saved ones)
  bool ranks_per_node_given = true;   // false: no --ranks-per-node (a resume adopts the saved one)
  std::string recorded_config;        // the options as a --config file (run_config.h)
  std::vector<std::string> restored;  // options a --resume took from the checkpoint
  // The resumed checkpoint's model description: a Llama-family run resumes from it when its
  // --init-from-hf / --model-config path is gone.
  nlohmann::json resumed_model;
};

// train_options.cc.
void AddTrainOptions(CLI::App& app, TrainOptions& o);
// --sw/--sg/--so (0: unset, resolved by ResolveLayoutDegrees), for train, plan and bench alike.
void AddLayoutDegreeOptions(CLI::App& app, int* sw, int* sg, int* so);
// The layout degrees of --sw/--sg/--so (0: unset) on `world_size` ranks: so = the world, sg =
// sw if given else so, sw = sg — fully sharded without any; `train`, `plan` and `bench` alike.
// ConfigError for a negative degree (the Topology checks the rest).
struct LayoutDegrees {
  int sw, sg, so;
};
LayoutDegrees ResolveLayoutDegrees(int sw, int sg, int so, int world_size);
// Options set away from their defaults that this run does not use (Muon's with AdamW,
// --decay-steps without wsd, --lr-min with a constant schedule, --keep without --ckpt-dir, a
// warm-up as long as a cosine run, --no-overlap-outer without an outer phase: `outer_phase`
// false when sw = sg = so = the world size), one "note: ..." line each for rank 0 to print.
std::vector<std::string> UnusedOptionNotes(const TrainOptions& o, bool outer_phase = true);
// Checks the resolved layout on `world_size` ranks (Topology); a LayoutError about degrees the
// user did not give says where they came from ("--sg and --so were not given: sg = --sw 3,
// so = the world size 5"), so the message is about the flags on the command line.
void CheckResolvedLayout(int sw, int sg, int so, int world_size, int ranks_per_node);
// --ranks-per-node: 0 (one node) or a positive divisor of the world size (LayoutError).
void CheckRanksPerNode(int ranks_per_node, int world_size);
// The engine configuration the options ask for on `world_size` ranks with `seq_len` tokens
// per sample (unset degrees: fully sharded); ConfigError naming a bad value. `train` and
// `plan` build theirs with it.
EngineConfig EngineConfigOf(const TrainOptions& o, int world_size, int seq_len);
// Initializes MPI, trains, returns the process exit code; errors on any rank end the job.
int RunTrain(int argc, char** argv, const TrainOptions& o);

}  // namespace sshsdp
