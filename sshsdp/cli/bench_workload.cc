// One workload of `sshsdp bench` (bench_internal.h): its configurations (presets × comm paths ×
// outer overlap, or the ablation ladder), each built, warmed up and timed, then ratios.
//
// Phase 1, per configuration alone: build, init, warm-up steps; its RSS peak is the process
// baseline plus the growth during its own build and warm-up (then it is freed). Phase 2: all
// configurations rebuilt and warmed up again, then the timed steps round-robin over them, each
// round starting one configuration later (or each back to back with --sequential, without the
// rebuild), so load changes on a shared machine hit every configuration alike.
#include <malloc.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>

#include "sshsdp/base/bench_util.h"
#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/cli/bench_internal.h"
#include "sshsdp/cli/process_memory.h"

namespace sshsdp {
namespace {

struct Config {
  std::string label;
  EngineConfig cfg;
  QkvModel qkv;  // the QKV its users write
};

// The workload's configurations on batch size B.
std::vector<Config> Configs(const BenchRun& run, int B) {
  const BenchOptions& o = run.o;
  EngineConfig wb = run.base;
  wb.batch_size = B;
  wb.comm_path = ParseCommPath(o.comm_paths.front());
  std::vector<Config> out;
  if (o.ablation) {
    const QkvModel q = PresetQkvModel("sshsdp", run.base.optimizer, run.base.muon_unit);
    for (auto& [label, c] : AblationLadder(wb)) out.push_back({label, c, q});
    return out;
  }
  for (const std::string& p : run.presets) {
    for (const std::string& path : o.comm_paths) {
      for (const std::string& overlap : o.overlap_outer) {
        EngineConfig c = wb;
        ApplyPreset(p, &c);
        c.comm_path = ParseCommPath(path);
        c.overlap_outer = overlap == "on";
        out.push_back({(c.comm_path == CommPath::kDirect ? p + "+direct" : p) +
                           (c.overlap_outer ? "" : "/outer-sync"),
                       c, PresetQkvModel(p, run.base.optimizer, run.base.muon_unit)});
      }
    }
  }
  return out;
}

// A configuration while it runs.
struct Live {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  BenchRow row;
  int64_t cur = 0;
  std::vector<double> secs, cat_sum = std::vector<double>(8, 0.0);
  bool traced = false;
  OpProfile profile;  // --profile: the model's kernels, timed steps only
};

class Workload {
 public:
  Workload(const BenchJob& job, int B, bool traced)
      : job_(job),
        o_(job.run->o),
        B_(B),
        T_(job.run->T),
        W_(job.world->size()),
        rank_(job.world->rank()),
        tracing_(traced),
        configs_(Configs(*job.run, B)),
        live_(configs_.size()) {}

  std::vector<BenchRow> Run();

 private:
  void Build(size_t ci);
  void Step(Live& L, bool timed);
  void Finish(Live& L);
  void PrimeProcess();
  void MeasureAlone(size_t ci, double base_rss);
  void TimeRoundRobin();
  void WritePeerInputs(Engine& engine) const;

  const BenchJob& job_;
  const BenchOptions& o_;
  const int B_, T_, W_, rank_;
  const bool tracing_;  // one traced step per configuration
  std::vector<Config> configs_;
  std::vector<Live> live_;
};

void Workload::Build(size_t ci) {
  Live& L = live_[ci];
  L.model = MakeBenchModel(o_, job_.run->gc, configs_[ci].qkv);
  if (o_.profile) L.model->SetOpProfile(&L.profile);
  EngineConfig cfg = configs_[ci].cfg;
  if (tracing_) cfg.tracer = job_.tracer;
  L.engine = std::make_unique<Engine>(*L.model, *job_.world, cfg);
  L.engine->InitWeights(o_.seed);
  L.cur = 0;
  L.row.losses.clear();
}

// One step of a configuration; a timed one records the slowest rank's time and the mean time
// split over ranks.
void Workload::Step(Live& L, bool timed) {
  const int M = o_.microbatches;
  BatchFn batch = [&](int mb, int32_t* tok, int32_t* tgt) {
    job_.data->Batch(SampleIndex(L.cur, mb, M, rank_, W_, 0, B_), B_, T_, tok, tgt);
  };
  const bool trace = tracing_ && timed && !L.traced;  // a row per configuration and rank
  job_.tracer->SetProcess(static_cast<int>(&L - live_.data()) * W_ + rank_);
  job_.tracer->Enable(trace);
  StepStats st = L.engine->Step(batch);
  job_.tracer->Enable(false);
  L.traced = L.traced || trace;
  ++L.cur;
  constexpr int kF = 8;  // seconds + 7 categories
  const TimeSplit& t = st.time;
  float local[kF] = {static_cast<float>(st.seconds),  static_cast<float>(t.compute),
                     static_cast<float>(t.comm_wait), static_cast<float>(t.copy),
                     static_cast<float>(t.cast),      static_cast<float>(t.add),
                     static_cast<float>(t.optimizer), static_cast<float>(t.other)};
  std::vector<float> all(kF * static_cast<size_t>(W_));
  job_.world->AllGather(local, all.data(), kF, DType::kF32);
  L.row.losses.push_back(st.loss);
  if (!timed) {
    L.profile.Reset();
    return;
  }
  double slowest = 0;
  for (int r = 0; r < W_; ++r) {
    slowest = std::max(slowest, static_cast<double>(all[kF * r]));
    for (int k = 1; k < kF; ++k) L.cat_sum[k] += all[kF * r + k];
  }
  L.secs.push_back(slowest);
  L.row.counters = st.counters;
}

// Kernel categories (--profile): mean over ranks and timed steps, like the time split.
void GatherProfile(const OpProfile& mine_profile, double n, Communicator& world, BenchRow* row) {
  const int W = world.size();
  std::array<float, kOpCategories> mine{};
  for (int k = 0; k < kOpCategories; ++k)
    mine[k] = static_cast<float>(mine_profile.seconds(static_cast<OpCategory>(k)));
  std::vector<float> all(kOpCategories * static_cast<size_t>(W));
  world.AllGather(mine.data(), all.data(), kOpCategories, DType::kF32);
  StepProfile& p = row->profile;
  for (int r = 0; r < W; ++r)
    for (int k = 0; k < kOpCategories; ++k) p.kernels[k] += all[kOpCategories * r + k] / n;
  const TimeSplit& t = row->time;
  p.time = t;
  p.step_s = t.compute + t.comm_wait + t.copy + t.cast + t.add + t.optimizer + t.other;
  p.profiled = mine_profile.total() > 0;
}

// The configuration's figures from its timed steps; then its model and engine are freed.
void Workload::Finish(Live& L) {
  BenchRow& row = L.row;
  const double n = static_cast<double>(o_.steps) * W_;
  const auto& c = L.cat_sum;
  row.time = {c[1] / n, c[2] / n, c[3] / n, c[4] / n, c[5] / n, c[6] / n, c[7] / n};
  if (o_.profile) GatherProfile(L.profile, n, *job_.world, &row);
  row.median_s = Median(L.secs);
  row.step_s = L.secs;
  const double tokens = static_cast<double>(o_.microbatches) * B_ * T_ * W_;
  row.tokens_per_s = tokens / row.median_s;
  row.flops_per_token = L.model->FlopsPerToken();
  row.mfu = row.flops_per_token * row.tokens_per_s / (job_.gemm_peak.per_rank * W_);
  for (const auto& [cat, u] : L.engine->memory().by_category())
    row.accounted_by_category[cat] = u.peak / 1048576.0;
  float mem = static_cast<float>(L.engine->memory().peak_total() / 1048576.0);
  std::vector<float> all(static_cast<size_t>(W_));
  job_.world->AllGather(&mem, all.data(), 1, DType::kF32);
  for (int r = 0; r < W_; ++r) row.accounted_mib = std::max(row.accounted_mib, double(all[r]));
  L.engine.reset();
  L.model.reset();
  malloc_trim(0);
}

// One-time process costs (GEMM primitive caches, communicator buffers, the allocator's arenas)
// land in the baseline, not in the first row.
void Workload::PrimeProcess() {
  std::unique_ptr<Model> m = MakeBenchModel(o_, job_.run->gc, configs_.front().qkv);
  Engine e(*m, *job_.world, configs_.front().cfg);
  e.InitWeights(o_.seed);
  e.Step([&](int mb, int32_t* tok, int32_t* tgt) {
    job_.data->Batch(SampleIndex(0, mb, o_.microbatches, rank_, W_, 0, B_), B_, T_, tok, tgt);
  });
}

// --peer-inputs: the initial weights and every step's token batches as the ranks read them
// ([S, M, W, B, T]), for the PyTorch peers.
void Workload::WritePeerInputs(Engine& engine) const {
  const std::string dir = fmt::format("{}/b{}", o_.peer_inputs, B_);
  auto w = engine.GatherMainWeights();  // collective
  if (rank_ != 0) return;
  std::filesystem::create_directories(dir);
  std::map<std::string, SafeTensor> t;
  for (const UpdateParam& u : engine.UpdateParams()) t[u.name] = {u.shape, w.at(u.name)};
  WriteSafetensors(dir + "/init.safetensors", t, {{"format", "sshsdp"}});
  const int steps = o_.warmup + o_.steps, M = o_.microbatches;
  const size_t per = static_cast<size_t>(B_) * T_;
  std::vector<int32_t> tok(per * steps * M * W_), tgt(tok.size());
  size_t at = 0;
  for (int s = 0; s < steps; ++s)
    for (int mb = 0; mb < M; ++mb)
      for (int r = 0; r < W_; ++r, at += per)
        job_.data->Batch(SampleIndex(s, mb, M, r, W_, 0, B_), B_, T_, tok.data() + at,
                         tgt.data() + at);
  std::ofstream f(dir + "/batches.bin", std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(tok.data()), tok.size() * 4);
  f.write(reinterpret_cast<const char*>(tgt.data()), tgt.size() * 4);
  SSHSDP_CHECK(f.good(), IoError, "{}/batches.bin: write failed", dir);
}

// Phase 1 for one configuration: its isolated RSS peak (and, --sequential, its timed steps).
void Workload::MeasureAlone(size_t ci, double base_rss) {
  const Config& c = configs_[ci];
  Live& L = live_[ci];
  BenchRow& row = L.row;
  row.batch = B_;
  row.label = c.label;
  row.switches = c.cfg.redundancies.ToString();
  row.layout = ShardLayoutName(c.cfg.shard_layout);
  row.qkv = QkvModelName(c.qkv);
  malloc_trim(0);
  ResetPeakRss();
  const double rss0 = CurrentRssMiB();
  Build(ci);
  if (!o_.peer_inputs.empty() && ci == 0) WritePeerInputs(*L.engine);
  for (int s = 0; s < o_.warmup; ++s) Step(L, false);
  float rss = static_cast<float>(base_rss + PeakRssMiB() - rss0);
  std::vector<float> all(static_cast<size_t>(W_));
  job_.world->AllGather(&rss, all.data(), 1, DType::kF32);
  for (int r = 0; r < W_; ++r) row.rss_mib = std::max(row.rss_mib, static_cast<double>(all[r]));
  if (o_.sequential) {
    for (int s = 0; s < o_.steps; ++s) Step(L, true);
    Finish(L);
  } else {
    // Isolated peak measured: free it, so the next configuration's peak is its own.
    L.engine.reset();
    L.model.reset();
  }
}

// Phase 2: every configuration rebuilt with the same warm-up, then timed round-robin. Each
// round starts at the next configuration: the first of a round runs measurably slower here (a
// few %, after the previous round's last engine evicted its memory), and rotating spreads that
// over all configurations instead of biasing one.
void Workload::TimeRoundRobin() {
  for (size_t ci = 0; ci < configs_.size(); ++ci) {
    Build(ci);
    for (int s = 0; s < o_.warmup; ++s) Step(live_[ci], false);
  }
  const size_t n = live_.size();
  for (int s = 0; s < o_.steps; ++s)
    for (size_t i = 0; i < n; ++i) Step(live_[(static_cast<size_t>(s) + i) % n], true);
  for (Live& L : live_) Finish(L);
}

// Ratios against the first sshsdp row; else the first row with every switch off (the ladder's
// last rung, an sshsdp+direct row); else the first row — named in the output. Paired: steps
// of one round ran next to each other, so their ratio cancels the slow drifts of a shared
// machine that a ratio of two medians keeps.
void SetRatios(std::vector<BenchRow>& rows, bool sequential) {
  const BenchRow* ref_row = nullptr;
  for (const BenchRow& r : rows)
    if (!ref_row && r.label == "sshsdp") ref_row = &r;
  for (const BenchRow& r : rows)
    if (!ref_row && r.switches == "none") ref_row = &r;
  if (!ref_row) ref_row = &rows.front();
  const double ref = ref_row->tokens_per_s;
  const std::vector<double> ref_steps = ref_row->step_s;
  const std::string ref_label = ref_row->label;
  for (BenchRow& r : rows) {
    r.ratio = r.tokens_per_s / ref;
    r.reference = ref_label;
    std::vector<double> q;
    for (size_t i = 0; !sequential && i < r.step_s.size() && i < ref_steps.size(); ++i)
      q.push_back(ref_steps[i] / r.step_s[i]);
    r.has_paired = !q.empty();
    r.ratio_paired = r.has_paired ? Median(q) : r.ratio;
  }
}

std::vector<BenchRow> Workload::Run() {
  if (tracing_) {
    for (const Config& c : configs_)
      for (int r = 0; r < W_; ++r)
        job_.trace_rows->push_back(fmt::format("{} rank {}", c.label, r));
  }
  PrimeProcess();
  malloc_trim(0);
  const double base_rss = CurrentRssMiB();
  for (size_t ci = 0; ci < configs_.size(); ++ci) MeasureAlone(ci, base_rss);
  if (!o_.sequential) TimeRoundRobin();
  std::vector<BenchRow> rows;
  for (Live& L : live_) rows.push_back(std::move(L.row));
  SetRatios(rows, o_.sequential);
  return rows;
}

}  // namespace

std::vector<BenchRow> RunWorkload(const BenchJob& job, int B, bool traced) {
  return Workload(job, B, traced).Run();
}

}  // namespace sshsdp
