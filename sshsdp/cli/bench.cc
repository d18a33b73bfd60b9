// `sshsdp bench` (see bench.h): presets or the ablation ladder back to back on one workload
// sweep, one table and one JSON document.
//
// RunBench reads as the run's plan: CheckInputs (every option, before any collective but the
// option agreement), the job (world, threads, GEMM peak, header), then per batch size
// RunWorkload (bench_workload.cc) and ReportWorkload (bench_report.cc), then the trace and the
// JSON document.
#include "sshsdp/cli/bench.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "sshsdp/base/error.h"
#include "sshsdp/cli/bench_internal.h"
#include "sshsdp/cli/launcher.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/cli/node_setup.h"
#include "sshsdp/cli/option_agreement.h"
#include "sshsdp/cli/run_config.h"
#include "sshsdp/cli/trace_file.h"
#include "sshsdp/cli/train.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/watchdog.h"
#include "sshsdp/hf/hf_config.h"
#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/gemm_provider.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

// The Llama-family model of --model-config or a qwen3-* / llama-* preset (with overrides),
// else none.
std::optional<LlamaConfig> BenchLlama(const BenchOptions& o) {
  if (o.model_config.empty() && !LlamaConfig::IsPreset(o.model)) return std::nullopt;
  LlamaConfig c =
      o.model_config.empty() ? LlamaConfig::Preset(o.model) : ReadHfConfig(o.model_config);
  SSHSDP_CHECK(o.model_config.empty() || (o.model == BenchOptions{}.model && !o.model_given),
               ConfigError,
               "--model {} and --model-config both name the architecture; leave --model out (the "
               "config.json gives it)",
               o.model);
  SSHSDP_CHECK(o.model_config.empty() || (o.layers == 0 && o.d_model == 0 && o.heads == 0),
               ConfigError, "--layers/--d-model/--heads change a preset; {} fixes the architecture",
               o.model_config);
  if (o.layers) c.n_layer = o.layers;
  if (o.d_model) c.d_model = o.d_model;
  if (o.heads) c.n_head = c.n_kv_head = o.heads;
  if (o.seq_len) c.seq_len = std::max(c.seq_len, o.seq_len);
  c.bf16_attention = Bf16Attention(o.attention_dtype);
  c.Validate();
  return c;
}

// The model a configuration's users write (presets.h, PresetQkvModel): one fused QKV
// parameter, per-head parts of a packed runtime tensor, or per-part runtime parameters and
// GEMMs (dense GPT only; the MoE model keeps a packed QKV, fused or per head).
std::unique_ptr<Model> MakeBenchModel(const BenchOptions& o, const GptConfig& trunk, QkvModel qkv) {
  if (auto llama = BenchLlama(o)) {  // packed QKV, fused or per head (as the MoE model)
    llama->fused_qkv = qkv == QkvModel::kFused;
    return MakeLlamaFamilyModel(*llama, nullptr, o.weight_dtype == "mxfp8");
  }
  GptConfig t = trunk;
  t.packed_qkv = qkv != QkvModel::kPerPart || IsMoePreset(o.model);
  t.fused_qkv = qkv == QkvModel::kFused;
  if (!IsMoePreset(o.model)) return MakeModel(t, nullptr);
  const MoeConfig c = MoeConfig::Preset(o.model);
  return MakeModel(t, &c);
}

namespace {

// The dense GPT trunk of the model (the MoE presets' trunk for moe-*; a summary of a
// Llama-family model), with overrides.
GptConfig MakeConfig(const BenchOptions& o) {
  if (const auto llama = BenchLlama(o)) {
    GptConfig c = LlamaSummary(*llama);
    c.seq_len = llama->seq_len;
    return c;
  }
  GptConfig c = PresetTrunk(o.model);
  if (o.layers) c.n_layer = o.layers;
  if (o.d_model) c.d_model = o.d_model;
  if (o.heads) c.n_head = o.heads;
  if (o.seq_len) c.seq_len = std::max(c.seq_len, o.seq_len);
  c.bf16_attention = Bf16Attention(o.attention_dtype);
  c.Validate();
  return c;
}

// The presets (all but megatron-fsdp with Muon, which refuses structured updates), the comm
// paths and the outer-overlap values, each checked.
void CheckPresets(BenchRun& run) {
  const BenchOptions& o = run.o;
  run.presets = o.presets.empty() ? PresetNames() : o.presets;
  if (run.muon && o.presets.empty()) std::erase(run.presets, std::string("megatron-fsdp"));
  EngineConfig probe;
  for (const std::string& p : run.presets) {
    ApplyPreset(p, &probe);  // ConfigError if unknown
    SSHSDP_CHECK(
        !run.muon || probe.redundancies.structured_updates != StructuredUpdates::kUnsupported,
        ConfigError,
        "--optimizer muon: preset '{}' has no structured updates (⑥: Megatron-FSDP "
        "refuses Muon); drop it from --presets",
        p);
  }
  SSHSDP_CHECK(!o.comm_paths.empty(), ConfigError, "--comm-path needs at least one value");
  for (const std::string& c : o.comm_paths)  // ConfigError if unknown
    SSHSDP_CHECK(ParseCommPath(c) != CommPath::kNccl, ConfigError,
                 "--comm-path nccl: sshsdp bench runs on the CPU backend, whose buffers NCCL does "
                 "not move (NCCL is for `sshsdp train --backend cuda`); use collective or direct");
  SSHSDP_CHECK(!o.overlap_outer.empty(), ConfigError, "--overlap-outer needs on, off or both");
  for (const std::string& v : o.overlap_outer)
    SSHSDP_CHECK(v == "on" || v == "off", ConfigError,
                 "--overlap-outer values must be on or off, got '{}'", v);
}

// The layout and hyperparameters every configuration shares, validated.
void MakeBaseConfig(BenchRun& run) {
  const BenchOptions& o = run.o;
  const int world_size = WorldSize();
  run.rpn = o.ranks_per_node ? o.ranks_per_node : world_size;
  EngineConfig& base = run.base;
  const LayoutDegrees degrees = ResolveLayoutDegrees(o.sw, o.sg, o.so, world_size);
  base.sw = degrees.sw, base.sg = degrees.sg, base.so = degrees.so;
  base.ranks_per_node = run.rpn;
  base.microbatches = o.microbatches;
  base.seq_len = run.T;
  base.overlap_outer = o.overlap_outer.empty() || o.overlap_outer.front() == "on";  // ablation
  SSHSDP_CHECK(o.weight_dtype == "bf16" || o.weight_dtype == "fp32", ConfigError,
               "--weight-dtype: sshsdp bench compares presets with bf16 or fp32 weights, got '{}' "
               "(MXFP8: build/sshsdp/engine/mx_bench)",
               o.weight_dtype);
  base.weight_dtype = ParseDType(o.weight_dtype);
  ValidateEngineConfig(base);  // hyperparameter ranges, before any collective
  base.adamw = {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  base.clip_norm = o.clip;
  base.optimizer = run.muon ? OptimizerKind::kMuon : OptimizerKind::kAdamW;
  base.muon_unit = ParseUnitRule(o.muon_unit);
  SSHSDP_CHECK(base.muon_unit != UnitRule::kAdamW, ConfigError,
               "--muon-unit must be head or matrix, got '{}'", o.muon_unit);
  base.muon.lr = o.muon_lr;
  if (o.ablation) {
    for (const auto& [label, c] : AblationLadder(base))
      SSHSDP_CHECK(
          !run.muon || c.redundancies.structured_updates != StructuredUpdates::kUnsupported,
          ConfigError, "--optimizer muon: ablation step '{}' has no structured updates", label);
  }
  CheckResolvedLayout(o.sw, o.sg, o.so, world_size, run.rpn);  // LayoutError names the flags
}

// Input checks before any collective (but AgreeOnOptions, which compares the ranks' options).
void CheckInputs(BenchRun& run) {
  const BenchOptions& o = run.o;
  AgreeOnOptions(o.recorded_config, "sshsdp bench");
  run.gc = MakeConfig(o);
  run.T = o.seq_len ? o.seq_len : run.gc.seq_len;
  SSHSDP_CHECK(run.T <= run.gc.seq_len, ConfigError, "--seq-len {} exceeds the model's {}", run.T,
               run.gc.seq_len);
  SSHSDP_CHECK(o.warmup >= 0 && o.steps >= 1, ConfigError,
               "--warmup must be >= 0 and --steps >= 1, got {} and {}", o.warmup, o.steps);
  SSHSDP_CHECK(!o.batch_sizes.empty(), ConfigError, "--batch-size needs at least one value");
  if (WorldRankOrMinusOne() == 0) {  // outputs usable now, not after the whole benchmark
    CheckWritableOutput("--trace", o.trace);
    CheckWritableOutput("--json", o.json, /*renamed_into_place=*/false);
    const std::vector<NamedPath> outputs = {{"--trace", o.trace}, {"--json", o.json}};
    CheckOutputsDistinct(outputs, {});
    CheckOutputsOutsideCheckpoints(outputs, {});
  }
  for (int b : o.batch_sizes)
    SSHSDP_CHECK(b >= 1, ConfigError, "--batch-size values must be >= 1, got {}", b);
  SSHSDP_CHECK(o.optimizer == "adamw" || o.optimizer == "muon", ConfigError,
               "--optimizer must be adamw or muon, got '{}'", o.optimizer);
  run.muon = o.optimizer == "muon";
  CheckPresets(run);
  SSHSDP_CHECK(std::isfinite(o.gemm_peak) && o.gemm_peak >= 0, ConfigError,
               "--gemm-peak must be a GFLOP/s figure per rank >= 0 (0: measure), got {}",
               o.gemm_peak);
  MakeBaseConfig(run);
  SetCommTimeout(o.comm_timeout);
  // A bad or unloadable SSHSDP_GEMM fails here, before any collective; a bad SSHSDP_BF16_GEMM,
  // SSHSDP_BF16_GEMM_KERNEL or SSHSDP_BF16_ATTENTION_PRODUCTS too (bf16 weights only).
  kernels::ActiveGemmProvider();
  if (run.base.weight_dtype == DType::kBF16) {
    kernels::ActiveBf16GemmPath();
    kernels::ActiveBf16GemmKernel();
    kernels::ActiveBf16AttentionProducts();
  }
}

void PrintHeader(const BenchJob& job, const kernels::KernelThreadChoice& threads) {
  const BenchRun& run = *job.run;
  const BenchOptions& o = run.o;
  const GptConfig& gc = run.gc;
  auto probe = MakeBenchModel(o, gc, QkvModel::kFused);
  const Topology layout(job.world->size(), run.rpn, run.base.sw, run.base.sg, run.base.so);
  fmt::print(
      "sshsdp bench: {} d={} L={} H={} T={} V={} params={:.2f}M | {} | weights {} | {} "
      "microbatches | {} warm-up + {} timed steps per configuration (median of the timed, "
      "slowest rank) | optimizer {}\nGEMM: {} | {} | CPU ISA {} | attention {} | threads {}\n",
      BenchLlama(o)          ? (o.model_config.empty() ? o.model : o.model_config)
      : IsMoePreset(o.model) ? o.model
                             : "GPT",
      gc.d_model, gc.n_layer, gc.n_head, run.T, gc.vocab, probe->NumParams() / 1e6,
      layout.ToString(), o.weight_dtype, o.microbatches, o.warmup, o.steps,
      run.muon ? "muon per " + o.muon_unit : o.optimizer, job.gemm_peak.path,
      job.gemm_peak.ToString(), kernels::CpuIsaName(),
      kernels::AttentionPathDescription(
          RunsBf16Attention(o.model, o.weight_dtype, o.attention_dtype)),
      threads.description);
}

void WriteJson(const std::string& path, const nlohmann::json& out) {
  std::ofstream f(path, std::ios::trunc);
  SSHSDP_CHECK(f.good(), IoError, "--json {}: cannot open for writing: {}", path,
               std::strerror(errno));
  f << out.dump(2) << "\n";
  fmt::print("wrote {}\n", path);
}

}  // namespace

int RunBench(int argc, char** argv, const BenchOptions& o) {
  return RunMpiMain(argc, argv, [&]() -> int {
    const std::string launch_note = CheckLauncher(WorldSize(), ::getenv);  // torchrun, srun
    BenchRun run(o);
    CheckInputs(run);
    auto world = MpiCommunicator::World(run.rpn);
    const int W = world->size(), rank = world->rank();
    const NodeSetup node = SetUpNode(
        static_cast<double>(MakeBenchModel(o, run.gc, QkvModel::kFused)->NumParams()), W, true);
    SyntheticTokens data(run.gc.vocab, o.seed);
    Tracer tracer;  // --trace: the first batch size's configurations, one step each
    std::vector<std::string> trace_rows;
    BenchJob job{&run,    world.get(),
                 &data,   MeasureJobGemmPeak(*world, run.base.weight_dtype, o.gemm_peak),
                 &tracer, &trace_rows};
    if (!node.threads.warning.empty()) {
      fmt::print(stderr, "sshsdp bench: rank {}: warning: {}\n", rank, node.threads.warning);
    }
    if (rank == 0 && !launch_note.empty()) fmt::print("note: {}\n", launch_note);
    if (rank == 0) PrintHeader(job, node.threads);
    nlohmann::json out = nlohmann::json::array();
    if (!o.trace.empty()) StartTrace(tracer, *world);
    for (size_t i = 0; i < o.batch_sizes.size(); ++i) {
      const int B = o.batch_sizes[i];
      const std::vector<BenchRow> rows = RunWorkload(job, B, !o.trace.empty() && i == 0);
      if (rank == 0) ReportWorkload(job, B, rows, &out);
    }
    if (!o.trace.empty()) {
      WriteTraceFile(tracer, *world, o.trace, trace_rows);  // collective
      if (rank == 0) fmt::print("wrote {} ({} rows)\n", o.trace, trace_rows.size());
    }
    if (rank == 0 && !o.json.empty()) WriteJson(o.json, out);
    return 0;
  });
}

}  // namespace sshsdp
