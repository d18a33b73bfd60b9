// `sshsdp train`'s options (train.h): every flag, its help text and default.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "sshsdp/cli/train.h"

#include "sshsdp/cli/run_config.h"
#include "sshsdp/comm/comm_path.h"
#include "sshsdp/layout/topology.h"
#include "sshsdp/numerics/scale_layout.h"

namespace sshsdp {

void AddLayoutDegreeOptions(CLI::App& app, int* sw, int* sg, int* so) {
  app.add_option("--sw", *sw,
                 "ZeRO-3 (weight) shard degree (default: --sg); without any degree the run is "
                 "fully sharded, sw = sg = so = world size (what fully_shard does)")
      ->check(IntegerAtLeast(1));
  app.add_option("--sg", *sg,
                 "ZeRO-2 (gradient) shard degree, a multiple of sw (default: --sw if given, else "
                 "--so)")
      ->check(IntegerAtLeast(1));
  app.add_option("--so", *so,
                 "ZeRO-1 (optimizer) shard degree, a multiple of sg dividing the world (default: "
                 "world size; less gives HSDP replicas)")
      ->check(IntegerAtLeast(1));
}

namespace {

// The --config file and --dump-config.
void AddRunFileOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--config", o.config,
                 "read options from this TOML file (keys: option names without the dashes, "
                 "e.g. model = \"small\", batch-size = 8, optionally under [train]); flags on "
                 "the command line win; --dump-config writes one")
      ->check(CLI::ExistingFile)
      ->configurable(false);
  app.add_flag("--dump-config", o.dump_config,
               "print the effective options as a --config file and exit (no training)")
      ->configurable(false);
}

// The model: preset, Hugging Face config or checkpoint, sizes, MoE.
void AddModelOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--model", o.model,
                 "model preset: tiny | small | base (dense GPT), moe-tiny | moe-small (MoE GPT: "
                 "packed experts, each expert matrix its own update parameter; router and norms "
                 "use AdamW), qwen3-tiny | qwen3-small | qwen3-moe-tiny | llama-tiny (the Llama "
                 "family: RoPE, "
                 "GQA, SwiGLU, Qwen3's QK-norm)")
      ->capture_default_str();
  app.add_option(
      "--model-config", o.model_config,
      "a Hugging Face config.json (model_type llama, qwen3 or qwen3_moe): that architecture, "
      "randomly initialised (instead of --model)");
  app.add_option("--init-from-hf", o.init_from_hf,
                 "a Hugging Face model directory (config.json + model.safetensors or a sharded "
                 "index): its architecture and weights (instead of --model)");
  app.add_option("--layers", o.layers, "override the preset's number of blocks (0: the preset's)");
  app.add_option("--d-model", o.d_model, "override the preset's width (0: the preset's)");
  app.add_option("--heads", o.heads, "override the preset's attention heads (0: the preset's)");
  app.add_option("--experts", o.experts,
                 "MoE presets: experts per MoE block (moe-tiny 4, moe-small 8)");
  app.add_option("--top-k", o.top_k, "MoE presets: experts each token is routed to (default 2)");
  app.add_option("--moe-every", o.moe_every,
                 "MoE presets: every Nth block is MoE, the others dense (1: all, the default; 2: "
                 "blocks 1, 3, ...)");
  app.add_option("--gating", o.gating,
                 "MoE presets: router gating softmax | sigmoid; top-k gates renormalized to sum 1 "
                 "(default softmax)");
  app.add_option("--aux-loss-weight", o.aux_loss_weight,
                 "MoE presets: weight of the Switch load-balancing loss E*sum_e f_e*P_e, added to "
                 "the reported loss (default 0.01; 0: off)")
      ->check(FiniteAtLeast(0));
  app.add_flag("--shared-expert", o.shared_expert,
               "MoE presets: add an always-on shared expert to every MoE block");
  app.add_option("--expert-mlp", o.expert_mlp,
                 "MoE presets: expert MLP swiglu | gelu (default swiglu)");
  app.add_option("--d-expert", o.d_expert,
                 "MoE presets: hidden width of each expert (moe-tiny 128, moe-small 256; 0: the "
                 "preset's)");
}

// The layout and the batch.
void AddBatchOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--seq-len", o.seq_len,
                 "tokens per sample, at most the preset's context (tiny 64, small 128, base 256, "
                 "moe-tiny 64, moe-small 128; 0: the preset's)");
  AddLayoutDegreeOptions(app, &o.sw, &o.sg, &o.so);
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "ranks per (possibly simulated) node (0, the default: the whole world)");
  app.add_option("--microbatches", o.microbatches, "microbatches per optimizer step")
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "samples per microbatch per rank")
      ->capture_default_str();
}

// Steps, learning-rate schedule, AdamW and Muon.
void AddOptimizerOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--warmup", o.warmup, "linear learning-rate warm-up steps")->capture_default_str();
  app.add_option("--lr-schedule", o.lr_schedule,
                 "after warm-up: constant | cosine (decay to --lr-min at the last step) | wsd "
                 "(warm-up, stable, then linear decay to --lr-min over --decay-steps); Muon's "
                 "learning rate follows the same multiplier")
      ->capture_default_str();
  app.add_option("--lr-min", o.lr_min,
                 "AdamW learning rate at the end of a cosine / wsd schedule (Muon ends at the "
                 "same fraction of --muon-lr; default: --lr / 10)")
      ->check(FiniteAtLeast(0));
  app.add_option("--decay-steps", o.decay_steps,
                 "wsd: steps of the final decay (0, the default: 20% of --steps)")
      ->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--eps", o.eps, "AdamW epsilon")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay,
                 "decoupled weight decay (matrices and embeddings; not norm gains)")
      ->capture_default_str();
  app.add_option("--clip", o.clip, "global gradient-norm clipping (0: off)")->capture_default_str();
  app.add_option("--on-nonfinite", o.on_nonfinite,
                 "a step whose loss or gradient norm is NaN/Inf: stop (exit non-zero naming the "
                 "step; nothing is applied or saved) | skip (leave weights and optimizer state "
                 "as they were and go on)")
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer,
                 "adamw | muon (Muon for matrices, in units of --muon-unit, with AdamW for norm "
                 "gains, embeddings and the LM head; split units move point to point)")
      ->capture_default_str();
  app.add_option("--muon-unit", o.muon_unit,
                 "Muon update unit: head (every update parameter: each Q/K/V head, each "
                 "expert, each other matrix) | matrix (every runtime parameter: QKV as one "
                 "[3d, d] matrix)")
      ->capture_default_str();
  app.add_option("--muon-lr", o.muon_lr, "Muon learning rate (warm-up as --lr)")
      ->capture_default_str();
  app.add_option("--muon-momentum", o.muon_momentum, "Muon momentum mu (m = mu*m + g)")
      ->capture_default_str();
  app.add_flag("--muon-nesterov,!--no-muon-nesterov", o.muon_nesterov,
               "Nesterov input to Newton-Schulz, on by default (u = g + mu*m; "
               "--no-muon-nesterov: u = m)")
      ->default_str("true");
  app.add_option("--muon-scale", o.muon_scale,
                 "Muon update scale: reference (sqrt(max(1, rows/cols))) | rms "
                 "(0.2*sqrt(max(rows, cols)), matches AdamW's update RMS)")
      ->capture_default_str();
  app.add_option("--muon-weight-decay", o.muon_weight_decay,
                 "Muon decoupled weight decay (w = w*(1 - lr*wd) - lr*update)")
      ->capture_default_str();
  app.add_option("--muon-ns-steps", o.muon_ns_steps, "Newton-Schulz iterations (quintic)")
      ->capture_default_str();
}

// Runtime weight dtype, MXFP8, gradient reduction, seeds.
void AddPrecisionOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--weight-dtype", o.weight_dtype,
                 "runtime weight dtype: bf16 | fp32 | mxfp8 (E4M3 + UE8M0 32x32 blocks for "
                 "transformer blocks; embedding and LM head stay bf16; MoE presets: the expert "
                 "weights only, in their own runtime groups; router, attention, dense blocks bf16)")
      ->capture_default_str();
  app.add_option(
         "--attention-dtype", o.attention_dtype,
         "attention's operands: auto (bf16 — Q, K, V, P, dO, dS rounded, softmax and sums in "
         "fp32, as torch.autocast — where the QKV weights are bf16 and the backend has bf16 "
         "attention: the CPU; fp32 otherwise) | fp32 (always)")
      ->capture_default_str();
  app.add_option("--scale-layout", o.scale_layout,
                 "MXFP8 scale layout of packed runtime weights (Tw): auto | row_major | "
                 "block_row_major | deepgemm_mn_major | cublas_swizzle. auto: cublas_swizzle on "
                 "the CPU; row_major with --mx-gemm bf16 or on --backend cuda, the only layout "
                 "their dequantize-for-the-GEMM reads (another is refused there). A kernel "
                 "layout: it does not change the numbers, and a resume does not restore it")
      ->capture_default_str();
  app.add_option("--mx-gemm", o.mx_gemm,
                 "with --weight-dtype mxfp8, dense presets: the dtype each MXFP8 weight is "
                 "dequantized to for its GEMMs: fp32 | bf16 (bf16 products, tensor cores on a "
                 "GPU; bf16-rounded inputs, as bf16 weights; row_major scales). Per launch, like "
                 "--backend")
      ->capture_default_str();
  app.add_option("--reduce", o.reduce,
                 "gradient reduction precision: fp32 | bf16+fp32 | bf16sr (bf16 partials with "
                 "stochastic rounding)")
      ->capture_default_str();
  app.add_option("--sr-seed", o.sr_seed, "seed of bf16sr stochastic rounding")
      ->capture_default_str()
      ->check(IntegerAtLeast(0));
  app.add_option("--seed", o.seed, "seed of initial weights and synthetic data")
      ->capture_default_str()
      ->check(IntegerAtLeast(0));
}

// Data, validation, outputs and checkpoints.
void AddDataOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--data", o.data,
                 "'synthetic' (built-in Markov source over bytes with a known optimal loss) or a "
                 "uint16 token file (nanoGPT .bin or llm.c format)")
      ->capture_default_str();
  app.add_option("--vocab-size", o.vocab_size,
                 "tokenizer vocabulary of --data (0, the default: from the data: 256 if every "
                 "token is a byte, GPT-2's 50257 if every token is below it, else the largest "
                 "token + 1); tables are padded to a multiple of 128 rows")
      ->capture_default_str();
  app.add_option("--val-data", o.val_data,
                 "validation token file (same format and vocabulary as --data); with synthetic "
                 "data and no --val-data, held-out samples of the same source");
  app.add_option("--eval-every", o.eval_every,
                 "validation loss every N steps and after the last (0, the default: never)")
      ->capture_default_str();
  app.add_option("--eval-tokens", o.eval_tokens,
                 "tokens per validation (over all ranks; rounded up to whole batches; the same "
                 "samples every time; at most one pass over --val-data, at most 4,194,304 of "
                 "held-out samples without it)")
      ->capture_default_str();
  app.add_flag("--allow-data-change", o.allow_data_change,
               "--resume with a --data other than the checkpoint's (default: refused)");
  app.add_option("--log-every", o.log_every, "progress line every N steps (rank 0)")
      ->capture_default_str();
  app.add_option("--gemm-peak", o.gemm_peak,
                 "MFU denominator in GFLOP/s per rank (0: measure it at start-up with all ranks "
                 "multiplying at once, on the GEMM path of --weight-dtype)")
      ->capture_default_str();
  app.add_option("--metrics", o.metrics, "write per-step metrics as JSON lines to this file");
  app.add_option("--trace", o.trace,
                 "write a Chrome trace (Perfetto / chrome://tracing; scripts/plot_trace.py) of "
                 "the --trace-steps steps to this file: a row per rank, compute and "
                 "communication threads, every layer's forward / backward, each collective with "
                 "its bytes, waits, the update phase");
  app.add_option("--trace-steps", o.trace_steps,
                 "steps A:B (1-based, inclusive) that --trace records; tracing is bounded to them")
      ->capture_default_str();
  app.add_option("--save-weights", o.save_weights,
                 "write final consolidated fp32 main weights as safetensors");
  app.add_option("--init-weights", o.init_weights,
                 "start from weights in this safetensors file instead of the seeded init");
  app.add_option("--save-every", o.save_every,
                 "save a sharded checkpoint every N steps into --ckpt-dir (0: never)")
      ->capture_default_str();
  app.add_option("--ckpt-dir", o.ckpt_dir,
                 "checkpoint root: step_<N>/ directories, each a manifest + one file per rank; "
                 "written every --save-every steps, on a stop signal and after the last step");
  app.add_option("--keep", o.keep, "keep the last K checkpoints in --ckpt-dir (0: all)")
      ->capture_default_str();
  app.add_option("--resume", o.resume,
                 "resume from a checkpoint root (its latest complete checkpoint) or step "
                 "directory, at this run's layout (without --sw/--sg/--so: the saved degrees, "
                 "on the saved --ranks-per-node unless it is given); --steps counts from 0");
}

// Watchdog, test-only faults, communication switches.
void AddRuntimeOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--comm-timeout", o.comm_timeout,
                 "seconds a blocking wait (collective, exchange, barrier, direct-path poll) may "
                 "last before the watchdog names what it waited for and ends the job (0: never)")
      ->capture_default_str();
  app.add_option("--fault", o.fault,
                 "tests only: RANK:STEP throws on that rank inside that step's first microbatch; "
                 "RANK:STEP:sleep makes that step 3 s longer there instead")
      ->group("")
      ->configurable(false);
  app.add_option("--ckpt-fault", o.ckpt_fault,
                 "tests only: RANK:PHASE[:STEP] kills a rank during a save")
      ->group("")
      ->configurable(false);
  app.add_flag("--no-prefetch", o.no_prefetch, "do not prefetch the next layer's all-gather");
  app.add_flag("--no-overlap-outer", o.no_overlap_outer,
               "run the outer phase (outer reduce-scatter, HSDP all-reduce, outer all-gather) in "
               "the update phase instead of overlapping it with backward and the next forward");
  app.add_flag("--keep-gathered", o.keep_gathered,
               "keep gathered weights from forward for backward (no reshard after forward)");
  app.add_option("--comm-path", o.comm_path,
                 "per-microbatch all-gather / reduce-scatter: collective (ring collectives) | "
                 "direct (ZeroSM: registered windows, one-sided transfers, inter-node-first "
                 "all-gather, node-local reduction first; needs ZeRO-3/ZeRO-2 groups spread "
                 "evenly over --ranks-per-node nodes; also on --backend cpu) | nccl (NCCL on "
                 "device buffers: --backend cuda only, where it is the default when the ZeRO-2 "
                 "groups span nodes, else direct over CUDA IPC)")
      ->capture_default_str();
  app.add_option(
         "--backend", o.backend,
         "where the engine and the model run: cpu (the CPU backend, every feature) | "
         "cuda (this rank's GPU: local rank modulo the GPUs visible) | cuda:N. CUDA "
         "runs the dense GPT presets with bf16, fp32 or mxfp8 weights (mxfp8 dequantized for "
         "each GEMM) and the MoE presets with bf16, fp32 or mxfp8 experts, "
         "--reduce fp32, AdamW or Muon (per head, per expert), "
         "every --sw/--sg/--so layout, and checkpoints (which load on the CPU "
         "and back); several ranks on CUDA move the ZeRO-3/ZeRO-2 groups on the direct "
         "path over CUDA IPC (one node; ranks may share a GPU) or over NCCL (groups "
         "spanning nodes, or --comm-path nccl), and the outer phase (replica "
         "reduce-scatter / all-gather, HSDP all-reduce) over NCCL with it, else staged "
         "through host memory over MPI")
      ->capture_default_str();
}

}  // namespace

void AddTrainOptions(CLI::App& app, TrainOptions& o) {
  AddRunFileOptions(app, o);
  AddModelOptions(app, o);
  AddBatchOptions(app, o);
  AddOptimizerOptions(app, o);
  AddPrecisionOptions(app, o);
  AddDataOptions(app, o);
  AddRuntimeOptions(app, o);
}

EngineConfig EngineConfigOf(const TrainOptions& o, int world_size, int seq_len) {
  EngineConfig cfg;
  cfg.ranks_per_node = o.ranks_per_node;
  cfg.microbatches = o.microbatches;
  cfg.batch_size = o.batch_size;
  cfg.seq_len = seq_len;
  SSHSDP_CHECK(o.weight_dtype == "bf16" || o.weight_dtype == "fp32" || o.weight_dtype == "mxfp8",
               ConfigError, "--weight-dtype must be bf16, fp32 or mxfp8, got '{}'", o.weight_dtype);
  cfg.weight_dtype = o.weight_dtype == "mxfp8" ? DType::kE4M3 : ParseDType(o.weight_dtype);
  SSHSDP_CHECK(o.mx_gemm == "fp32" || o.mx_gemm == "bf16", ConfigError,
               "--mx-gemm must be fp32 or bf16, got '{}'", o.mx_gemm);
  SSHSDP_CHECK(o.mx_gemm == "fp32" || o.weight_dtype == "mxfp8", ConfigError,
               "--mx-gemm bf16 dequantizes MXFP8 weights to bf16 for their GEMMs: use it with "
               "--weight-dtype mxfp8, got --weight-dtype {}",
               o.weight_dtype);
  const bool row_major = o.backend != "cpu" || o.mx_gemm == "bf16";  // what the GEMMs read
  cfg.scale_layout = o.scale_layout == "auto"
                         ? (row_major ? ScaleLayout::kRowMajor : ScaleLayout::kCublasSwizzle)
                         : ParseScaleLayout(o.scale_layout);
  cfg.reduce = ParseReduceMode(o.reduce);
  cfg.sr_seed = o.sr_seed;
  cfg.reshard_after_forward = !o.keep_gathered;
  cfg.prefetch = !o.no_prefetch;
  cfg.overlap_outer = !o.no_overlap_outer;
  cfg.comm_path = ParseCommPath(o.comm_path);
  cfg.adamw = {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  cfg.clip_norm = o.clip;
  SSHSDP_CHECK(o.optimizer == "adamw" || o.optimizer == "muon", ConfigError,
               "--optimizer must be adamw or muon, got '{}'", o.optimizer);
  SSHSDP_CHECK(o.muon_unit == "head" || o.muon_unit == "matrix", ConfigError,
               "--muon-unit must be head or matrix, got '{}'", o.muon_unit);
  cfg.optimizer = o.optimizer == "muon" ? OptimizerKind::kMuon : OptimizerKind::kAdamW;
  cfg.muon_unit = ParseUnitRule(o.muon_unit);
  cfg.muon.lr = o.muon_lr;
  cfg.muon.momentum = o.muon_momentum;
  cfg.muon.nesterov = o.muon_nesterov;
  cfg.muon.scale = ParseMuonScale(o.muon_scale);
  cfg.muon.weight_decay = o.muon_weight_decay;
  cfg.muon.ns_steps = o.muon_ns_steps;
  cfg.on_nonfinite = ParseNonFinitePolicy(o.on_nonfinite);
  const LayoutDegrees d = ResolveLayoutDegrees(o.sw, o.sg, o.so, world_size);
  cfg.sw = d.sw, cfg.sg = d.sg, cfg.so = d.so;
  return cfg;
}

std::vector<std::string> UnusedOptionNotes(const TrainOptions& o, bool outer_phase) {
  const TrainOptions d;
  std::vector<std::string> notes, muon;
  if (o.optimizer != "muon") {
    if (o.muon_lr != d.muon_lr) muon.push_back("--muon-lr");
    if (o.muon_momentum != d.muon_momentum) muon.push_back("--muon-momentum");
    if (o.muon_weight_decay != d.muon_weight_decay) muon.push_back("--muon-weight-decay");
    if (o.muon_nesterov != d.muon_nesterov) muon.push_back("--no-muon-nesterov");
    if (o.muon_ns_steps != d.muon_ns_steps) muon.push_back("--muon-ns-steps");
    if (o.muon_unit != d.muon_unit) muon.push_back("--muon-unit");
    if (o.muon_scale != d.muon_scale) muon.push_back("--muon-scale");
  }
  if (!muon.empty())
    notes.push_back(fmt::format("{} ignored: --optimizer is {} (--optimizer muon uses them)",
                                fmt::join(muon, ", "), o.optimizer));
  if (o.decay_steps != d.decay_steps && o.lr_schedule != "wsd")
    notes.push_back(
        fmt::format("--decay-steps ignored: --lr-schedule is {} (wsd uses it)", o.lr_schedule));
  if (o.lr_min != d.lr_min && o.lr_schedule == "constant")
    notes.push_back("--lr-min ignored: --lr-schedule is constant (cosine and wsd decay to it)");
  if (o.keep != d.keep && o.ckpt_dir.empty())
    notes.push_back("--keep ignored: no --ckpt-dir, no checkpoints to prune");
  if (o.no_overlap_outer && !outer_phase)
    notes.push_back(
        "--no-overlap-outer ignored: sw = sg = so = the world size leaves no outer phase (no "
        "replica reduce-scatter / all-gather, no HSDP all-reduce)");
  if (o.lr_schedule == "cosine" && o.warmup >= o.steps && o.steps > 0)
    notes.push_back(fmt::format("--warmup {} covers all {} steps: the cosine decay never starts",
                                o.warmup, o.steps));
  return notes;
}

void CheckRanksPerNode(int ranks_per_node, int world_size) {
  SSHSDP_CHECK(ranks_per_node >= 0 && (ranks_per_node == 0 || world_size % ranks_per_node == 0),
               LayoutError,
               "--ranks-per-node {} must be a positive divisor of the world size {} (nodes hold "
               "equal numbers of ranks), or 0 (the default: all ranks on one node)",
               ranks_per_node, world_size);
}

void CheckResolvedLayout(int sw, int sg, int so, int world_size, int ranks_per_node) {
  CheckRanksPerNode(ranks_per_node, world_size);
  const LayoutDegrees d = ResolveLayoutDegrees(sw, sg, so, world_size);
  try {
    Topology check(world_size, ranks_per_node ? ranks_per_node : world_size, d.sw, d.sg, d.so);
  } catch (const LayoutError& e) {
    // Context for errors about the degrees (not --ranks-per-node's): where unset ones came from.
    if (sw && sg && so) throw;
    std::vector<std::string> unset, from;
    if (!sw) unset.push_back("--sw"), from.push_back("sw = sg");
    if (!sg)
      unset.push_back("--sg"), from.push_back(sw ? fmt::format("sg = --sw {}", sw) : "sg = so");
    if (!so) unset.push_back("--so"), from.push_back(fmt::format("so = the world size {}", d.so));
    throw LayoutError(fmt::format("{} ({} not given: {})", e.what(), fmt::join(unset, ", "),
                                  fmt::join(from, ", ")));
  }
}

LayoutDegrees ResolveLayoutDegrees(int sw, int sg, int so, int world_size) {
  SSHSDP_CHECK(sw >= 0 && sg >= 0 && so >= 0, ConfigError,
               "--sw, --sg and --so must be >= 1 (or left out), got {}, {}, {}", sw, sg, so);
  LayoutDegrees d{};
  d.so = so ? so : world_size;
  d.sg = sg ? sg : sw ? sw : d.so;
  d.sw = sw ? sw : d.sg;
  return d;
}

}  // namespace sshsdp
