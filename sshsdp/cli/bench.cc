// `sshsdp bench` (see bench.h): presets or the ablation ladder back to back on one workload
// sweep, one table and one JSON document.
#include "sshsdp/cli/bench.h"
#include "sshsdp/base/bench_util.h"

#include <malloc.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/cli/bench_profile.h"
#include "sshsdp/cli/gemm_peak.h"
#include "sshsdp/cli/launcher.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/cli/node_setup.h"
#include "sshsdp/cli/option_agreement.h"
#include "sshsdp/cli/process_memory.h"
#include "sshsdp/cli/run_config.h"
#include "sshsdp/cli/trace_file.h"
#include "sshsdp/cli/train.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/watchdog.h"
#include "sshsdp/engine/presets.h"
#include "sshsdp/hf/hf_config.h"
#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/gemm_provider.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/parallel.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

namespace {

// The Llama-family model of --model-config or a qwen3-* / llama-* preset (with overrides),
// else none.
std::optional<LlamaConfig> BenchLlama(const BenchOptions& o) {
  if (o.model_config.empty() && !LlamaConfig::IsPreset(o.model)) return std::nullopt;
  LlamaConfig c =
      o.model_config.empty() ? LlamaConfig::Preset(o.model) : ReadHfConfig(o.model_config);
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

// The model a configuration's users write (presets.h, PresetQkvModel): one fused QKV
// parameter, per-head parts of a packed runtime tensor, or per-part runtime parameters and
// GEMMs (dense GPT only; the MoE model keeps a packed QKV, fused or per head).
std::unique_ptr<Model> MakeModel(const BenchOptions& o, const GptConfig& trunk, QkvModel qkv) {
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

struct Row {
  int batch = 0;
  std::string label;
  std::string switches, layout, qkv;  // qkv: the model its users write (QkvModelName)
  double median_s = 0, tokens_per_s = 0, mfu = 0, ratio = 0, flops_per_token = 0;
  double rss_mib = 0, accounted_mib = 0;
  std::map<std::string, double> accounted_by_category;  // MiB, rank 0
  StepCounters counters;                                // rank 0, last timed step
  TimeSplit time;                                       // mean over ranks and timed steps
  std::vector<double> losses;                           // every step, warm-up included
  std::vector<double> step_s;                           // timed steps (slowest rank), in order
  double ratio_paired = 0;  // round-robin: median over rounds of sshsdp step / this step
  bool has_paired = false;  // false with --sequential (steps of different rows never paired)
  std::string reference;    // the row ratios are taken against
  StepProfile profile;      // --profile
};

nlohmann::json RowJson(const Row& r, int64_t tokens_per_mb) {
  const CopyBytes& c = r.counters.copies;
  nlohmann::json j = {
      {"batch_size", r.batch},
      {"tokens_per_microbatch", tokens_per_mb},
      {"config", r.label},
      {"redundancies", r.switches},
      {"shard_layout", r.layout},
      {"qkv_model", r.qkv},
      {"median_step_s", r.median_s},
      {"tokens_per_s", r.tokens_per_s},
      {"ratio_to_sshsdp", r.ratio},
      {"ratio_to_sshsdp_paired",
       r.has_paired ? nlohmann::json(r.ratio_paired) : nlohmann::json(nullptr)},
      {"ratio_reference", r.reference},
      {"mfu", r.mfu},
      {"peak_rss_mib", r.rss_mib},
      {"accounted_peak_mib", r.accounted_mib},
      {"accounted_peak_mib_by_category", r.accounted_by_category},
      {"bytes_copied_per_step", r.counters.bytes_copied},
      {"collective_copy_bytes_per_step", r.counters.collective_copy_bytes},
      {"bytes_copied_weights", c.weight_copy_in + c.weight_copy_out + c.weight_pack},
      {"bytes_copied_grads", c.grad_copy + c.grad_unpack},
      {"copies",
       {{"weight_copy_in", c.weight_copy_in},
        {"weight_copy_out", c.weight_copy_out},
        {"weight_pack", c.weight_pack},
        {"grad_copy", c.grad_copy},
        {"grad_unpack", c.grad_unpack},
        {"update_copy", c.update_copy}}},
      {"add_passes", r.counters.add_passes},
      {"update",
       {{"comm_bytes", r.counters.update_comm.total()},
        {"p2p_bytes", r.counters.update_p2p.total()},
        {"full_tensor_bytes", r.counters.update_full_tensor.total()},
        {"full_tensor_calls", r.counters.update_full_tensor.calls},
        {"ns_flops_per_rank", r.counters.update_exec_cost},
        {"copy_bytes", c.update_copy},
        {"outer_overlapped", r.counters.outer_overlapped}}},
      {"weight_preps", r.counters.weight_preps},
      {"comm_intra_bytes_per_step",
       r.counters.runtime_comm.intra_node_bytes + r.counters.update_comm.intra_node_bytes},
      {"comm_inter_bytes_per_step",
       r.counters.runtime_comm.inter_node_bytes + r.counters.update_comm.inter_node_bytes},
      {"time_s",
       {{"compute", r.time.compute},
        {"comm_wait", r.time.comm_wait},
        {"copy", r.time.copy},
        {"cast", r.time.cast},
        {"add", r.time.add},
        {"optimizer", r.time.optimizer},
        {"other", r.time.other}}},
      {"losses", r.losses}};
  if (r.profile.step_s > 0) j["profile"] = StepProfileJson(r.profile);
  return j;
}

// The model of workload.json (bench/peers/peer_models.py builds it): sshsdp's model JSON,
// plus the MoE load-balancing loss weight, a training setting the model JSON leaves out.
nlohmann::json PeerModelJson(const BenchOptions& o, const GptConfig& gc) {
  const std::string& model = o.model;
  if (const auto llama = BenchLlama(o)) return LlamaModelJson(*llama);  // no PyTorch peer builds it
  if (!IsMoePreset(model)) return GptModelJson(gc);
  MoeConfig c = MoeConfig::Preset(model);
  c.trunk = gc;
  nlohmann::json j = MoeModelJson(c);
  j["aux_loss_weight"] = c.aux_loss_weight;
  return j;
}

}  // namespace

int RunBench(int argc, char** argv, const BenchOptions& o) {
  return RunMpiMain(argc, argv, [&]() -> int {
    // Input checks before any collective (but this one, which compares the ranks' options).
    const std::string launch_note = CheckLauncher(WorldSize(), ::getenv);  // torchrun, srun
    AgreeOnOptions(o.recorded_config, "sshsdp bench");
    const GptConfig gc = MakeConfig(o);
    const int T = o.seq_len ? o.seq_len : gc.seq_len;
    SSHSDP_CHECK(T <= gc.seq_len, ConfigError, "--seq-len {} exceeds the model's {}", T,
                 gc.seq_len);
    SSHSDP_CHECK(o.warmup >= 0 && o.steps >= 1, ConfigError,
                 "--warmup must be >= 0 and --steps >= 1, got {} and {}", o.warmup, o.steps);
    SSHSDP_CHECK(!o.batch_sizes.empty(), ConfigError, "--batch-size needs at least one value");
    if (WorldRankOrMinusOne() == 0) {  // outputs usable now, not after the whole benchmark
      CheckWritableOutput("--trace", o.trace);
      CheckWritableOutput("--json", o.json, /*renamed_into_place=*/false);
    }
    for (int b : o.batch_sizes)
      SSHSDP_CHECK(b >= 1, ConfigError, "--batch-size values must be >= 1, got {}", b);
    SSHSDP_CHECK(o.optimizer == "adamw" || o.optimizer == "muon", ConfigError,
                 "--optimizer must be adamw or muon, got '{}'", o.optimizer);
    const bool muon = o.optimizer == "muon";
    std::vector<std::string> presets = o.presets.empty() ? PresetNames() : o.presets;
    if (muon && o.presets.empty())  // megatron-fsdp refuses structured updates
      std::erase(presets, std::string("megatron-fsdp"));
    {
      EngineConfig probe;
      for (const std::string& p : presets) {
        ApplyPreset(p, &probe);  // ConfigError if unknown
        SSHSDP_CHECK(
            !muon || probe.redundancies.structured_updates != StructuredUpdates::kUnsupported,
            ConfigError,
            "--optimizer muon: preset '{}' has no structured updates (⑥: Megatron-FSDP "
            "refuses Muon); drop it from --presets",
            p);
      }
      SSHSDP_CHECK(!o.comm_paths.empty(), ConfigError, "--comm-path needs at least one value");
      for (const std::string& c : o.comm_paths)  // ConfigError if unknown
        SSHSDP_CHECK(ParseCommPath(c) != CommPath::kNccl, ConfigError,
                     "--comm-path nccl: sshsdp bench runs on the CPU backend, whose buffers NCCL "
                     "does not move (NCCL is for `sshsdp train --backend cuda`); use collective or "
                     "direct");
      SSHSDP_CHECK(!o.overlap_outer.empty(), ConfigError, "--overlap-outer needs on, off or both");
      for (const std::string& v : o.overlap_outer)
        SSHSDP_CHECK(v == "on" || v == "off", ConfigError,
                     "--overlap-outer values must be on or off, got '{}'", v);
    }
    const int world_size = WorldSize();
    const int rpn = o.ranks_per_node ? o.ranks_per_node : world_size;
    EngineConfig base;
    const LayoutDegrees degrees = ResolveLayoutDegrees(o.sw, o.sg, o.so, world_size);
    base.sw = degrees.sw, base.sg = degrees.sg, base.so = degrees.so;
    base.ranks_per_node = rpn;
    base.microbatches = o.microbatches;
    base.seq_len = T;
    base.overlap_outer = o.overlap_outer.empty() || o.overlap_outer.front() == "on";  // ablation
    SSHSDP_CHECK(o.weight_dtype == "bf16" || o.weight_dtype == "fp32", ConfigError,
                 "--weight-dtype: sshsdp bench compares presets with bf16 or fp32 weights, got "
                 "'{}' (MXFP8: build/sshsdp/engine/mx_bench)",
                 o.weight_dtype);
    base.weight_dtype = ParseDType(o.weight_dtype);
    SSHSDP_CHECK(std::isfinite(o.gemm_peak) && o.gemm_peak >= 0, ConfigError,
                 "--gemm-peak must be a GFLOP/s figure per rank >= 0 (0: measure), got {}",
                 o.gemm_peak);
    ValidateEngineConfig(base);  // hyperparameter ranges, before any collective
    SetCommTimeout(o.comm_timeout);
    // A bad or unloadable SSHSDP_GEMM fails here, before any collective; a bad SSHSDP_BF16_GEMM,
    // SSHSDP_BF16_GEMM_KERNEL or SSHSDP_BF16_ATTENTION_PRODUCTS too (bf16 weights only).
    kernels::ActiveGemmProvider();
    if (base.weight_dtype == DType::kBF16) {
      kernels::ActiveBf16GemmPath();
      kernels::ActiveBf16GemmKernel();
      kernels::ActiveBf16AttentionProducts();
    }
    base.adamw = {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
    base.clip_norm = o.clip;
    base.optimizer = muon ? OptimizerKind::kMuon : OptimizerKind::kAdamW;
    base.muon_unit = ParseUnitRule(o.muon_unit);
    SSHSDP_CHECK(base.muon_unit != UnitRule::kAdamW, ConfigError,
                 "--muon-unit must be head or matrix, got '{}'", o.muon_unit);
    base.muon.lr = o.muon_lr;
    if (o.ablation) {
      for (const auto& [label, c] : AblationLadder(base))
        SSHSDP_CHECK(!muon || c.redundancies.structured_updates != StructuredUpdates::kUnsupported,
                     ConfigError, "--optimizer muon: ablation step '{}' has no structured updates",
                     label);
    }
    CheckResolvedLayout(o.sw, o.sg, o.so, world_size, rpn);  // LayoutError names the flags
    const Topology check(world_size, rpn, base.sw, base.sg, base.so);

    auto world = MpiCommunicator::World(rpn);
    const int W = world->size(), rank = world->rank();
    const NodeSetup node =
        SetUpNode(static_cast<double>(MakeModel(o, gc, QkvModel::kFused)->NumParams()), W, true);
    const kernels::KernelThreadChoice& threads = node.threads;
    SyntheticTokens data(gc.vocab, o.seed);
    const GemmPeak gemm_peak = MeasureJobGemmPeak(*world, base.weight_dtype, o.gemm_peak);
    const double peak = gemm_peak.per_rank;
    const int total_steps = o.warmup + o.steps;
    if (!threads.warning.empty()) {
      fmt::print(stderr, "sshsdp bench: rank {}: warning: {}\n", rank, threads.warning);
    }
    if (rank == 0 && !launch_note.empty()) fmt::print("note: {}\n", launch_note);
    if (rank == 0) {
      auto probe = MakeModel(o, gc, QkvModel::kFused);
      fmt::print(
          "sshsdp bench: {} d={} L={} H={} T={} V={} params={:.2f}M | {} | weights {} | "
          "{} microbatches | {} warm-up + {} timed steps per configuration (median of the "
          "timed, slowest rank) | optimizer {}\nGEMM: {} | {} | CPU ISA {} | attention {} | "
          "threads {}\n",
          BenchLlama(o)          ? (o.model_config.empty() ? o.model : o.model_config)
          : IsMoePreset(o.model) ? o.model
                                 : "GPT",
          gc.d_model, gc.n_layer, gc.n_head, T, gc.vocab, probe->NumParams() / 1e6,
          check.ToString(), o.weight_dtype, o.microbatches, o.warmup, o.steps,
          muon ? "muon per " + o.muon_unit : o.optimizer, gemm_peak.path, gemm_peak.ToString(),
          kernels::CpuIsaName(),
          kernels::AttentionPathDescription(
              RunsBf16Attention(o.model, o.weight_dtype, o.attention_dtype)),
          threads.description);
    }

    nlohmann::json out = nlohmann::json::array();
    Tracer tracer;  // --trace: the first batch size's configurations, one step each
    std::vector<std::string> trace_rows;
    if (!o.trace.empty()) StartTrace(tracer, *world);
    for (const int& B : o.batch_sizes) {  // a reference: the first is traced
      std::vector<std::pair<std::string, EngineConfig>> configs;
      std::vector<QkvModel> qkv;  // per configuration: the QKV its users write
      EngineConfig wb = base;
      wb.batch_size = B;
      wb.comm_path = ParseCommPath(o.comm_paths.front());
      if (o.ablation) {
        configs = AblationLadder(wb);
        qkv.assign(configs.size(), PresetQkvModel("sshsdp", base.optimizer, base.muon_unit));
      } else {
        for (const std::string& p : presets) {
          for (const std::string& path : o.comm_paths) {
            for (const std::string& overlap : o.overlap_outer) {
              EngineConfig c = wb;
              ApplyPreset(p, &c);
              c.comm_path = ParseCommPath(path);
              c.overlap_outer = overlap == "on";
              configs.emplace_back((c.comm_path == CommPath::kDirect ? p + "+direct" : p) +
                                       (c.overlap_outer ? "" : "/outer-sync"),
                                   c);
              qkv.push_back(PresetQkvModel(p, base.optimizer, base.muon_unit));
            }
          }
        }
      }
      const bool tracing = !o.trace.empty() && &B == &o.batch_sizes.front();
      for (auto& [label, c] : configs) {
        if (!tracing) continue;
        c.tracer = &tracer;
        for (int r = 0; r < W; ++r) trace_rows.push_back(fmt::format("{} rank {}", label, r));
      }
      const std::string peer_dir =
          o.peer_inputs.empty() ? "" : fmt::format("{}/b{}", o.peer_inputs, B);
      // Phase 1, per configuration alone: build, init, warm-up steps; its RSS peak is the
      // process baseline plus the growth during its own build and warm-up (then it is freed).
      // Phase 2: all configurations rebuilt and warmed up again, then the timed steps
      // round-robin over them, each round starting one configuration later (or each back to
      // back with --sequential, without the rebuild), so load changes on a shared machine hit
      // every configuration alike.
      struct Live {
        std::unique_ptr<Model> model;
        std::unique_ptr<Engine> engine;
        Row row;
        int64_t cur = 0;
        std::vector<double> secs, cat_sum = std::vector<double>(8, 0.0);
        bool traced = false;
        OpProfile profile;  // --profile: the model's kernels, timed steps only
      };
      auto make_model = [&](Live& L, size_t ci) {
        L.model = MakeModel(o, gc, qkv[ci]);
        if (o.profile) L.model->SetOpProfile(&L.profile);
      };
      std::vector<Live> live(configs.size());
      auto run_step = [&](Live& L, bool timed) {
        BatchFn batch = [&](int mb, int32_t* tok, int32_t* tgt) {
          data.Batch(SampleIndex(L.cur, mb, o.microbatches, rank, W, 0, B), B, T, tok, tgt);
        };
        const bool trace = tracing && timed && !L.traced;  // a row per configuration and rank
        tracer.SetProcess(static_cast<int>(&L - live.data()) * W + rank);
        tracer.Enable(trace);
        StepStats st = L.engine->Step(batch);
        tracer.Enable(false);
        L.traced = L.traced || trace;
        ++L.cur;
        constexpr int kF = 8;  // seconds + 7 categories
        const TimeSplit& t = st.time;
        float local[kF] = {static_cast<float>(st.seconds),  static_cast<float>(t.compute),
                           static_cast<float>(t.comm_wait), static_cast<float>(t.copy),
                           static_cast<float>(t.cast),      static_cast<float>(t.add),
                           static_cast<float>(t.optimizer), static_cast<float>(t.other)};
        std::vector<float> all(kF * static_cast<size_t>(W));
        world->AllGather(local, all.data(), kF, DType::kF32);
        L.row.losses.push_back(st.loss);
        if (!timed) {
          L.profile.Reset();
          return;
        }
        double slowest = 0;
        for (int r = 0; r < W; ++r) {
          slowest = std::max(slowest, static_cast<double>(all[kF * r]));
          for (int k = 1; k < kF; ++k) L.cat_sum[k] += all[kF * r + k];
        }
        L.secs.push_back(slowest);
        L.row.counters = st.counters;
      };
      auto finish = [&](Live& L) {
        Row& row = L.row;
        const double n = static_cast<double>(o.steps) * W;
        const auto& c = L.cat_sum;
        row.time = {c[1] / n, c[2] / n, c[3] / n, c[4] / n, c[5] / n, c[6] / n, c[7] / n};
        if (o.profile) {
          // Kernel categories: mean over ranks and timed steps, like the time split.
          std::array<float, kOpCategories> mine{};
          for (int k = 0; k < kOpCategories; ++k)
            mine[k] = static_cast<float>(L.profile.seconds(static_cast<OpCategory>(k)));
          std::vector<float> all(kOpCategories * static_cast<size_t>(W));
          world->AllGather(mine.data(), all.data(), kOpCategories, DType::kF32);
          StepProfile& p = row.profile;
          for (int r = 0; r < W; ++r)
            for (int k = 0; k < kOpCategories; ++k) p.kernels[k] += all[kOpCategories * r + k] / n;
          p.time = row.time;
          p.step_s = row.time.compute + row.time.comm_wait + row.time.copy + row.time.cast +
                     row.time.add + row.time.optimizer + row.time.other;
          p.profiled = L.profile.total() > 0;
        }
        row.median_s = Median(L.secs);
        row.step_s = L.secs;
        const double tokens = static_cast<double>(o.microbatches) * B * T * W;
        row.tokens_per_s = tokens / row.median_s;
        row.flops_per_token = L.model->FlopsPerToken();
        row.mfu = row.flops_per_token * row.tokens_per_s / (peak * W);
        for (const auto& [cat, u] : L.engine->memory().by_category())
          row.accounted_by_category[cat] = u.peak / 1048576.0;
        float mem = static_cast<float>(L.engine->memory().peak_total() / 1048576.0);
        std::vector<float> allm(static_cast<size_t>(W));
        world->AllGather(&mem, allm.data(), 1, DType::kF32);
        for (int r = 0; r < W; ++r)
          row.accounted_mib = std::max(row.accounted_mib, static_cast<double>(allm[r]));
        L.engine.reset();
        L.model.reset();
        malloc_trim(0);
      };
      {
        // Prime one-time process costs (GEMM primitive caches, communicator buffers, the
        // allocator's arenas) so they land in the baseline, not in the first row.
        std::unique_ptr<Model> m = MakeModel(o, gc, qkv.front());
        Engine e(*m, *world, configs.front().second);
        e.InitWeights(o.seed);
        e.Step([&](int mb, int32_t* tok, int32_t* tgt) {
          data.Batch(SampleIndex(0, mb, o.microbatches, rank, W, 0, B), B, T, tok, tgt);
        });
      }
      malloc_trim(0);
      const double base_rss = CurrentRssMiB();
      for (size_t ci = 0; ci < configs.size(); ++ci) {
        const auto& [label, cfg] = configs[ci];
        Live& L = live[ci];
        Row& row = L.row;
        row.batch = B;
        row.label = label;
        row.switches = cfg.redundancies.ToString();
        row.layout = ShardLayoutName(cfg.shard_layout);
        row.qkv = QkvModelName(qkv[ci]);
        malloc_trim(0);
        ResetPeakRss();
        const double rss0 = CurrentRssMiB();
        make_model(L, ci);
        L.engine = std::make_unique<Engine>(*L.model, *world, cfg);
        Engine& engine = *L.engine;
        engine.InitWeights(o.seed);
        if (!peer_dir.empty() && ci == 0) {
          auto w = engine.GatherMainWeights();  // collective
          if (rank == 0) {
            std::filesystem::create_directories(peer_dir);
            std::map<std::string, SafeTensor> t;
            for (const UpdateParam& u : engine.UpdateParams()) t[u.name] = {u.shape, w.at(u.name)};
            WriteSafetensors(peer_dir + "/init.safetensors", t, {{"format", "sshsdp"}});
            // Token batches of every step as the ranks read them: [S, M, W, B, T].
            const size_t per = static_cast<size_t>(B) * T;
            std::vector<int32_t> tok(per * total_steps * o.microbatches * W), tgt(tok.size());
            size_t at = 0;
            for (int s = 0; s < total_steps; ++s)
              for (int mb = 0; mb < o.microbatches; ++mb)
                for (int r = 0; r < W; ++r, at += per)
                  data.Batch(SampleIndex(s, mb, o.microbatches, r, W, 0, B), B, T, tok.data() + at,
                             tgt.data() + at);
            std::ofstream f(peer_dir + "/batches.bin", std::ios::binary | std::ios::trunc);
            f.write(reinterpret_cast<const char*>(tok.data()), tok.size() * 4);
            f.write(reinterpret_cast<const char*>(tgt.data()), tgt.size() * 4);
            SSHSDP_CHECK(f.good(), IoError, "{}/batches.bin: write failed", peer_dir);
          }
        }
        for (int s = 0; s < o.warmup; ++s) run_step(L, false);
        float rss = static_cast<float>(base_rss + PeakRssMiB() - rss0);
        std::vector<float> allr(static_cast<size_t>(W));
        world->AllGather(&rss, allr.data(), 1, DType::kF32);
        for (int r = 0; r < W; ++r)
          row.rss_mib = std::max(row.rss_mib, static_cast<double>(allr[r]));
        if (o.sequential) {
          for (int s = 0; s < o.steps; ++s) run_step(L, true);
          finish(L);
        } else {
          // Isolated peak measured: free it, so the next configuration's peak is its own.
          L.engine.reset();
          L.model.reset();
        }
      }
      if (!o.sequential) {
        for (size_t ci = 0; ci < configs.size(); ++ci) {  // rebuild, same warm-up, then time
          Live& L = live[ci];
          make_model(L, ci);
          L.engine = std::make_unique<Engine>(*L.model, *world, configs[ci].second);
          L.engine->InitWeights(o.seed);
          L.cur = 0;
          L.row.losses.clear();
          for (int s = 0; s < o.warmup; ++s) run_step(L, false);
        }
        // Each round starts at the next configuration: the first of a round runs measurably
        // slower here (a few %, after the previous round's last engine evicted its memory),
        // and rotating spreads that over all configurations instead of biasing one.
        const size_t n = live.size();
        for (int s = 0; s < o.steps; ++s)
          for (size_t i = 0; i < n; ++i) run_step(live[(static_cast<size_t>(s) + i) % n], true);
        for (Live& L : live) finish(L);
      }
      std::vector<Row> rows;
      for (Live& L : live) rows.push_back(std::move(L.row));
      // Ratios against the first sshsdp row; else the first row with every switch off (the
      // ladder's last rung, an sshsdp+direct row); else the first row — named in the output.
      const Row* ref_row = nullptr;
      for (const Row& r : rows)
        if (!ref_row && r.label == "sshsdp") ref_row = &r;
      for (const Row& r : rows)
        if (!ref_row && r.switches == "none") ref_row = &r;
      if (!ref_row) ref_row = &rows.front();
      const double ref = ref_row->tokens_per_s;
      const std::vector<double> ref_steps = ref_row->step_s;
      const std::string ref_label = ref_row->label;
      for (Row& r : rows) {
        r.ratio = r.tokens_per_s / ref;
        r.reference = ref_label;
        // Paired: steps of one round ran next to each other, so their ratio cancels the slow
        // drifts of a shared machine that a ratio of two medians keeps.
        std::vector<double> q;
        for (size_t i = 0; !o.sequential && i < r.step_s.size() && i < ref_steps.size(); ++i)
          q.push_back(ref_steps[i] / r.step_s[i]);
        r.has_paired = !q.empty();
        r.ratio_paired = r.has_paired ? Median(q) : r.ratio;
      }
      const int64_t tpm = static_cast<int64_t>(B) * T;
      if (rank == 0) {
        fmt::print(
            "\nworkload: {} tokens per microbatch per rank (batch {} x seq {}), {} microbatches, "
            "{} ranks\n",
            tpm, B, T, o.microbatches, W);
        // The config column is as wide as its longest label (ablation rungs are long);
        // width counts code points, like fmt's padding of the ①–⑦ labels.
        auto label_of = [](const Row& r) {
          return fmt::format("{} ({}, {}, {})", r.label, r.switches, r.layout, r.qkv);
        };
        size_t lw = 30;
        for (const Row& r : rows) {
          const std::string l = label_of(r);
          lw = std::max<size_t>(lw, std::count_if(l.begin(), l.end(), [](char ch) {
                                  return (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
                                }));
        }
        fmt::print(
            "{:<{}} {:>9} {:>7} {:>6} {:>8} {:>8} {:>10} {:>10} {:>10} | {:>7} {:>7} {:>7} {:>7} "
            "{:>7} {:>7} {:>7}\n",
            "config (switches, layout)", lw, "tok/s", "ratio", "MFU%", "RSS MiB", "acct MiB",
            "copyW KiB", "copyG KiB", "comm KiB", "compute", "commwt", "copy", "cast", "add",
            "optim", "other");
        const double l0 = rows.front().losses.empty() ? 0 : rows.front().losses[0];
        double worst = 0;
        for (const Row& r : rows) {
          const CopyBytes& c = r.counters.copies;
          const double comm =
              static_cast<double>(r.counters.runtime_comm.total() + r.counters.update_comm.total());
          fmt::print(
              "{:<{}} {:>9.0f} {:>6.2f}x {:>6.2f} {:>8.1f} {:>8.2f} {:>10.1f} {:>10.1f} {:>10.1f} "
              "| {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f}\n",
              label_of(r), lw, r.tokens_per_s, r.ratio, 100 * r.mfu, r.rss_mib, r.accounted_mib,
              (c.weight_copy_in + c.weight_copy_out + c.weight_pack) / 1024.0,
              (c.grad_copy + c.grad_unpack) / 1024.0, comm / 1024.0, 1e3 * r.time.compute,
              1e3 * r.time.comm_wait, 1e3 * r.time.copy, 1e3 * r.time.cast, 1e3 * r.time.add,
              1e3 * r.time.optimizer, 1e3 * r.time.other);
          if (!r.losses.empty() && l0 != 0)
            worst = std::max(worst, std::abs(r.losses[0] - l0) / std::abs(l0));
        }
        fmt::print(
            "(times: ms per step, mean over ranks; copies and comm: per step, rank 0, comm = "
            "bytes sent intra+inter node; first-step losses agree within {:.1e} relative; "
            "ratios: tok/s over the '{}' row)\n",
            worst, ref_label);
        if (!o.sequential) {
          std::vector<std::string> pr;
          for (const Row& r : rows)
            pr.push_back(fmt::format("{} {:.2f}x", r.label, r.ratio_paired));
          fmt::print("paired ratios (median over rounds of the per-round tok/s ratio): {}\n",
                     fmt::join(pr, ", "));
        }
        if (o.profile) {
          std::vector<std::pair<std::string, StepProfile>> prof;
          for (const Row& r : rows) prof.emplace_back(r.label, r.profile);
          fmt::print("{}", StepProfileTable(prof));
        }
        if (muon) {
          // The update phase: optimizer time, Newton–Schulz work and update bytes per rank.
          fmt::print(
              "\nupdate phase (Muon per {}; rank 0, per step):\n{:<30} {:>9} {:>16} {:>10} "
              "{:>12} {:>12} {:>10}\n",
              o.muon_unit, "config", "optim ms", "planned NS GFLOP", "update KiB", "p2p KiB",
              "gather KiB", "copy KiB");
          for (const Row& r : rows) {
            const StepCounters& k = r.counters;
            fmt::print("{:<30} {:>9.1f} {:>16.3f} {:>10.1f} {:>12.1f} {:>12.1f} {:>10.1f}\n",
                       r.label, 1e3 * r.time.optimizer, k.update_exec_cost / 1e9,
                       k.update_comm.total() / 1024.0, k.update_p2p.total() / 1024.0,
                       k.update_full_tensor.total() / 1024.0, k.copies.update_copy / 1024.0);
          }
        }
        for (const Row& r : rows) {
          out.push_back(RowJson(r, tpm));
          out.back()["gemm_path"] = gemm_peak.path;
          out.back()["gemm_peak_flops"] = peak;
          out.back()["gemm_peak_pinned"] = gemm_peak.pinned;
        }
        if (!peer_dir.empty()) {
          nlohmann::json wl = {{"model", PeerModelJson(o, gc)},
                               {"T", T},
                               {"batch_size", B},
                               {"microbatches", o.microbatches},
                               {"world", W},
                               {"warmup", o.warmup},
                               {"steps", o.steps},
                               {"weight_dtype", o.weight_dtype},
                               {"attention_dtype", o.attention_dtype},
                               {"adamw",
                                {{"lr", o.lr},
                                 {"beta1", o.beta1},
                                 {"beta2", o.beta2},
                                 {"eps", o.eps},
                                 {"weight_decay", o.weight_decay}}},
                               {"clip", o.clip},
                               {"gemm_peak_flops", peak},
                               {"flops_per_token", rows.front().flops_per_token},
                               {"rows", nlohmann::json::array()}};
          for (const Row& r : rows) wl["rows"].push_back(RowJson(r, tpm));
          std::ofstream f(peer_dir + "/workload.json", std::ios::trunc);
          f << wl.dump(2) << "\n";
          SSHSDP_CHECK(f.good(), IoError, "{}/workload.json: write failed", peer_dir);
        }
      }
    }
    if (!o.trace.empty()) {
      WriteTraceFile(tracer, *world, o.trace, trace_rows);  // collective
      if (rank == 0) fmt::print("wrote {} ({} rows)\n", o.trace, trace_rows.size());
    }
    if (rank == 0 && !o.json.empty()) {
      std::ofstream f(o.json, std::ios::trunc);
      SSHSDP_CHECK(f.good(), IoError, "--json {}: cannot open for writing: {}", o.json,
                   std::strerror(errno));
      f << out.dump(2) << "\n";
      fmt::print("wrote {}\n", o.json);
    }
    return 0;
  });
}

}  // namespace sshsdp
