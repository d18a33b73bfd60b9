// `sshsdp train` (see train.h): builds the model, data source and engine, runs the steps,
// prints a progress line on rank 0 and writes metrics as JSON lines.
#include "sshsdp/cli/train.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/cli/ckpt_cli.h"
#include "sshsdp/cli/gemm_peak.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/watchdog.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

void AddTrainOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--model", o.model,
                 "model preset: tiny | small | base (dense GPT), moe-tiny | moe-small (MoE GPT: "
                 "packed experts, each expert matrix its own update parameter; router and norms "
                 "use AdamW)")
      ->capture_default_str();
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
                 "the reported loss (default 0.01; 0: off)");
  app.add_flag("--shared-expert", o.shared_expert,
               "MoE presets: add an always-on shared expert to every MoE block");
  app.add_option("--expert-mlp", o.expert_mlp,
                 "MoE presets: expert MLP swiglu | gelu (default swiglu)");
  app.add_option("--d-expert", o.d_expert,
                 "MoE presets: hidden width of each expert (moe-tiny 128, moe-small 256)");
  app.add_option("--seq-len", o.seq_len,
                 "tokens per sample, at most the preset's context (tiny 64, small 128, base 256; "
                 "0: the preset's)");
  app.add_option("--sw", o.sw, "ZeRO-3 (weight) shard degree")->capture_default_str();
  app.add_option("--sg", o.sg, "ZeRO-2 (gradient) shard degree, a multiple of sw")
      ->capture_default_str();
  app.add_option("--so", o.so,
                 "ZeRO-1 (optimizer) shard degree, a multiple of sg dividing the world "
                 "(0, the default: world size; less gives HSDP replicas)");
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "ranks per (possibly simulated) node (0, the default: the whole world)");
  app.add_option("--microbatches", o.microbatches, "microbatches per optimizer step")
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "samples per microbatch per rank")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--warmup", o.warmup, "linear learning-rate warm-up steps")->capture_default_str();
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
      ->capture_default_str();
  app.add_option("--muon-scale", o.muon_scale,
                 "Muon update scale: reference (sqrt(max(1, rows/cols))) | rms "
                 "(0.2*sqrt(max(rows, cols)), matches AdamW's update RMS)")
      ->capture_default_str();
  app.add_option("--muon-weight-decay", o.muon_weight_decay,
                 "Muon decoupled weight decay (w = w*(1 - lr*wd) - lr*update)")
      ->capture_default_str();
  app.add_option("--muon-ns-steps", o.muon_ns_steps, "Newton-Schulz iterations (quintic)")
      ->capture_default_str();
  app.add_option("--weight-dtype", o.weight_dtype,
                 "runtime weight dtype: bf16 | fp32 | mxfp8 (E4M3 + UE8M0 32x32 blocks for "
                 "transformer blocks; embedding and LM head stay bf16; MoE presets: the expert "
                 "weights only, in their own runtime groups; router, attention, dense blocks bf16)")
      ->capture_default_str();
  app.add_option("--scale-layout", o.scale_layout,
                 "MXFP8 scale layout of packed runtime weights: row_major | block_row_major | "
                 "deepgemm_mn_major | cublas_swizzle")
      ->capture_default_str();
  app.add_option("--reduce", o.reduce,
                 "gradient reduction precision: fp32 | bf16+fp32 | bf16sr (bf16 partials with "
                 "stochastic rounding)")
      ->capture_default_str();
  app.add_option("--sr-seed", o.sr_seed, "seed of bf16sr stochastic rounding")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of initial weights and synthetic data")
      ->capture_default_str();
  app.add_option("--data", o.data,
                 "'synthetic' (built-in Markov source with a known optimal loss) or a uint16 "
                 "token file (nanoGPT .bin or llm.c format)")
      ->capture_default_str();
  app.add_option("--log-every", o.log_every, "progress line every N steps (rank 0)")
      ->capture_default_str();
  app.add_option("--gemm-peak", o.gemm_peak,
                 "MFU denominator in GFLOP/s per rank (0: measure it at start-up with all ranks "
                 "multiplying at once, on the GEMM path of --weight-dtype)")
      ->capture_default_str();
  app.add_option("--metrics", o.metrics, "write per-step metrics as JSON lines to this file");
  app.add_option("--save-weights", o.save_weights,
                 "write final consolidated fp32 main weights as safetensors");
  app.add_option("--init-weights", o.init_weights,
                 "start from weights in this safetensors file instead of the seeded init");
  app.add_option("--save-every", o.save_every,
                 "save a sharded checkpoint every N steps into --ckpt-dir (0: never)")
      ->capture_default_str();
  app.add_option("--ckpt-dir", o.ckpt_dir,
                 "checkpoint root: step_<N>/ directories, each a manifest + one file per rank");
  app.add_option("--keep", o.keep, "keep the last K checkpoints in --ckpt-dir (0: all)")
      ->capture_default_str();
  app.add_option("--resume", o.resume,
                 "resume from a checkpoint root (its latest complete checkpoint) or step "
                 "directory, at this run's layout (without --sw/--sg/--so/--ranks-per-node: "
                 "the saved layout); --steps counts from 0");
  app.add_option("--comm-timeout", o.comm_timeout,
                 "seconds a blocking wait (collective, exchange, barrier, direct-path poll) may "
                 "last before the watchdog names what it waited for and ends the job (0: never)")
      ->capture_default_str();
  app.add_option("--fault", o.fault,
                 "tests only: RANK:STEP throws on that rank inside that step's first microbatch; "
                 "RANK:STEP:sleep makes that step 3 s longer there instead")
      ->group("");
  app.add_option("--ckpt-fault", o.ckpt_fault,
                 "tests only: RANK:PHASE[:STEP] kills a rank during a save")
      ->group("");
  app.add_flag("--no-prefetch", o.no_prefetch, "do not prefetch the next layer's all-gather");
  app.add_flag("--keep-gathered", o.keep_gathered,
               "keep gathered weights from forward for backward (no reshard after forward)");
  app.add_option("--comm-path", o.comm_path,
                 "per-microbatch all-gather / reduce-scatter: collective (ring collectives) | "
                 "direct (ZeroSM: registered windows, one-sided transfers, inter-node-first "
                 "all-gather, node-local reduction first; needs ZeRO-3/ZeRO-2 groups spread "
                 "evenly over --ranks-per-node nodes)")
      ->capture_default_str();
}

namespace {

double PeakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

bool IsMoePreset(const std::string& name) { return name.rfind("moe-", 0) == 0; }

// SIGTERM (what Slurm sends before preemption) and SIGINT: the first asks the training loop
// to stop after the current step (checkpoint when --ckpt-dir is set, exit 128 + signal); a
// second ends the process at once.
std::atomic<int> g_stop_signal{0};

extern "C" void OnStopSignal(int sig) {
  if (g_stop_signal.exchange(sig) != 0) _exit(128 + sig);
  static const char kMsg[] =
      "sshsdp: stop signal received: finishing the current step (again to abort now)\n";
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
}

void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// ConfigError unless `path` (if given) can be created or replaced: its directory exists and is
// writable, and it is not itself a directory.
void CheckWritableOutput(const char* flag, const std::string& path) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  SSHSDP_CHECK(!fs::is_directory(p, ec), ConfigError, "{} {}: is a directory; name a file", flag,
               path);
  SSHSDP_CHECK(fs::is_directory(dir, ec), ConfigError,
               "{} {}: directory '{}' does not exist (create it first)", flag, path, dir.string());
  SSHSDP_CHECK(access(dir.c_str(), W_OK) == 0, ConfigError,
               "{} {}: directory '{}' is not "
               "writable: {}",
               flag, path, dir.string(), std::strerror(errno));
}

// The MoE configuration of an MoE preset: its trunk with the GPT overrides, then the MoE
// flags. ConfigError for MoE flags on a dense preset.
MoeConfig MakeMoeConfig(const TrainOptions& o, const GptConfig& trunk) {
  if (!IsMoePreset(o.model)) {
    constexpr int kUnset = TrainOptions::kUnset;
    SSHSDP_CHECK(o.experts == kUnset && o.top_k == kUnset && o.moe_every == kUnset &&
                     o.d_expert == kUnset && o.gating.empty() && o.expert_mlp.empty() &&
                     std::isnan(o.aux_loss_weight) && !o.shared_expert,
                 ConfigError,
                 "--experts/--top-k/--moe-every/--d-expert/--gating/--expert-mlp/"
                 "--aux-loss-weight/--shared-expert apply to MoE presets (moe-tiny, moe-small), "
                 "not '{}'",
                 o.model);
    return {};
  }
  MoeConfig c = MoeConfig::Preset(o.model);
  c.trunk = trunk;
  if (o.experts != TrainOptions::kUnset) c.n_expert = o.experts;
  if (o.top_k != TrainOptions::kUnset) c.top_k = o.top_k;
  if (o.moe_every != TrainOptions::kUnset) c.moe_every = o.moe_every;
  if (o.d_expert != TrainOptions::kUnset) c.d_expert = o.d_expert;
  if (!o.gating.empty()) c.gating = ParseGating(o.gating);
  if (!o.expert_mlp.empty()) c.expert_mlp = ParseExpertMlp(o.expert_mlp);
  if (!std::isnan(o.aux_loss_weight)) c.aux_loss_weight = o.aux_loss_weight;
  c.shared_expert = o.shared_expert;
  // MXFP8: experts in their own runtime groups, the only MX groups (moe.h).
  c.expert_group = o.weight_dtype == "mxfp8";
  c.Validate();
  return c;
}

// The model a preset names: the dense GPT or the MoE GPT over the same trunk.
std::unique_ptr<Model> MakeModel(const TrainOptions& o, const GptConfig& trunk) {
  if (IsMoePreset(o.model)) return std::make_unique<MoeGpt>(MakeMoeConfig(o, trunk));
  return std::make_unique<Gpt>(trunk);
}

std::string ModelDescription(const TrainOptions& o, const GptConfig& trunk) {
  if (!IsMoePreset(o.model)) return "GPT";
  const MoeConfig c = MakeMoeConfig(o, trunk);
  int moe_blocks = 0;
  for (int l = 0; l < trunk.n_layer; ++l) moe_blocks += c.IsMoeLayer(l);
  return fmt::format("MoE GPT [{} of {} blocks MoE, E={} top-{} {} {}{} f={}{}, aux {}{}]",
                     moe_blocks, trunk.n_layer, c.n_expert, c.top_k, GatingName(c.gating),
                     ExpertMlpName(c.expert_mlp), c.renormalize ? " renorm" : "", c.expert_ff(),
                     c.shared_expert ? " +shared" : "", c.aux_loss_weight,
                     c.expert_group ? ", expert groups" : "");
}

GptConfig MakeGptConfig(const TrainOptions& o) {
  GptConfig c =
      IsMoePreset(o.model) ? MoeConfig::Preset(o.model).trunk : GptConfig::Preset(o.model);
  if (o.layers) c.n_layer = o.layers;
  if (o.d_model) c.d_model = o.d_model;
  if (o.heads) c.n_head = o.heads;
  SSHSDP_CHECK(o.layers >= 0 && o.d_model >= 0 && o.heads >= 0 && o.seq_len >= 0, ConfigError,
               "--layers, --d-model, --heads and --seq-len must be >= 0 (0: the preset's), got "
               "{}, {}, {}, {}",
               o.layers, o.d_model, o.heads, o.seq_len);
  SSHSDP_CHECK(o.seq_len <= c.seq_len, ConfigError,
               "--seq-len {} exceeds the '{}' preset's context of {} tokens (its position "
               "table); use a preset with a longer context (tiny 64, small 128, base 256)",
               o.seq_len, o.model, c.seq_len);
  c.Validate();
  MakeMoeConfig(o, c);  // MoE flags checked before any collective
  return c;
}

}  // namespace

int RunTrain(int argc, char** argv, const TrainOptions& o) {
  return RunMpiMain(argc, argv, [&]() -> int {
    // Everything below that can be wrong with the input is checked before any collective.
    const GptConfig gc = MakeGptConfig(o);
    const int T = o.seq_len ? o.seq_len : gc.seq_len;
    std::unique_ptr<TokenSource> data;
    if (o.data == "synthetic")
      data = std::make_unique<SyntheticTokens>(gc.vocab, o.seed);
    else
      data = std::make_unique<TokenFile>(o.data, gc.vocab, T, o.seed);
    SSHSDP_CHECK(o.steps >= 0, ConfigError, "--steps must be >= 0, got {}", o.steps);
    SSHSDP_CHECK(o.log_every >= 1, ConfigError, "--log-every must be >= 1, got {}", o.log_every);
    SSHSDP_CHECK(o.warmup >= 0, ConfigError, "--warmup must be >= 0 steps, got {}", o.warmup);
    SetCommTimeout(o.comm_timeout);  // ConfigError for a bad value; watches every wait below
    InstallStopHandlers();
    int fault_rank = -1;
    int64_t fault_step = -1;
    bool fault_sleep = o.fault.size() > 6 && o.fault.compare(o.fault.size() - 6, 6, ":sleep") == 0;
    if (!o.fault.empty()) {
      SSHSDP_CHECK(std::sscanf(o.fault.c_str(), "%d:%ld", &fault_rank, &fault_step) == 2,
                   ConfigError, "--fault must be RANK:STEP, got '{}'", o.fault);
    }
    // Files rank 0 writes: their directories must exist and be writable now, not at the end.
    if (WorldRankOrMinusOne() == 0) {
      CheckWritableOutput("--save-weights", o.save_weights);
      CheckWritableOutput("--metrics", o.metrics);
    }
    SSHSDP_CHECK(std::isfinite(o.gemm_peak) && o.gemm_peak >= 0, ConfigError,
                 "--gemm-peak must be a GFLOP/s figure per rank >= 0 (0: measure), got {}",
                 o.gemm_peak);
    // bf16 GEMMs run for bf16 weights and the bf16 parts of mxfp8 runs: a bad
    // SSHSDP_BF16_GEMM fails here, before any collective.
    if (o.weight_dtype != "fp32") kernels::ActiveBf16GemmPath();
    EngineConfig cfg;
    cfg.sw = o.sw;
    cfg.sg = o.sg;
    cfg.ranks_per_node = o.ranks_per_node;
    cfg.microbatches = o.microbatches;
    cfg.batch_size = o.batch_size;
    cfg.seq_len = T;
    SSHSDP_CHECK(o.weight_dtype == "bf16" || o.weight_dtype == "fp32" || o.weight_dtype == "mxfp8",
                 ConfigError, "--weight-dtype must be bf16, fp32 or mxfp8, got '{}'",
                 o.weight_dtype);
    cfg.weight_dtype = o.weight_dtype == "mxfp8" ? DType::kE4M3 : ParseDType(o.weight_dtype);
    cfg.scale_layout = ParseScaleLayout(o.scale_layout);
    cfg.reduce = ParseReduceMode(o.reduce);
    cfg.sr_seed = o.sr_seed;
    cfg.reshard_after_forward = !o.keep_gathered;
    cfg.prefetch = !o.no_prefetch;
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
    ValidateEngineConfig(cfg);  // hyperparameter ranges, before any collective

    const int world_size = WorldSize();
    cfg.so = o.so ? o.so : world_size;
    SSHSDP_CHECK(o.save_every >= 0 && o.keep >= 0, ConfigError,
                 "--save-every and --keep must be >= 0, got {} and {}", o.save_every, o.keep);
    SSHSDP_CHECK(o.save_every == 0 || !o.ckpt_dir.empty(), ConfigError,
                 "--save-every {} needs --ckpt-dir (where to write checkpoints)", o.save_every);
    // --ckpt-dir is written by --save-every and by a stop signal: usable now, not at step N,
    // and held by this job alone (rank 0 locks it; a second job is refused by name).
    std::optional<CheckpointRootLock> ckpt_lock;
    if (!o.ckpt_dir.empty()) {
      PrepareCheckpointRoot(o.ckpt_dir);
      if (WorldRankOrMinusOne() == 0) ckpt_lock.emplace(o.ckpt_dir);
    }
    SSHSDP_CHECK(o.resume.empty() || o.init_weights.empty(), ConfigError,
                 "--resume and --init-weights exclude each other: a checkpoint holds the weights");
    // What a checkpoint must match.
    const nlohmann::json model_json =
        IsMoePreset(o.model) ? MoeModelJson(MakeMoeConfig(o, gc)) : GptModelJson(gc);
    std::string resume_dir;
    std::vector<std::string> resume_notes;
    if (!o.resume.empty()) {
      resume_dir = ResolveCheckpoint(o.resume);  // IoError naming the path when there is none
      const Manifest saved_manifest = ReadManifest(resume_dir);
      // Another model is refused here, before any collective (LoadCheckpoint checks it again,
      // agreed over the ranks). MoE: --weight-dtype mxfp8 splits the groups (expert_group).
      const std::vector<std::string> diffs = JsonDifferences(saved_manifest.meta.model, model_json);
      SSHSDP_CHECK(diffs.empty(), ConfigError,
                   "{}: the checkpoint holds a different model: {}; use the model options "
                   "(and, for MoE, the --weight-dtype) it was saved with",
                   saved_manifest.ManifestPath(), fmt::join(diffs, ", "));
      // The stochastic-rounding stream continues only with the saved seed (draws are keyed
      // by seed, step and element).
      const uint64_t sr_seed = saved_manifest.meta.scalars.value("sr_seed", cfg.sr_seed);
      if (sr_seed != cfg.sr_seed)
        resume_notes.push_back(fmt::format("continuing with the checkpoint's --sr-seed {} (not {})",
                                           sr_seed, cfg.sr_seed));
      cfg.sr_seed = sr_seed;
      if (!o.layout_given) {
        // No layout flags: continue at the saved layout, if it fits this world.
        const CheckpointLayout saved = saved_manifest.layout;
        try {
          Topology fit(world_size, saved.ranks_per_node, saved.sw, saved.sg, saved.so);
        } catch (const LayoutError& e) {
          throw ConfigError(fmt::format(
              "--resume {}: the checkpoint's layout {} does not fit {} ranks ({}); pass "
              "--sw/--sg/--so/--ranks-per-node for this world size (a checkpoint loads at any "
              "valid layout)",
              resume_dir, saved.ToString(), world_size, e.what()));
        }
        cfg.sw = saved.sw, cfg.sg = saved.sg, cfg.so = saved.so;
        cfg.ranks_per_node = saved.ranks_per_node;
      }
    }
    // Validates the layout against the world size (LayoutError names the numbers).
    Topology check(world_size, cfg.ranks_per_node ? cfg.ranks_per_node : world_size, cfg.sw, cfg.sg,
                   cfg.so);
    std::unique_ptr<Model> model_owner = MakeModel(o, gc);  // Gpt or MoeGpt
    Model& model = *model_owner;
    std::map<std::string, std::vector<float>> init;
    if (!o.init_weights.empty())  // names and shapes must be this model's (ConfigError lists)
      init = ReadInitWeights(o.init_weights, ModelTensors(model));

    auto world = MpiCommunicator::World(cfg.ranks_per_node ? cfg.ranks_per_node : world_size);
    const int W = world->size(), rank = world->rank();
    Engine engine(model, *world, cfg);
    // What a checkpoint records about this run.
    auto num = [](float v) { return std::stod(fmt::format("{}", v)); };  // 0.9f -> 0.9
    const nlohmann::json run_json = {{"preset", o.model},
                                     {"seed", o.seed},
                                     {"data", o.data},
                                     {"batch_size", o.batch_size},
                                     {"microbatches", o.microbatches},
                                     {"seq_len", T},
                                     {"weight_dtype", o.weight_dtype},
                                     {"reduce", o.reduce},
                                     {"optimizer", o.optimizer},
                                     {"muon_unit", o.muon_unit},
                                     {"muon_lr", num(o.muon_lr)},
                                     {"muon_momentum", num(o.muon_momentum)},
                                     {"muon_weight_decay", num(o.muon_weight_decay)},
                                     {"lr", num(o.lr)},
                                     {"warmup", o.warmup},
                                     {"beta1", num(o.beta1)},
                                     {"beta2", num(o.beta2)},
                                     {"eps", num(o.eps)},
                                     {"weight_decay", num(o.weight_decay)},
                                     {"clip", num(o.clip)}};
    int64_t start = 0;
    if (!resume_dir.empty()) {
      LoadResult lr = LoadCheckpoint(engine, *world, resume_dir, model_json);  // collective
      // The data position is the loop's step: ahead of the optimizer step by the steps that
      // --on-nonfinite skip left out.
      start = lr.manifest.meta.scalars.value("data_position", lr.manifest.step);
      SSHSDP_CHECK(start >= lr.manifest.step, ConfigError,
                   "{}: data position {} is behind the optimizer step {}",
                   lr.manifest.ManifestPath(), start, lr.manifest.step);
      if (rank == 0) {
        fmt::print("resumed from {} at step {} ({} bytes read on rank 0 in {:.3f} s)\n",
                   lr.manifest.dir, start, lr.bytes_read, lr.seconds);
        for (const std::string& d : JsonDifferences(lr.manifest.meta.run, run_json))
          lr.notes.push_back("run option " + d);
        lr.notes.insert(lr.notes.end(), resume_notes.begin(), resume_notes.end());
        for (const std::string& n : lr.notes) fmt::print("  note: {}\n", n);
        std::fflush(stdout);
      }
    } else if (init.empty()) {
      engine.InitWeights(o.seed);
    } else {
      engine.LoadMainWeights(init);
    }

    // MX weights are dequantized to fp32 for their GEMMs: the fp32 path is their peak.
    const GemmPeak gemm_peak = MeasureJobGemmPeak(
        *world, cfg.weight_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32, o.gemm_peak);
    const double peak = gemm_peak.per_rank;
    std::ofstream metrics;
    if (rank == 0 && !o.metrics.empty()) {
      // A resumed run continues the history it was given instead of erasing it.
      metrics.open(o.metrics, resume_dir.empty() ? std::ios::trunc : std::ios::app);
      SSHSDP_CHECK(metrics.good(), IoError, "--metrics {}: cannot open for writing: {}", o.metrics,
                   std::strerror(errno));
    }
    if (rank == 0) {
      const auto* syn = dynamic_cast<const SyntheticTokens*>(data.get());
      fmt::print(
          "sshsdp train: {} | {} d={} L={} H={} T={} V={} params={:.2f}M | {} | weights {} | "
          "batch {}x{}x{} per rank{}\n"
          "GEMM: {} | {} | CPU ISA {}\n",
          o.model, ModelDescription(o, gc), gc.d_model, gc.n_layer, gc.n_head, T, gc.vocab,
          model.NumParams() / 1e6, engine.topology().ToString(), o.weight_dtype, cfg.microbatches,
          cfg.batch_size, T,
          syn ? fmt::format(" | data: synthetic, optimal loss {:.4f}", syn->OptimalLoss())
              : fmt::format(" | data: {}", o.data),
          gemm_peak.path, gemm_peak.ToString(), kernels::CpuIsaName());
      std::fflush(stdout);
    }
    if (const UpdatePlan* mp = engine.structured_update().plan(OptimizerKind::kMuon);
        mp && rank == 0) {
      // The plan is the same on every rank of a replica: balance and bytes of all its ranks.
      double max_cost = 0, sum_cost = 0;
      uint64_t bytes = 0;
      for (int r : mp->ranks()) {
        max_cost = std::max(max_cost, mp->ExecCost(r));
        sum_cost += mp->ExecCost(r);
        bytes += mp->BytesSent(r);
      }
      fmt::print(
          "optimizer: Muon per {} on {:.1f}% of parameters ({} units, {} split across ranks; "
          "{} P2P bytes per step per replica; Newton-Schulz {:.2f} GFLOP per step, max/mean "
          "over ranks {:.3f}), AdamW for the rest\n",
          o.muon_unit, 100 * engine.structured_update().muon_share(), mp->units().size(),
          mp->num_split(), bytes, sum_cost / 1e9,
          sum_cost > 0 ? max_cost / (sum_cost / mp->ranks().size()) : 1.0);
      std::fflush(stdout);
    }
    const int M = cfg.microbatches, B = cfg.batch_size;
    int64_t cur = 0;
    BatchFn batch = [&](int mb, int32_t* tok, int32_t* tgt) {
      if (rank == fault_rank && cur + 1 == fault_step && mb == 0) {
        if (fault_sleep) {  // a long step (signal tests), not a failure
          std::this_thread::sleep_for(std::chrono::seconds(3));
        } else {
          throw CommError(fmt::format("--fault {}: injected failure on rank {} in step {}", o.fault,
                                      rank, fault_step));
        }
      }
      data->Batch(SampleIndex(cur, mb, M, rank, W, 0, B), B, T, tok, tgt);
    };
    double ema = 0;
    int64_t skipped = 0;  // steps left out under --on-nonfinite skip
    for (cur = start; cur < o.steps; ++cur) {
      float lr = o.lr;
      if (o.warmup > 0 && cur < o.warmup) lr = o.lr * static_cast<float>(cur + 1) / o.warmup;
      engine.SetLearningRate(lr);
      engine.SetMuonLearningRate(o.warmup > 0 && cur < o.warmup
                                     ? o.muon_lr * static_cast<float>(cur + 1) / o.warmup
                                     : o.muon_lr);
      StepStats st = engine.Step(batch);
      // Slowest rank's time and largest memory decide the figures.
      // With them, the signal this rank received (SIGTERM / SIGINT; 0: none), so every rank
      // stops after the same step.
      float local[4] = {static_cast<float>(st.seconds), static_cast<float>(PeakRssMiB()),
                        static_cast<float>(engine.memory().peak_total() / 1048576.0),
                        static_cast<float>(g_stop_signal.load())};
      std::vector<float> all(4 * static_cast<size_t>(W));
      world->AllGather(local, all.data(), 4, DType::kF32);
      float secs = 0, rss = 0, acc = 0;
      int stop_signal = 0;
      for (int r = 0; r < W; ++r) {
        secs = std::max(secs, all[4 * r]);
        rss = std::max(rss, all[4 * r + 1]);
        acc = std::max(acc, all[4 * r + 2]);
        if (all[4 * r + 3] != 0 && stop_signal == 0) stop_signal = static_cast<int>(all[4 * r + 3]);
      }
      const double tps = st.tokens / secs;
      const double mfu = model.FlopsPerToken() * tps / (peak * W);
      if (!st.skipped)
        ema = cur == start || skipped == cur - start ? st.loss : 0.9 * ema + 0.1 * st.loss;
      skipped += st.skipped;
      if (rank == 0) {
        if (st.skipped) {
          fmt::print(
              "step {:>5}/{} | skipped: non-finite loss or gradient norm (loss {}, gradient "
              "norm {}); weights and optimizer state unchanged ({} skipped so far)\n",
              cur + 1, o.steps, st.loss, st.grad_norm, skipped);
          std::fflush(stdout);
        } else if ((cur + 1) % o.log_every == 0 || cur == 0 || cur + 1 == o.steps) {
          fmt::print(
              "step {:>5}/{} | loss {:.4f} (ema {:.4f}) | norm {:.3f} | lr {:.2e} | {:.0f} tok/s | "
              "MFU {} | mem {:.1f} MiB accounted, {:.0f} MiB peak RSS | {:.0f} ms\n",
              cur + 1, o.steps, st.loss, ema, st.grad_norm, lr, tps, FormatMfu(mfu), acc, rss,
              1000 * secs);
          std::fflush(stdout);
        }
        if (metrics.is_open()) {
          nlohmann::json j = {
              {"step", cur + 1},
              {"loss", st.loss},
              {"grad_norm", st.grad_norm},
              {"lr", lr},
              {"step_seconds", secs},
              {"tokens", st.tokens},
              {"tokens_per_s", tps},
              {"mfu", mfu},
              {"peak_rss_mib", rss},
              {"accounted_peak_mib", acc},
              {"runtime_comm_intra_bytes", st.counters.runtime_comm.intra_node_bytes},
              {"runtime_comm_inter_bytes", st.counters.runtime_comm.inter_node_bytes},
              {"update_comm_intra_bytes", st.counters.update_comm.intra_node_bytes},
              {"update_comm_inter_bytes", st.counters.update_comm.inter_node_bytes},
              {"bytes_copied", st.counters.bytes_copied},
              {"add_passes", st.counters.add_passes},
              {"weight_preps", st.counters.weight_preps},
              {"gathers", st.counters.gathers},
              {"update_p2p_bytes", st.counters.update_p2p.total()}};
          if (st.skipped) j["skipped"] = true;
          metrics << j.dump() << "\n";
          metrics.flush();
          SSHSDP_CHECK(metrics.good(), IoError,
                       "--metrics {}: write failed at step {} (disk full?): {}", o.metrics, cur + 1,
                       std::strerror(errno));
        }
      }
      const bool stopping = stop_signal != 0;
      if ((o.save_every > 0 && (cur + 1) % o.save_every == 0) ||
          (stopping && !o.ckpt_dir.empty())) {
        // Never write a state that is not finite (a huge learning rate can make the weights
        // Inf while this step's loss was still finite): the older checkpoints stay.
        SSHSDP_CHECK(engine.StateIsFinite(), NonFiniteError,
                     "step {}: the weights or optimizer state are not finite; checkpoint not "
                     "written (the earlier ones in {} are kept; lower --lr or set --clip)",
                     cur + 1, o.ckpt_dir);
        CheckpointMeta meta{
            model_json,
            run_json,
            // The data position is the loop's step (SampleIndex; the engine's
            // step lags it by skipped steps); the seed fixes the data source
            // and the initial weights. sr_seed + the step fix the bf16sr
            // rounding stream.
            {{"data_position", cur + 1}, {"seed", o.seed}, {"sr_seed", engine.config().sr_seed}}};
        SaveResult s = SaveCheckpoint(engine, *world, o.ckpt_dir, meta, {o.keep, o.ckpt_fault});
        if (rank == 0) {
          fmt::print("saved {} ({} files, {} bytes, {:.3f} s){}\n", s.dir, s.files, s.bytes,
                     s.seconds,
                     s.pruned.empty() ? "" : fmt::format("; pruned {}", fmt::join(s.pruned, ", ")));
          std::fflush(stdout);
        }
      }
      if (stopping) {
        if (rank == 0) {
          fmt::print(stderr, "sshsdp: {} received: stopped after step {}{}; exiting with {}\n",
                     strsignal(stop_signal), cur + 1,
                     o.ckpt_dir.empty() ? " (no --ckpt-dir: nothing saved)"
                                        : fmt::format(", checkpoint saved in {}", o.ckpt_dir),
                     128 + stop_signal);
          std::fflush(stderr);
        }
        return 128 + stop_signal;
      }
    }
    if (!o.save_weights.empty()) {
      SSHSDP_CHECK(engine.StateIsFinite(), NonFiniteError,
                   "the final weights or optimizer state are not finite; --save-weights {} not "
                   "written",
                   o.save_weights);
      auto w = engine.GatherMainWeights();  // collective
      if (rank == 0) {
        std::map<std::string, SafeTensor> t;
        for (const UpdateParam& u : engine.UpdateParams()) t[u.name] = {u.shape, w.at(u.name)};
        WriteSafetensors(o.save_weights, t,
                         {{"format", "sshsdp"},
                          {"model", o.model},
                          {"steps", std::to_string(o.steps)},
                          {"layout", engine.topology().ToString()}});
        fmt::print("wrote {} ({} update parameters)\n", o.save_weights, t.size());
      }
    }
    if (rank == 0) {
      fmt::print("memory per rank (accounted, rank 0):");
      for (const auto& [cat, u] : engine.memory().by_category())
        fmt::print(" {} {:.2f} MiB;", cat, u.peak / 1048576.0);
      fmt::print("\nanalytic (shards + at most two live transient buffers):");
      for (const auto& [cat, bytes] : engine.AnalyticMemory())
        fmt::print(" {} {:.2f} MiB;", cat, bytes / 1048576.0);
      fmt::print("\n");
    }
    return 0;
  });
}

}  // namespace sshsdp
