// `sshsdp train` (see train.h): options checked before any collective, the model, data source
// and engine built, the initial state loaded, then the loop of train_loop.cc.
//
// RunTrain reads as the run's plan: CheckInputs (everything a user can get wrong, on every
// rank, before the first collective but the option agreement), CheckResume (a checkpoint's
// model, data and layout), then the engine, LoadInitialState, the header, RunTrainLoop.
#include "sshsdp/cli/train.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/cli/ckpt_cli.h"
#include "sshsdp/cli/launcher.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/cli/node_setup.h"
#include "sshsdp/cli/option_agreement.h"
#include "sshsdp/cli/process_memory.h"
#include "sshsdp/cli/run_config.h"
#include "sshsdp/cli/stop_signal.h"
#include "sshsdp/cli/train_backend.h"
#include "sshsdp/cli/train_internal.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/watchdog.h"
#include "sshsdp/hf/hf_config.h"
#include "sshsdp/hf/hf_weights.h"
#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/gemm_provider.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

namespace {

// "a dense GPT", "an MoE", "a Llama-family" of a model JSON's type.
const char* ModelKindName(const std::string& type) {
  return type == "moe-gpt" ? "an MoE" : type == "llama-family" ? "a Llama-family" : "a dense GPT";
}

// The training and validation sources: the vocabulary comes from the data (or --vocab-size),
// bytes for the built-in source; a Hugging Face config fixes it, every token below it.
void OpenData(TrainRun& run) {
  const TrainOptions& o = run.o;
  SSHSDP_CHECK(o.vocab_size >= 0 && o.vocab_size <= kMaxTokenFileVocab, ConfigError,
               "--vocab-size must lie in 1..{} (0: from the data), got {}", kMaxTokenFileVocab,
               o.vocab_size);
  const int model_vocab = ModelVocab(o);
  SSHSDP_CHECK(!model_vocab || !o.vocab_size || o.vocab_size == model_vocab, ConfigError,
               "--vocab-size {} differs from the vocab_size {} of the model's config.json; "
               "leave --vocab-size out",
               o.vocab_size, model_vocab);
  const int vocab = o.vocab_size ? o.vocab_size : model_vocab;
  if (o.data == "synthetic")
    run.data = std::make_unique<SyntheticTokens>(vocab ? vocab : 256, o.seed);
  else
    run.data = std::make_unique<TokenFile>(o.data, vocab, run.T, o.seed);
  run.gc = MakeGptConfig(o, run.data->vocab());
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
    run.val = std::make_unique<TokenFile>(o.val_data, run.data->vocab(), run.T, o.seed + 1);
  }
  SSHSDP_CHECK(o.eval_every == 0 || run.val || o.data == "synthetic", ConfigError,
               "--eval-every {} needs --val-data FILE (a held-out token file) when training on {}",
               o.eval_every, o.data);
}

// Files rank 0 writes: their directories must exist and be writable now, not at the end, and
// none may be an input or inside a checkpoint tree.
void CheckOutputs(const TrainOptions& o) {
  if (WorldRankOrMinusOne() != 0) return;
  CheckWritableOutput("--save-weights", o.save_weights);
  CheckWritableOutput("--metrics", o.metrics, /*renamed_into_place=*/false);  // appended
  CheckWritableOutput("--trace", o.trace);
  const std::vector<NamedPath> outputs = {
      {"--save-weights", o.save_weights}, {"--metrics", o.metrics}, {"--trace", o.trace}};
  CheckOutputsDistinct(outputs, {{"--data", o.data == "synthetic" ? "" : o.data},
                                 {"--val-data", o.val_data},
                                 {"--init-weights", o.init_weights},
                                 {"--config", o.config},
                                 {"--model-config", o.model_config}});
  CheckOutputsOutsideInputDirs(outputs, {{"--init-from-hf", o.init_from_hf}});
  CheckOutputsOutsideCheckpoints(outputs, {{"--ckpt-dir", o.ckpt_dir}, {"--resume", o.resume}});
}

// The learning-rate schedule and its floor.
void MakeSchedule(TrainRun& run) {
  const TrainOptions& o = run.o;
  LrSchedule& s = run.schedule;
  s.kind = LrSchedule::Parse(o.lr_schedule);
  s.warmup = o.warmup;
  s.total = o.steps;
  s.decay = o.decay_steps;
  run.lr_min = o.lr_min < 0 ? o.lr / 10 : o.lr_min;
  SSHSDP_CHECK(run.lr_min <= o.lr, ConfigError, "--lr-min {} exceeds --lr {}", run.lr_min, o.lr);
  s.min_ratio = o.lr > 0 ? run.lr_min / o.lr : 0.0;
  s.Validate();
  if (o.warmup > o.steps && WorldRankOrMinusOne() == 0)
    fmt::print(
        "note: --warmup {} is longer than --steps {}: the learning rate ends at {:.3g} of "
        "--lr (warm-up ramps it over {} steps)\n",
        o.warmup, o.steps, s.Factor(std::max<int64_t>(o.steps - 1, 0)), o.warmup);
}

// A bad or unloadable SSHSDP_GEMM fails here, before any collective; so do, where bf16 GEMMs
// and the bf16 attention run (bf16 weights, the bf16 parts of mxfp8 runs), a bad
// SSHSDP_BF16_GEMM, SSHSDP_BF16_GEMM_KERNEL or SSHSDP_BF16_ATTENTION_PRODUCTS.
void CheckKernelChoices(const TrainOptions& o) {
  kernels::ActiveGemmProvider();
  if (o.weight_dtype != "fp32") {
    kernels::ActiveBf16GemmPath();
    kernels::ActiveBf16GemmKernel();
    kernels::ActiveBf16AttentionProducts();
  }
}

// --ckpt-dir is written by --save-every and by a stop signal: usable now, not at step N, and
// held by this job alone (rank 0 locks it; a second job is refused by name).
void CheckCheckpointOptions(TrainRun& run) {
  const TrainOptions& o = run.o;
  SSHSDP_CHECK(o.save_every >= 0 && o.keep >= 0, ConfigError,
               "--save-every and --keep must be >= 0, got {} and {}", o.save_every, o.keep);
  SSHSDP_CHECK(o.save_every == 0 || !o.ckpt_dir.empty(), ConfigError,
               "--save-every {} needs --ckpt-dir (where to write checkpoints)", o.save_every);
  if (!o.ckpt_dir.empty()) {
    PrepareCheckpointRoot(o.ckpt_dir);
    if (WorldRankOrMinusOne() == 0) run.ckpt_lock.emplace(o.ckpt_dir);
  }
  SSHSDP_CHECK(o.resume.empty() || o.init_weights.empty(), ConfigError,
               "--resume and --init-weights exclude each other: a checkpoint holds the weights");
  SSHSDP_CHECK(o.init_weights.empty() || o.init_from_hf.empty(), ConfigError,
               "--init-weights and --init-from-hf exclude each other: each gives the initial "
               "weights (use --model-config with --init-weights for a config.json's shape)");
}

// Everything of the options and inputs that can be wrong, before any collective (but
// AgreeOnOptions, which compares the ranks' options).
void CheckInputs(TrainRun& run) {
  const TrainOptions& o = run.o;
  // --backend cuda:N may differ per rank (an MPMD launch spreading ranks over GPUs).
  AgreeOnOptions(std::regex_replace(o.recorded_config, std::regex(R"(backend="cuda:\d+")"),
                                    R"(backend="cuda")"),
                 "sshsdp train");
  run.T = o.seq_len ? o.seq_len : MakeGptConfig(o, 256).seq_len;
  OpenData(run);
  SSHSDP_CHECK(o.steps >= 0, ConfigError, "--steps must be >= 0, got {}", o.steps);
  SSHSDP_CHECK(o.log_every >= 1, ConfigError, "--log-every must be >= 1, got {}", o.log_every);
  SetCommTimeout(o.comm_timeout);  // ConfigError for a bad value; watches every wait below
  InstallStopHandlers();
  run.fault = ParseFault(o.fault);
  CheckOutputs(o);
  run.trace_window = ParseTraceSteps(o.trace_steps);  // ConfigError if malformed
  if (o.trace.empty() && o.trace_steps != TrainOptions{}.trace_steps && WorldRankOrMinusOne() == 0)
    fmt::print("note: --trace-steps {} has no effect without --trace FILE\n", o.trace_steps);
  if (!o.trace.empty() && run.trace_window.first > o.steps && WorldRankOrMinusOne() == 0)
    fmt::print(
        "note: --trace-steps {} starts after the last step (--steps {}): --trace {} will hold "
        "no step\n",
        o.trace_steps, o.steps, o.trace);
  SSHSDP_CHECK(std::isfinite(o.gemm_peak) && o.gemm_peak >= 0, ConfigError,
               "--gemm-peak must be a GFLOP/s figure per rank >= 0 (0: measure), got {}",
               o.gemm_peak);
  CheckKernelChoices(o);
  run.cfg = EngineConfigOf(o, WorldSize(), run.T);
  if (!o.trace.empty()) run.cfg.tracer = &run.tracer;
  ValidateEngineConfig(run.cfg);  // hyperparameter ranges, before any collective
  MakeSchedule(run);
  CheckCheckpointOptions(run);
  run.model_json = IsLlamaFamily(o)       ? LlamaRunJson(o, run.gc.vocab)
                   : IsMoePreset(o.model) ? MoeModelJson(MakeMoeConfig(o, run.gc))
                                          : GptModelJson(run.gc);
}

// No --sw/--sg/--so: continue at the saved degrees, if they fit this world — on the nodes
// --ranks-per-node describes when given (the machine may differ), else the saved ones.
void AdoptSavedLayout(const TrainRun& run, const CheckpointLayout& saved, int world_size,
                      EngineConfig* cfg) {
  const TrainOptions& o = run.o;
  if (o.ranks_per_node_given) CheckRanksPerNode(o.ranks_per_node, world_size);
  const int rpn = o.ranks_per_node_given ? o.ranks_per_node : saved.ranks_per_node;
  try {
    Topology fit(world_size, rpn ? rpn : world_size, saved.sw, saved.sg, saved.so);
  } catch (const LayoutError& e) {
    throw ConfigError(fmt::format(
        "--resume {}: the checkpoint's layout {} does not fit {} ranks ({}); pass "
        "--sw/--sg/--so/--ranks-per-node for this world size (a checkpoint loads at any valid "
        "layout)",
        run.resume_dir, saved.ToString(), world_size, e.what()));
  }
  cfg->sw = saved.sw, cfg->sg = saved.sg, cfg->so = saved.so;
  cfg->ranks_per_node = rpn;
}

// --resume: the checkpoint's data, model and stochastic-rounding seed against this run's,
// before any collective (LoadCheckpoint checks the model again, agreed over the ranks).
void CheckResume(TrainRun& run, int world_size) {
  const TrainOptions& o = run.o;
  if (o.resume.empty()) return;
  run.resume_dir = ResolveCheckpoint(o.resume);  // IoError naming the path when there is none
  const Manifest saved = ReadManifest(run.resume_dir);
  // Another data source would continue on data the run never saw at a position that means
  // nothing there: refused unless asked for.
  const std::string saved_data = saved.meta.run.value("data", o.data);
  SSHSDP_CHECK(saved_data == o.data || o.allow_data_change, ConfigError,
               "--resume {}: the checkpoint trained on --data {}, this run names --data {}; "
               "leave --data out to continue on the same data, or pass --allow-data-change",
               run.resume_dir, saved_data, o.data);
  // A dense checkpoint for an MoE run (or the reverse) is named as such, not by the keys
  // only one of them has. MoE: --weight-dtype mxfp8 splits the groups (expert_group).
  const std::string saved_type = saved.meta.model.value("type", std::string("gpt"));
  const std::string this_type = run.model_json.value("type", std::string("gpt"));
  SSHSDP_CHECK(saved_type == this_type, ConfigError,
               "{}: the checkpoint holds {} model, this run is {} one; use a --model of the "
               "checkpoint's kind (and its model options)",
               saved.ManifestPath(), ModelKindName(saved_type), ModelKindName(this_type));
  const std::vector<std::string> diffs = JsonDifferences(saved.meta.model, run.model_json);
  SSHSDP_CHECK(diffs.empty(), ConfigError,
               "{}: the checkpoint holds a different model: {}; use the model options (and, for "
               "MoE, the --weight-dtype) it was saved with",
               saved.ManifestPath(), fmt::join(diffs, ", "));
  // The stochastic-rounding stream continues only with the saved seed (draws are keyed by
  // seed, step and element).
  const uint64_t sr_seed = saved.meta.scalars.value("sr_seed", run.cfg.sr_seed);
  if (sr_seed != run.cfg.sr_seed)
    run.resume_notes.push_back(fmt::format("continuing with the checkpoint's --sr-seed {} (not {})",
                                           sr_seed, run.cfg.sr_seed));
  run.cfg.sr_seed = sr_seed;
  if (!o.layout_given) AdoptSavedLayout(run, saved.layout, world_size, &run.cfg);
}

// Validates the final layout against the world size (LayoutError names the numbers).
void CheckLayout(const TrainRun& run, int world_size) {
  const TrainOptions& o = run.o;
  const EngineConfig& cfg = run.cfg;
  if (o.layout_given || run.resume_dir.empty()) {  // the flags' layout (a resume's was checked)
    CheckResolvedLayout(o.sw, o.sg, o.so, world_size, cfg.ranks_per_node);
  } else {
    Topology check(world_size, cfg.ranks_per_node ? cfg.ranks_per_node : world_size, cfg.sw, cfg.sg,
                   cfg.so);
  }
}

// What a checkpoint records about this run.
nlohmann::json RunJson(const TrainRun& run) {
  const TrainOptions& o = run.o;
  auto num = [](float v) { return std::stod(fmt::format("{}", v)); };  // 0.9f -> 0.9
  nlohmann::json j = {{"preset", o.model},
                      {"seed", o.seed},
                      {"data", o.data},
                      {"batch_size", o.batch_size},
                      {"microbatches", o.microbatches},
                      {"seq_len", run.T},
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
                      {"lr_min", num(run.lr_min)},
                      {"steps", o.steps},
                      {"vocab", run.gc.vocab},
                      {"config", o.recorded_config}};
  // The tokenizer of --init-from-hf's directory, if it has one: generate uses it.
  if (!run.tokenizer.empty()) j["tokenizer"] = run.tokenizer;
  return j;
}

// A resume's notes on rank 0: what differs from the checkpoint's run, and where it continues.
void PrintResumeNotes(const TrainRun& run, LoadResult& lr, const TrainLoop& loop, int W) {
  const TrainOptions& o = run.o;
  const int64_t per_step = int64_t{o.microbatches} * W * o.batch_size;
  const auto notes_of = [](nlohmann::json j) {  // the record itself is not a difference
    j.erase("config");
    return j;
  };
  fmt::print("resumed from {} at step {} ({} bytes read on rank 0 in {:.3f} s)\n", lr.manifest.dir,
             loop.start, lr.bytes_read, lr.seconds);
  for (const std::string& d :
       JsonDifferences(notes_of(lr.manifest.meta.run), notes_of(run.run_json)))
    lr.notes.push_back("run option " + d);
  lr.notes.insert(lr.notes.end(), run.resume_notes.begin(), run.resume_notes.end());
  if (!o.restored.empty())
    lr.notes.push_back(fmt::format("options from the checkpoint: {}", fmt::join(o.restored, " ")));
  if (loop.first_sample != loop.start * per_step)
    lr.notes.push_back(fmt::format("continuing at global sample {} ({} samples per step now)",
                                   loop.first_sample, per_step));
  if (loop.start >= o.steps)
    lr.notes.push_back(fmt::format(
        "the checkpoint is at step {} and --steps is {}: nothing to train (pass a larger --steps "
        "to continue)",
        loop.start, o.steps));
  for (const std::string& n : lr.notes) fmt::print("  note: {}\n", n);
  std::fflush(stdout);
}

// The checkpoint resumed from: the loop's start and data position (collective).
void Resume(const TrainRun& run, TrainLoop* loop) {
  LoadResult lr = LoadCheckpoint(*loop->engine, *loop->world, run.resume_dir, run.model_json);
  const Manifest& m = lr.manifest;
  // The data position is the loop's step: ahead of the optimizer step by the steps that
  // --on-nonfinite skip left out.
  loop->start = m.meta.scalars.value("data_position", m.step);
  SSHSDP_CHECK(loop->start >= m.step, ConfigError,
               "{}: data position {} is behind the optimizer "
               "step {}",
               m.ManifestPath(), loop->start, m.step);
  // Global samples read before this run's first step: a resume continues from the sample it
  // stopped at, whatever its world size, batch size or microbatches are now. Checkpoints
  // before the sample count existed: their steps all had the saved shape.
  const int64_t saved_per_step = static_cast<int64_t>(m.meta.run.value("microbatches", 1)) *
                                 m.meta.run.value("batch_size", 1) * m.layout.world;
  loop->first_sample = m.meta.scalars.value("data_samples", loop->start * saved_per_step);
  if (loop->world->rank() == 0) PrintResumeNotes(run, lr, *loop, loop->world->size());
}

// The initial state: a checkpoint, a Hugging Face checkpoint (each rank reads only the elements
// its shards hold), an --init-weights file, or the seed's initialisation.
void LoadInitialState(const TrainRun& run, std::optional<HfWeights>& hf,
                      const std::map<std::string, std::vector<float>>& init, TrainLoop* loop) {
  Engine& engine = *loop->engine;
  if (!run.resume_dir.empty()) {
    Resume(run, loop);
  } else if (hf) {
    engine.LoadMainWeights([&](const std::string& name, size_t begin, size_t n, float* out) {
      hf->Read(name, begin, n, out);
    });
  } else if (init.empty()) {
    engine.InitWeights(run.o.seed);
  } else {
    engine.LoadMainWeights(init);
  }
}

// The GEMM peak MFU is measured against: MX weights are dequantized to fp32 for their GEMMs
// (the fp32 path is their peak); on a backend its GEMM of the weights' dtype, or bf16 with
// --mx-gemm bf16.
GemmPeak MeasurePeak(const TrainRun& run, const DeviceRun& dev, Communicator& world) {
  const TrainOptions& o = run.o;
  const EngineConfig& cfg = run.cfg;
  const DType backend_gemm = o.mx_gemm == "bf16" ? DType::kBF16 : cfg.weight_dtype;
  const DType host_gemm =
      cfg.weight_dtype == DType::kBF16 || o.mx_gemm == "bf16" ? DType::kBF16 : DType::kF32;
  GemmPeak peak = dev.backend
                      ? MeasureBackendGemmPeak(world, *dev.backend, backend_gemm, o.gemm_peak, 9,
                                               dev.backend->host_memory() ? 1024 : 4096)
                      : MeasureJobGemmPeak(world, host_gemm, o.gemm_peak);
  if (cfg.weight_dtype == DType::kE4M3) {  // the header names both paths
    peak.path = fmt::format(
        "MXFP8 weights dequantized to {} (the peak's path): {}; groups kept "
        "in bf16: {}",
        o.mx_gemm, peak.path,
        dev.backend ? std::string("the backend's bf16 GEMM")
                    : kernels::GemmPathDescription(DType::kBF16));
  }
  return peak;
}

// The GEMM and attention paths may differ by rank (nodes of other CPU kinds, or another
// SSHSDP_GEMM in one node's environment): legitimate, but the run's bits then depend on which
// rank ran what, so rank 0 notes it. Collective.
std::string AttentionPath(const TrainOptions& o, const DeviceRun& dev) {
  return kernels::AttentionPathDescription(
      RunsBf16Attention(o.model, o.weight_dtype, o.attention_dtype) &&
      (!dev.backend || dev.backend->Has(BackendFeature::kBf16Attention)));
}

void NoteKernelDifferences(const TrainRun& run, const TrainLoop& loop, const DeviceRun& dev) {
  const std::string mine =
      fmt::format("GEMM: {}\nfp32 GEMM: {}\nattention: {}", loop.gemm_peak.path,
                  kernels::GemmPathDescription(DType::kF32), AttentionPath(run.o, dev));
  const RankDifferences d = DifferencesFromRankZero(mine);
  if (d.ranks.empty() || WorldRankOrMinusOne() != 0) return;
  fmt::print(
      "note: the kernels of {} differ from rank 0's (rank {} vs rank 0: {}): their products "
      "round differently, so the run's bits depend on which rank ran what; give every rank the "
      "same SSHSDP_GEMM (and SSHSDP_BF16_GEMM, DNNL_MAX_CPU_ISA) to make them alike\n",
      d.Ranks(), d.ranks.front(), d.first);
}

// The run's header on rank 0: model, layout, data, GEMM path and peak, attention, threads.
void PrintHeader(const TrainRun& run, const TrainLoop& loop, const DeviceRun& dev,
                 const kernels::KernelThreadChoice& threads) {
  const TrainOptions& o = run.o;
  const GptConfig& gc = run.gc;
  const auto* syn = dynamic_cast<const SyntheticTokens*>(run.data.get());
  const std::string layout = loop.engine->topology().ToString() +
                             (o.layout_given           ? ""
                              : run.resume_dir.empty() ? " (fully sharded: no --sw/--sg/--so given)"
                                                       : " (the checkpoint's layout)");
  fmt::print(
      "sshsdp train: {} | {} d={} L={} H={} T={} V={}{} params={:.2f}M | {} | weights {} | "
      "batch {}x{}x{} per rank{}{}\n"
      "GEMM: {} | {} | CPU ISA {} | attention {} | threads {}\n",
      ModelName(o), ModelDescription(o, gc), gc.d_model, gc.n_layer, gc.n_head, run.T, gc.vocab,
      gc.padded_vocab() != gc.vocab ? fmt::format(" (tables padded to {})", gc.padded_vocab()) : "",
      loop.model->NumParams() / 1e6, layout, o.weight_dtype, run.cfg.microbatches,
      run.cfg.batch_size, run.T,
      syn ? fmt::format(" | data: synthetic, optimal loss {:.4f}", syn->OptimalLoss())
          : fmt::format(" | data: {}", o.data),
      dev.backend ? fmt::format(" | backend {}", dev.backend->name()) : "", loop.gemm_peak.path,
      loop.gemm_peak.ToString(), kernels::CpuIsaName(), AttentionPath(o, dev), threads.description);
  for (const std::string& n : dev.notes) fmt::print("note: {}\n", n);
  std::fflush(stdout);
}

// Muon's plan on rank 0: the same on every rank of a replica, so the balance and bytes of all
// its ranks.
void PrintMuonPlan(const TrainOptions& o, const Engine& engine) {
  const UpdatePlan* mp = engine.structured_update().plan(OptimizerKind::kMuon);
  if (!mp) return;
  double max_cost = 0, sum_cost = 0;
  uint64_t bytes = 0;
  for (int r : mp->ranks()) {
    max_cost = std::max(max_cost, mp->ExecCost(r));
    sum_cost += mp->ExecCost(r);
    bytes += mp->BytesSent(r);
  }
  fmt::print(
      "optimizer: Muon per {} on {:.1f}% of parameters ({} units, {} split across ranks; {} P2P "
      "bytes per step per replica; planned Newton-Schulz {:.2f} GFLOP per step, max/mean over "
      "ranks {:.3f}), AdamW for the rest\n",
      o.muon_unit, 100 * engine.structured_update().muon_share(), mp->units().size(),
      mp->num_split(), bytes, sum_cost / 1e9,
      sum_cost > 0 ? max_cost / (sum_cost / mp->ranks().size()) : 1.0);
  std::fflush(stdout);
}

// A lower bound of any preset's activations (the residual stream and the logits twice) must
// fit the node's memory; not on a device backend, whose state lives in device memory.
void CheckActivations(const TrainRun& run, const NodeSetup& node, const DeviceRun& dev) {
  if (dev.backend && !dev.backend->host_memory()) return;
  const double tokens = static_cast<double>(run.cfg.batch_size) * run.T;
  CheckActivationsFitNode(
      4.0 * tokens * ((run.gc.n_layer + 1.0) * run.gc.d_model + 2.0 * run.gc.padded_vocab()),
      node.local_ranks, fmt::format("{} x {} tokens", run.cfg.batch_size, run.T));
}

}  // namespace

int RunTrain(int argc, char** argv, const TrainOptions& o) {
  return RunMpiMain(argc, argv, [&]() -> int {
    const std::string launch_note = CheckLauncher(WorldSize(), ::getenv);  // torchrun, srun
    TrainRun run(o);
    CheckInputs(run);
    const int world_size = WorldSize();
    CheckResume(run, world_size);
    CheckLayout(run, world_size);
    // --backend: the engine on a device backend, at the final layout (a resume's included; what
    // it does not run is refused by name, before any collective).
    const DeviceRun dev = MakeDeviceRun(o, &run.cfg);
    std::unique_ptr<Model> model = MakeRunModel(o, run.gc, dev);  // Gpt, MoeGpt or Llama family
    std::map<std::string, std::vector<float>> init;
    if (!o.init_weights.empty())  // names and shapes must be this model's (ConfigError lists)
      init = ReadInitWeights(o.init_weights, ModelTensors(*model));
    // A Hugging Face checkpoint: its headers checked here, on every rank alike. A resume's
    // weights are its own.
    std::optional<HfWeights> hf;
    if (!o.init_from_hf.empty() && run.resume_dir.empty())
      hf.emplace(o.init_from_hf, MakeLlamaConfig(o, run.gc.vocab));
    run.tokenizer = HfTokenizerPath(o.init_from_hf);
    run.run_json = RunJson(run);

    const EngineConfig& cfg = run.cfg;
    auto world = MpiCommunicator::World(cfg.ranks_per_node ? cfg.ranks_per_node : world_size);
    const int W = world->size(), rank = world->rank();
    // Before any kernel runs (the engine's initialisation casts): threads per rank; and a
    // model too large for the node's memory is refused before anything is allocated.
    const NodeSetup node = SetUpNode(static_cast<double>(model->NumParams()), W,
                                     !dev.backend || dev.backend->host_memory());
    CheckActivations(run, node, dev);
    Engine engine(*model, *world, cfg);
    if (rank == 0 && !launch_note.empty()) fmt::print("note: {}\n", launch_note);
    if (rank == 0) {
      const Topology& t = engine.topology();
      const bool outer = t.sw() != W || t.sg() != W || t.so() != W;
      for (const std::string& n : UnusedOptionNotes(o, outer)) fmt::print("note: {}\n", n);
    }
    TrainLoop loop{model.get(), &engine, world.get()};
    LoadInitialState(run, hf, init, &loop);
    loop.gemm_peak = MeasurePeak(run, dev, *world);
    NoteKernelDifferences(run, loop, dev);
    if (!node.threads.warning.empty()) {
      fmt::print(stderr, "sshsdp train: rank {}: warning: {}\n", rank, node.threads.warning);
    }
    if (rank == 0) PrintHeader(run, loop, dev, node.threads);
    if (rank == 0) PrintMuonPlan(o, engine);
    return RunTrainLoop(run, loop);
  });
}

}  // namespace sshsdp
