// `sshsdp train` (see train.h): builds the model, data source and engine, runs the steps,
// prints a progress line on rank 0 and writes metrics as JSON lines.
#include "sshsdp/cli/train.h"

#include <signal.h>
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
#include <regex>
#include <thread>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/cli/ckpt_cli.h"
#include "sshsdp/cli/gemm_peak.h"
#include "sshsdp/cli/launcher.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/cli/node_setup.h"
#include "sshsdp/cli/option_agreement.h"
#include "sshsdp/cli/process_memory.h"
#include "sshsdp/cli/run_config.h"
#include "sshsdp/cli/trace_file.h"
#include "sshsdp/cli/train_backend.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/watchdog.h"
#include "sshsdp/engine/plan.h"
#include "sshsdp/hf/hf_config.h"
#include "sshsdp/hf/hf_weights.h"
#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/gemm_provider.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/parallel.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"
#include "sshsdp/update/lr_schedule.h"

namespace sshsdp {

namespace {

// SIGTERM (what Slurm sends before preemption), SIGINT and SIGUSR1: the first asks the training
// loop to stop after the current step (checkpoint when --ckpt-dir is set, exit 128 + signal); a
// second ends the process at once. SIGUSR1 is the one to send to mpirun: OpenMPI forwards it to
// every rank, where a SIGTERM to mpirun is followed by SIGKILL one second later
// (odls_base_sigkill_timeout), often before the checkpoint is written.
std::atomic<int> g_stop_signal{0};
// Before the first step there is nothing to finish or save: a signal then (also what MPI_Abort
// sends when another rank's start-up check failed) ends the process at once.
std::atomic<bool> g_training{false};

extern "C" void OnStopSignal(int sig) {
  if (!g_training.load()) {
    static const char kEarly[] = "sshsdp: stop signal received before training: exiting\n";
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, kEarly, sizeof(kEarly) - 1);
    _exit(128 + sig);
  }
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
  sigaction(SIGUSR1, &sa, nullptr);
}

// "42 s", "12m05s", "3h07m".
std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

// "a dense GPT", "an MoE", "a Llama-family" of a model JSON's type.
const char* ModelKindName(const std::string& type) {
  return type == "moe-gpt" ? "an MoE" : type == "llama-family" ? "a Llama-family" : "a dense GPT";
}

}  // namespace

int RunTrain(int argc, char** argv, const TrainOptions& o) {
  return RunMpiMain(argc, argv, [&]() -> int {
    // Everything below that can be wrong with the input is checked before any collective
    // (but this one, which compares the ranks' options).
    const std::string launch_note = CheckLauncher(WorldSize(), ::getenv);  // torchrun, srun
    // --backend cuda:N may differ per rank (an MPMD launch spreading ranks over GPUs).
    AgreeOnOptions(std::regex_replace(o.recorded_config, std::regex(R"(backend="cuda:\d+")"),
                                      R"(backend="cuda")"),
                   "sshsdp train");
    const int T = o.seq_len ? o.seq_len : MakeGptConfig(o, 256).seq_len;
    SSHSDP_CHECK(o.vocab_size >= 0 && o.vocab_size <= kMaxTokenFileVocab, ConfigError,
                 "--vocab-size must lie in 1..{} (0: from the data), got {}", kMaxTokenFileVocab,
                 o.vocab_size);
    // The vocabulary comes from the data (or --vocab-size); bytes for the built-in source.
    // A Hugging Face config fixes it: every token of the data must lie below.
    const int model_vocab = ModelVocab(o);
    SSHSDP_CHECK(!model_vocab || !o.vocab_size || o.vocab_size == model_vocab, ConfigError,
                 "--vocab-size {} differs from the vocab_size {} of the model's config.json; "
                 "leave --vocab-size out",
                 o.vocab_size, model_vocab);
    const int vocab = o.vocab_size ? o.vocab_size : model_vocab;
    std::unique_ptr<TokenSource> data, val;
    if (o.data == "synthetic")
      data = std::make_unique<SyntheticTokens>(vocab ? vocab : 256, o.seed);
    else
      data = std::make_unique<TokenFile>(o.data, vocab, T, o.seed);
    const GptConfig gc = MakeGptConfig(o, data->vocab());
    SSHSDP_CHECK(o.eval_every >= 0 && o.eval_tokens >= 1, ConfigError,
                 "--eval-every must be >= 0 and --eval-tokens >= 1, got {} and {}", o.eval_every,
                 o.eval_tokens);
    SSHSDP_CHECK(o.val_data.empty() || o.eval_every > 0, ConfigError,
                 "--val-data {} is read only with --eval-every N (validation every N steps)",
                 o.val_data);
    if (!o.val_data.empty()) {
      SSHSDP_CHECK(!std::filesystem::is_directory(o.val_data), ConfigError,
                   "--val-data {}: is a directory; --val-data takes a token file (the format of "
                   "--data)",
                   o.val_data);
      // The same vocabulary as the training data: a token beyond it is refused by name.
      val = std::make_unique<TokenFile>(o.val_data, data->vocab(), T, o.seed + 1);
    }
    SSHSDP_CHECK(o.eval_every == 0 || val || o.data == "synthetic", ConfigError,
                 "--eval-every {} needs --val-data FILE (a held-out token file) when training on "
                 "{}",
                 o.eval_every, o.data);
    SSHSDP_CHECK(o.steps >= 0, ConfigError, "--steps must be >= 0, got {}", o.steps);
    SSHSDP_CHECK(o.log_every >= 1, ConfigError, "--log-every must be >= 1, got {}", o.log_every);
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
      CheckWritableOutput("--metrics", o.metrics, /*renamed_into_place=*/false);  // appended
      CheckWritableOutput("--trace", o.trace);
      const std::vector<NamedPath> outputs = {
          {"--save-weights", o.save_weights}, {"--metrics", o.metrics}, {"--trace", o.trace}};
      CheckOutputsDistinct(outputs,
                           {{"--data", o.data == "synthetic" ? "" : o.data},
                            {"--val-data", o.val_data},
                            {"--init-weights", o.init_weights},
                            {"--init-from-hf",
                             o.init_from_hf.empty() ? "" : o.init_from_hf + "/model.safetensors"}});
      CheckOutputsOutsideCheckpoints(outputs, {{"--ckpt-dir", o.ckpt_dir}, {"--resume", o.resume}});
    }
    const TraceWindow trace_window = ParseTraceSteps(o.trace_steps);  // ConfigError if malformed
    if (!o.trace.empty() && trace_window.first > o.steps && WorldRankOrMinusOne() == 0)
      fmt::print(
          "note: --trace-steps {} starts after the last step (--steps {}): --trace {} will "
          "hold no step\n",
          o.trace_steps, o.steps, o.trace);
    Tracer tracer;
    SSHSDP_CHECK(std::isfinite(o.gemm_peak) && o.gemm_peak >= 0, ConfigError,
                 "--gemm-peak must be a GFLOP/s figure per rank >= 0 (0: measure), got {}",
                 o.gemm_peak);
    // A bad or unloadable SSHSDP_GEMM fails here, before any collective; so do, where bf16
    // GEMMs and the bf16 attention run (bf16 weights, the bf16 parts of mxfp8 runs), a bad
    // SSHSDP_BF16_GEMM, SSHSDP_BF16_GEMM_KERNEL or SSHSDP_BF16_ATTENTION_PRODUCTS.
    kernels::ActiveGemmProvider();
    if (o.weight_dtype != "fp32") {
      kernels::ActiveBf16GemmPath();
      kernels::ActiveBf16GemmKernel();
      kernels::ActiveBf16AttentionProducts();
    }
    EngineConfig cfg = EngineConfigOf(o, WorldSize(), T);
    if (!o.trace.empty()) cfg.tracer = &tracer;
    ValidateEngineConfig(cfg);  // hyperparameter ranges, before any collective
    LrSchedule schedule;
    schedule.kind = LrSchedule::Parse(o.lr_schedule);
    schedule.warmup = o.warmup;
    schedule.total = o.steps;
    schedule.decay = o.decay_steps;
    const float lr_min = o.lr_min < 0 ? o.lr / 10 : o.lr_min;
    SSHSDP_CHECK(lr_min <= o.lr, ConfigError, "--lr-min {} exceeds --lr {}", lr_min, o.lr);
    schedule.min_ratio = o.lr > 0 ? lr_min / o.lr : 0.0;
    schedule.Validate();
    if (o.warmup > o.steps && WorldRankOrMinusOne() == 0)
      fmt::print(
          "note: --warmup {} is longer than --steps {}: the learning rate ends at {:.3g} of "
          "--lr (warm-up ramps it over {} steps)\n",
          o.warmup, o.steps, schedule.Factor(std::max<int64_t>(o.steps - 1, 0)), o.warmup);

    const int world_size = WorldSize();
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
    SSHSDP_CHECK(o.init_weights.empty() || o.init_from_hf.empty(), ConfigError,
                 "--init-weights and --init-from-hf exclude each other: each gives the initial "
                 "weights (use --model-config with --init-weights for a config.json's shape)");
    // What a checkpoint must match.
    const nlohmann::json model_json = IsLlamaFamily(o)       ? LlamaRunJson(o, gc.vocab)
                                      : IsMoePreset(o.model) ? MoeModelJson(MakeMoeConfig(o, gc))
                                                             : GptModelJson(gc);
    std::string resume_dir;
    std::vector<std::string> resume_notes;
    if (!o.resume.empty()) {
      resume_dir = ResolveCheckpoint(o.resume);  // IoError naming the path when there is none
      const Manifest saved_manifest = ReadManifest(resume_dir);
      // Another data source would continue on data the run never saw at a position that
      // means nothing there: refused unless asked for.
      const std::string saved_data = saved_manifest.meta.run.value("data", o.data);
      SSHSDP_CHECK(saved_data == o.data || o.allow_data_change, ConfigError,
                   "--resume {}: the checkpoint trained on --data {}, this run names --data {}; "
                   "leave --data out to continue on the same data, or pass --allow-data-change",
                   resume_dir, saved_data, o.data);
      // Another model is refused here, before any collective (LoadCheckpoint checks it again,
      // agreed over the ranks). MoE: --weight-dtype mxfp8 splits the groups (expert_group).
      // A dense checkpoint for an MoE run (or the reverse) is named as such, not by the keys
      // only one of them has.
      const std::string saved_type = saved_manifest.meta.model.value("type", std::string("gpt"));
      const std::string this_type = model_json.value("type", std::string("gpt"));
      SSHSDP_CHECK(saved_type == this_type, ConfigError,
                   "{}: the checkpoint holds {} model, this run is {} one; use a --model of "
                   "the checkpoint's kind (and its model options)",
                   saved_manifest.ManifestPath(), ModelKindName(saved_type),
                   ModelKindName(this_type));
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
        // No --sw/--sg/--so: continue at the saved degrees, if they fit this world — on the
        // nodes --ranks-per-node describes when given (the machine may differ), else the saved.
        const CheckpointLayout saved = saved_manifest.layout;
        if (o.ranks_per_node_given) CheckRanksPerNode(o.ranks_per_node, world_size);
        const int rpn = o.ranks_per_node_given ? o.ranks_per_node : saved.ranks_per_node;
        try {
          Topology fit(world_size, rpn ? rpn : world_size, saved.sw, saved.sg, saved.so);
        } catch (const LayoutError& e) {
          throw ConfigError(fmt::format(
              "--resume {}: the checkpoint's layout {} does not fit {} ranks ({}); pass "
              "--sw/--sg/--so/--ranks-per-node for this world size (a checkpoint loads at any "
              "valid layout)",
              resume_dir, saved.ToString(), world_size, e.what()));
        }
        cfg.sw = saved.sw, cfg.sg = saved.sg, cfg.so = saved.so;
        cfg.ranks_per_node = rpn;
      }
    }
    // Validates the layout against the world size (LayoutError names the numbers).
    if (o.layout_given || resume_dir.empty()) {  // the flags' layout (a resume's was checked)
      CheckResolvedLayout(o.sw, o.sg, o.so, world_size, cfg.ranks_per_node);
    } else {
      Topology check(world_size, cfg.ranks_per_node ? cfg.ranks_per_node : world_size, cfg.sw,
                     cfg.sg, cfg.so);
    }
    // --backend: the engine on a device backend, at the final layout (a resume's included; what
    // it does not run is refused by name, before any collective).
    const DeviceRun dev = MakeDeviceRun(o, &cfg);
    std::unique_ptr<Model> model_owner = MakeRunModel(o, gc, dev);  // Gpt or MoeGpt
    Model& model = *model_owner;
    std::map<std::string, std::vector<float>> init;
    if (!o.init_weights.empty())  // names and shapes must be this model's (ConfigError lists)
      init = ReadInitWeights(o.init_weights, ModelTensors(model));
    // A Hugging Face checkpoint: its headers checked here, on every rank alike; each rank reads
    // only the elements its shards hold, below. A resume's weights are its own.
    std::optional<HfWeights> hf;
    if (!o.init_from_hf.empty() && resume_dir.empty())
      hf.emplace(o.init_from_hf, MakeLlamaConfig(o, gc.vocab));

    auto world = MpiCommunicator::World(cfg.ranks_per_node ? cfg.ranks_per_node : world_size);
    const int W = world->size(), rank = world->rank();
    // Before any kernel runs (the engine's initialisation casts): threads per rank; and a
    // model too large for the node's memory is refused before anything is allocated (not on a
    // device backend, whose state lives in device memory).
    const NodeSetup node = SetUpNode(static_cast<double>(model.NumParams()), W,
                                     !dev.backend || dev.backend->host_memory());
    const kernels::KernelThreadChoice& threads = node.threads;
    if (!dev.backend || dev.backend->host_memory()) {
      // A lower bound of any preset's activations: the residual stream and the logits twice.
      const double tokens = static_cast<double>(cfg.batch_size) * T;
      CheckActivationsFitNode(
          4.0 * tokens * ((gc.n_layer + 1.0) * gc.d_model + 2.0 * gc.padded_vocab()),
          node.local_ranks, fmt::format("{} x {} tokens", cfg.batch_size, T));
    }
    Engine engine(model, *world, cfg);
    const int M = cfg.microbatches, B = cfg.batch_size;
    if (rank == 0 && !launch_note.empty()) fmt::print("note: {}\n", launch_note);
    if (rank == 0) {
      const Topology& t = engine.topology();
      const bool outer = t.sw() != W || t.sg() != W || t.so() != W;
      for (const std::string& n : UnusedOptionNotes(o, outer)) fmt::print("note: {}\n", n);
    }
    // What a checkpoint records about this run.
    auto num = [](float v) { return std::stod(fmt::format("{}", v)); };  // 0.9f -> 0.9
    nlohmann::json run_json = {{"preset", o.model},
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
                               {"clip", num(o.clip)},
                               {"lr_schedule", o.lr_schedule},
                               {"lr_min", num(lr_min)},
                               {"steps", o.steps},
                               {"vocab", gc.vocab},
                               {"config", o.recorded_config}};
    // The tokenizer of --init-from-hf's directory, if it has one: generate uses it.
    const std::string tokenizer = HfTokenizerPath(o.init_from_hf);
    if (!tokenizer.empty()) run_json["tokenizer"] = tokenizer;
    const auto notes_of = [](nlohmann::json j) {  // the record itself is not a difference
      j.erase("config");
      return j;
    };
    int64_t start = 0;
    // Global samples read before this run's first step: a resume continues from the sample
    // it stopped at, whatever its world size, batch size or microbatches are now.
    int64_t first_sample = 0;
    if (!resume_dir.empty()) {
      LoadResult lr = LoadCheckpoint(engine, *world, resume_dir, model_json);  // collective
      // The data position is the loop's step: ahead of the optimizer step by the steps that
      // --on-nonfinite skip left out.
      start = lr.manifest.meta.scalars.value("data_position", lr.manifest.step);
      SSHSDP_CHECK(start >= lr.manifest.step, ConfigError,
                   "{}: data position {} is behind the optimizer step {}",
                   lr.manifest.ManifestPath(), start, lr.manifest.step);
      // Checkpoints before the sample count existed: their steps all had the saved shape.
      const int64_t saved_samples_per_step =
          static_cast<int64_t>(lr.manifest.meta.run.value("microbatches", 1)) *
          lr.manifest.meta.run.value("batch_size", 1) * lr.manifest.layout.world;
      first_sample = lr.manifest.meta.scalars.value("data_samples", start * saved_samples_per_step);
      if (rank == 0) {
        fmt::print("resumed from {} at step {} ({} bytes read on rank 0 in {:.3f} s)\n",
                   lr.manifest.dir, start, lr.bytes_read, lr.seconds);
        for (const std::string& d :
             JsonDifferences(notes_of(lr.manifest.meta.run), notes_of(run_json)))
          lr.notes.push_back("run option " + d);
        lr.notes.insert(lr.notes.end(), resume_notes.begin(), resume_notes.end());
        if (!o.restored.empty())
          lr.notes.push_back(
              fmt::format("options from the checkpoint: {}", fmt::join(o.restored, " ")));
        if (first_sample != start * static_cast<int64_t>(M * W * B))
          lr.notes.push_back(fmt::format("continuing at global sample {} ({} samples per step now)",
                                         first_sample, M * W * B));
        if (start >= o.steps)
          lr.notes.push_back(fmt::format(
              "the checkpoint is at step {} and --steps is {}: nothing to train (pass a larger "
              "--steps to continue)",
              start, o.steps));
        for (const std::string& n : lr.notes) fmt::print("  note: {}\n", n);
        std::fflush(stdout);
      }
    } else if (hf) {
      engine.LoadMainWeights([&](const std::string& name, size_t begin, size_t n, float* out) {
        hf->Read(name, begin, n, out);
      });
    } else if (init.empty()) {
      engine.InitWeights(o.seed);
    } else {
      engine.LoadMainWeights(init);
    }

    // MX weights are dequantized to fp32 for their GEMMs: the fp32 path is their peak. On a
    // backend: its GEMM of the weights' dtype, or bf16 with --mx-gemm bf16.
    const DType backend_gemm = o.mx_gemm == "bf16" ? DType::kBF16 : cfg.weight_dtype;
    GemmPeak gemm_peak =
        dev.backend ? MeasureBackendGemmPeak(*world, *dev.backend, backend_gemm, o.gemm_peak, 9,
                                             dev.backend->host_memory() ? 1024 : 4096)
                    : MeasureJobGemmPeak(*world,
                                         cfg.weight_dtype == DType::kBF16 || o.mx_gemm == "bf16"
                                             ? DType::kBF16
                                             : DType::kF32,
                                         o.gemm_peak);
    if (cfg.weight_dtype == DType::kE4M3) {  // the header names both paths
      gemm_peak.path = fmt::format(
          "MXFP8 weights dequantized to {} (the peak's path): {}; groups kept in bf16: {}",
          o.mx_gemm, gemm_peak.path,
          dev.backend ? std::string("the backend's bf16 GEMM")
                      : kernels::GemmPathDescription(DType::kBF16));
    }
    const double peak = gemm_peak.per_rank;
    std::ofstream metrics;
    if (rank == 0 && !o.metrics.empty()) {
      // A resumed run continues the history it was given instead of erasing it.
      metrics.open(o.metrics, resume_dir.empty() ? std::ios::trunc : std::ios::app);
      SSHSDP_CHECK(metrics.good(), IoError, "--metrics {}: cannot open for writing: {}", o.metrics,
                   std::strerror(errno));
    }
    if (!threads.warning.empty()) {
      fmt::print(stderr, "sshsdp train: rank {}: warning: {}\n", rank, threads.warning);
    }
    if (rank == 0) {
      const auto* syn = dynamic_cast<const SyntheticTokens*>(data.get());
      fmt::print(
          "sshsdp train: {} | {} d={} L={} H={} T={} V={}{} params={:.2f}M | {} | weights {} | "
          "batch {}x{}x{} per rank{}{}\n"
          "GEMM: {} | {} | CPU ISA {} | attention {} | threads {}\n",
          ModelName(o), ModelDescription(o, gc), gc.d_model, gc.n_layer, gc.n_head, T, gc.vocab,
          gc.padded_vocab() != gc.vocab ? fmt::format(" (tables padded to {})", gc.padded_vocab())
                                        : "",
          model.NumParams() / 1e6,
          engine.topology().ToString() + (o.layout_given ? ""
                                          : resume_dir.empty()
                                              ? " (fully sharded: no --sw/--sg/--so given)"
                                              : " (the checkpoint's layout)"),
          o.weight_dtype, cfg.microbatches, cfg.batch_size, T,
          syn ? fmt::format(" | data: synthetic, optimal loss {:.4f}", syn->OptimalLoss())
              : fmt::format(" | data: {}", o.data),
          dev.backend ? fmt::format(" | backend {}", dev.backend->name()) : "", gemm_peak.path,
          gemm_peak.ToString(), kernels::CpuIsaName(),
          kernels::AttentionPathDescription(
              RunsBf16Attention(o.model, o.weight_dtype, o.attention_dtype) &&
              (!dev.backend || dev.backend->Has(BackendFeature::kBf16Attention))),
          threads.description);
      for (const std::string& n : dev.notes) fmt::print("note: {}\n", n);
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
          "{} P2P bytes per step per replica; planned Newton-Schulz {:.2f} GFLOP per step, "
          "max/mean over ranks {:.3f}), AdamW for the rest\n",
          o.muon_unit, 100 * engine.structured_update().muon_share(), mp->units().size(),
          mp->num_split(), bytes, sum_cost / 1e9,
          sum_cost > 0 ? max_cost / (sum_cost / mp->ranks().size()) : 1.0);
      std::fflush(stdout);
    }
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
      data->Batch(first_sample + SampleIndex(cur - start, mb, M, rank, W, 0, B), B, T, tok, tgt);
    };
    // Validation: the same samples every time — of --val-data, or of the synthetic source far
    // beyond any training index.
    const int64_t val_step_tokens = int64_t{W} * B * T;
    int val_batches = static_cast<int>(
        std::min<int64_t>(1 << 20, (o.eval_tokens + val_step_tokens - 1) / val_step_tokens));
    if (const auto* file = dynamic_cast<const TokenFile*>(val.get());
        file != nullptr && o.eval_every > 0) {
      // More than the file holds would only repeat its samples: at most one pass over it.
      const int64_t cap = std::max<int64_t>(1, file->num_tokens() / val_step_tokens);
      if (val_batches > cap) {
        if (rank == 0)
          fmt::print(
              "note: --eval-tokens {} exceeds --val-data's {} tokens: validating on {} "
              "({} batches of {} x {} x {} tokens)\n",
              o.eval_tokens, file->num_tokens(), cap * val_step_tokens, cap, W, B, T);
        val_batches = static_cast<int>(cap);
      }
    }
    // Held-out samples of the training source (no --val-data) are unlimited: a fixed budget.
    if (!val && o.eval_every > 0) {
      constexpr int64_t kHeldOutTokens = int64_t{1} << 22;
      const int64_t cap = std::max<int64_t>(1, kHeldOutTokens / val_step_tokens);
      if (val_batches > cap) {
        if (rank == 0)
          fmt::print(
              "note: --eval-tokens {} exceeds the {} tokens validated on held-out samples of the "
              "training source (no --val-data): validating on {} ({} batches of {} x {} x {} "
              "tokens)\n",
              o.eval_tokens, kHeldOutTokens, cap * val_step_tokens, cap, W, B, T);
        val_batches = static_cast<int>(cap);
      }
    }
    const TokenSource& val_source = val ? *val : *data;
    const int64_t val_base = val ? 0 : int64_t{1} << 40;
    BatchFn val_batch = [&](int i, int32_t* tok, int32_t* tgt) {
      val_source.Batch(val_base + SampleIndex(0, i, val_batches, rank, W, 0, B), B, T, tok, tgt);
    };
    if (cfg.tracer) StartTrace(tracer, *world);  // aligned clocks (collective)
    const auto loop_t0 = std::chrono::steady_clock::now();
    double ema = 0;
    int64_t skipped = 0;  // steps left out under --on-nonfinite skip
    g_training.store(true);
    for (cur = start; cur < o.steps; ++cur) {
      const double factor = schedule.Factor(cur);
      const float lr = static_cast<float>(o.lr * factor);
      engine.SetLearningRate(lr);
      engine.SetMuonLearningRate(static_cast<float>(o.muon_lr * factor));
      tracer.Enable(cfg.tracer && trace_window.Contains(cur + 1));
      StepStats st = engine.Step(batch);
      double val_loss = std::nan("");
      double val_seconds = 0;
      if (o.eval_every > 0 && ((cur + 1) % o.eval_every == 0 || cur + 1 == o.steps)) {
        const auto v0 = std::chrono::steady_clock::now();
        val_loss = engine.Evaluate(val_batch, val_batches);  // collective
        val_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - v0).count();
      }
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
        } else if ((cur + 1) % o.log_every == 0 || cur == 0 || cur + 1 == o.steps ||
                   !std::isnan(val_loss)) {
          const double elapsed =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_t0).count();
          const double eta = elapsed / static_cast<double>(cur + 1 - start) *
                             static_cast<double>(o.steps - cur - 1);
          fmt::print(
              "step {:>5}/{} | loss {:.4f} (ema {:.4f}){} | norm {:.3f} | lr {:.2e} | {:.0f} tok/s "
              "| MFU {} | mem {:.1f} MiB accounted, {:.0f} MiB peak RSS | {:.0f} ms | elapsed {} "
              "ETA {}\n",
              cur + 1, o.steps, st.loss, ema,
              std::isnan(val_loss) ? ""
                                   : fmt::format(" | val {:.4f} ({:.1f} s)", val_loss, val_seconds),
              st.grad_norm, lr, tps, FormatMfu(mfu, gemm_peak.pinned), acc, rss, 1000 * secs,
              FormatDuration(elapsed), FormatDuration(eta));
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
              {"collective_copy_bytes", st.counters.collective_copy_bytes},
              {"add_passes", st.counters.add_passes},
              {"weight_preps", st.counters.weight_preps},
              {"gathers", st.counters.gathers},
              {"outer_overlapped", st.counters.outer_overlapped},
              {"update_p2p_bytes", st.counters.update_p2p.total()},
              {"staged_bytes", st.counters.staged_bytes},
              {"backend_events", st.counters.backend_events},
              {"backend_waits", st.counters.backend_waits}};
          if (st.skipped) j["skipped"] = true;
          if (!std::isnan(val_loss)) j["val_loss"] = val_loss;
          metrics << j.dump() << "\n";
          metrics.flush();
          SSHSDP_CHECK(metrics.good(), IoError,
                       "--metrics {}: write failed at step {} (disk full?): {}", o.metrics, cur + 1,
                       std::strerror(errno));
        }
      }
      const bool stopping = stop_signal != 0;
      // Every --save-every steps, on a stop signal, and after the last step (as TorchTitan
      // does: a --ckpt-dir without --save-every, or one not dividing --steps, still ends with
      // the final state saved).
      if ((o.save_every > 0 && (cur + 1) % o.save_every == 0) ||
          (!o.ckpt_dir.empty() && (stopping || cur + 1 == o.steps))) {
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
            {{"data_position", cur + 1},
             {"data_samples", first_sample + (cur + 1 - start) * int64_t{M} * W * B},
             {"seed", o.seed},
             {"sr_seed", engine.config().sr_seed}}};
        // A validation loss of this very step: pruning keeps the best such checkpoint.
        if (!std::isnan(val_loss)) meta.scalars["val_loss"] = val_loss;
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
    if (cfg.tracer) {
      tracer.Enable(false);
      std::vector<std::string> rows;
      for (int r = 0; r < W; ++r) rows.push_back(fmt::format("rank {}", r));
      WriteTraceFile(tracer, *world, o.trace, rows);  // collective
      if (rank == 0)
        fmt::print("wrote {} (steps {}-{}; {} spans on rank 0)\n", o.trace, trace_window.first,
                   std::min<int64_t>(trace_window.last, o.steps), tracer.size());
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
                          {"preset", o.model},
                          {"model", model_json.dump()},
                          {"steps", std::to_string(o.steps)},
                          {"layout", engine.topology().ToString()},
                          {"tokenizer", tokenizer}});
        fmt::print("wrote {} ({} update parameters)\n", o.save_weights, t.size());
      }
    }
    if (rank == 0) {
      fmt::print("memory per rank (accounted, rank 0):");
      for (const auto& [cat, u] : engine.memory().by_category())
        fmt::print(" {} {:.2f} MiB;", cat, u.peak / 1048576.0);
      // What `sshsdp plan` predicted for this rank (the same construction code, run without
      // communicators; activations are the model's own and not planned).
      if (cfg.comm_path == CommPath::kCollective) {
        try {  // a report only: the run has finished, whatever happens here
          const RunPlan plan = PlanRun(model, W, cfg);
          fmt::print("\nplanned (sshsdp plan, rank 0):");
          for (const auto& [cat, bytes] : plan.ranks[0].memory)
            fmt::print(" {} {:.2f} MiB;", cat, bytes / 1048576.0);
        } catch (const Error& e) {
          fmt::print("\nno plan of this run: {}", e.what());
        }
      }
      fmt::print("\n");
    }
    return 0;
  });
}

}  // namespace sshsdp
