// `sshsdp train`'s loop (train_internal.h): per step the learning rate, the engine's step, a
// validation when due, the figures of the slowest rank, the progress line and metrics line,
// a checkpoint when due or asked for by a stop signal; after the last step the trace,
// --save-weights and the memory report.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/cli/process_memory.h"
#include "sshsdp/cli/stop_signal.h"
#include "sshsdp/cli/train_internal.h"
#include "sshsdp/engine/plan.h"

namespace sshsdp {
namespace {

// "42 s", "12m05s", "3h07m".
std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

// How many validation batches of W x B x T tokens --eval-tokens asks for, capped at one pass
// over --val-data, or at a fixed budget of held-out samples of the training source.
int ValidationBatches(const TrainRun& run, int W, int rank) {
  const TrainOptions& o = run.o;
  const int B = run.cfg.batch_size, T = run.T;
  const int64_t step_tokens = int64_t{W} * B * T;
  int batches =
      static_cast<int>(std::min<int64_t>(1 << 20, (o.eval_tokens + step_tokens - 1) / step_tokens));
  if (o.eval_every <= 0) return batches;
  std::string what;
  int64_t cap = 0;
  if (const auto* file = dynamic_cast<const TokenFile*>(run.val.get())) {
    // More than the file holds would only repeat its samples.
    cap = std::max<int64_t>(1, file->num_tokens() / step_tokens);
    what = fmt::format("--val-data's {} tokens", file->num_tokens());
  } else if (!run.val) {
    constexpr int64_t kHeldOutTokens = int64_t{1} << 22;
    cap = std::max<int64_t>(1, kHeldOutTokens / step_tokens);
    what = fmt::format(
        "the {} tokens validated on held-out samples of the training source (no --val-data)",
        kHeldOutTokens);
  }
  if (cap > 0 && batches > cap) {
    if (rank == 0)
      fmt::print(
          "note: --eval-tokens {} exceeds {}: validating on {} ({} batches of {} x {} x {} "
          "tokens)\n",
          o.eval_tokens, what, cap * step_tokens, cap, W, B, T);
    batches = static_cast<int>(cap);
  }
  return batches;
}

// A step's figures over the ranks: the slowest rank's time, the largest memory, and the stop
// signal any rank received (so every rank stops after the same step).
struct StepFigures {
  float seconds = 0, rss_mib = 0, accounted_mib = 0;
  int stop_signal = 0;
};

StepFigures GatherFigures(const StepStats& st, const Engine& engine, Communicator& world) {
  const int W = world.size();
  float local[4] = {static_cast<float>(st.seconds), static_cast<float>(PeakRssMiB()),
                    static_cast<float>(engine.memory().peak_total() / 1048576.0),
                    static_cast<float>(PendingStopSignal())};
  std::vector<float> all(4 * static_cast<size_t>(W));
  world.AllGather(local, all.data(), 4, DType::kF32);
  StepFigures f;
  for (int r = 0; r < W; ++r) {
    f.seconds = std::max(f.seconds, all[4 * r]);
    f.rss_mib = std::max(f.rss_mib, all[4 * r + 1]);
    f.accounted_mib = std::max(f.accounted_mib, all[4 * r + 2]);
    if (all[4 * r + 3] != 0 && f.stop_signal == 0) f.stop_signal = static_cast<int>(all[4 * r + 3]);
  }
  return f;
}

// One step as the progress line and the metrics line report it.
struct StepReport {
  int64_t step = 0;  // 1-based
  const StepStats* st = nullptr;
  StepFigures fig;
  float lr = 0;
  double tps = 0, mfu = 0, ema = 0, val_loss = std::nan(""), val_seconds = 0;
};

nlohmann::json MetricsLine(const StepReport& r) {
  const StepStats& st = *r.st;
  const StepCounters& c = st.counters;
  nlohmann::json j = {{"step", r.step},
                      {"loss", st.loss},
                      {"grad_norm", st.grad_norm},
                      {"lr", r.lr},
                      {"step_seconds", r.fig.seconds},
                      {"tokens", st.tokens},
                      {"tokens_per_s", r.tps},
                      {"mfu", r.mfu},
                      {"peak_rss_mib", r.fig.rss_mib},
                      {"accounted_peak_mib", r.fig.accounted_mib},
                      {"runtime_comm_intra_bytes", c.runtime_comm.intra_node_bytes},
                      {"runtime_comm_inter_bytes", c.runtime_comm.inter_node_bytes},
                      {"update_comm_intra_bytes", c.update_comm.intra_node_bytes},
                      {"update_comm_inter_bytes", c.update_comm.inter_node_bytes},
                      {"bytes_copied", c.bytes_copied},
                      {"collective_copy_bytes", c.collective_copy_bytes},
                      {"add_passes", c.add_passes},
                      {"weight_preps", c.weight_preps},
                      {"gathers", c.gathers},
                      {"outer_overlapped", c.outer_overlapped},
                      {"update_p2p_bytes", c.update_p2p.total()},
                      {"staged_bytes", c.staged_bytes},
                      {"backend_events", c.backend_events},
                      {"backend_waits", c.backend_waits}};
  if (st.skipped) j["skipped"] = true;
  if (!std::isnan(r.val_loss)) j["val_loss"] = r.val_loss;
  return j;
}

// The loop's state between steps and what reports need of the run.
class Loop {
 public:
  Loop(TrainRun& run, const TrainLoop& l)
      : run_(run), o_(run.o), l_(l), W_(l.world->size()), rank_(l.world->rank()) {}

  int Run();

 private:
  BatchFn TrainBatches();
  BatchFn ValidationBatchFn(int batches) const;
  void OpenMetrics();
  void Report(const StepReport& r, int64_t skipped);
  void Save(int64_t step, double val_loss);
  void PrintStopped(int signal, int64_t step) const;
  void Finish();

  TrainRun& run_;
  const TrainOptions& o_;
  const TrainLoop& l_;
  const int W_, rank_;
  int64_t cur_ = 0;
  std::ofstream metrics_;
  std::chrono::steady_clock::time_point t0_;
};

// The run's batches: global samples from where the data stopped; --fault wraps them.
BatchFn Loop::TrainBatches() {
  const int M = run_.cfg.microbatches, B = run_.cfg.batch_size, T = run_.T;
  BatchFn batch = [this, M, B, T](int mb, int32_t* tok, int32_t* tgt) {
    run_.data->Batch(l_.first_sample + SampleIndex(cur_ - l_.start, mb, M, rank_, W_, 0, B), B, T,
                     tok, tgt);
  };
  return WithFault(run_.fault, rank_, &cur_, std::move(batch));
}

// Validation: the same samples every time — of --val-data, or of the synthetic source far
// beyond any training index.
BatchFn Loop::ValidationBatchFn(int batches) const {
  const TokenSource* source = run_.val ? run_.val.get() : run_.data.get();
  const int64_t base = run_.val ? 0 : int64_t{1} << 40;
  const int B = run_.cfg.batch_size, T = run_.T, W = W_, rank = rank_;
  return [=](int i, int32_t* tok, int32_t* tgt) {
    source->Batch(base + SampleIndex(0, i, batches, rank, W, 0, B), B, T, tok, tgt);
  };
}

void Loop::OpenMetrics() {
  if (rank_ != 0 || o_.metrics.empty()) return;
  // A resumed run continues the history it was given instead of erasing it.
  metrics_.open(o_.metrics, run_.resume_dir.empty() ? std::ios::trunc : std::ios::app);
  SSHSDP_CHECK(metrics_.good(), IoError, "--metrics {}: cannot open for writing: {}", o_.metrics,
               std::strerror(errno));
}

// Rank 0: the progress line (every --log-every steps, the first and last, and with a
// validation loss), the skipped-step line, the metrics line.
void Loop::Report(const StepReport& r, int64_t skipped) {
  const StepStats& st = *r.st;
  if (st.skipped) {
    fmt::print(
        "step {:>5}/{} | skipped: non-finite loss or gradient norm (loss {}, gradient norm {}); "
        "weights and optimizer state unchanged ({} skipped so far)\n",
        r.step, o_.steps, st.loss, st.grad_norm, skipped);
    std::fflush(stdout);
  } else if (r.step % o_.log_every == 0 || r.step == 1 || r.step == o_.steps ||
             !std::isnan(r.val_loss)) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const double eta =
        elapsed / static_cast<double>(r.step - l_.start) * static_cast<double>(o_.steps - r.step);
    fmt::print(
        "step {:>5}/{} | loss {:.4f} (ema {:.4f}){} | norm {:.3f} | lr {:.2e} | {:.0f} tok/s | "
        "MFU {} | mem {:.1f} MiB accounted, {:.0f} MiB peak RSS | {:.0f} ms | elapsed {} ETA {}\n",
        r.step, o_.steps, st.loss, r.ema,
        std::isnan(r.val_loss) ? ""
                               : fmt::format(" | val {:.4f} ({:.1f} s)", r.val_loss, r.val_seconds),
        st.grad_norm, r.lr, r.tps, FormatMfu(r.mfu, l_.gemm_peak.pinned), r.fig.accounted_mib,
        r.fig.rss_mib, 1000 * r.fig.seconds, FormatDuration(elapsed), FormatDuration(eta));
    std::fflush(stdout);
  }
  if (!metrics_.is_open()) return;
  metrics_ << MetricsLine(r).dump() << "\n";
  metrics_.flush();
  SSHSDP_CHECK(metrics_.good(), IoError, "--metrics {}: write failed at step {} (disk full?): {}",
               o_.metrics, r.step, std::strerror(errno));
}

// A checkpoint after `step` (1-based). Never a state that is not finite (a huge learning rate
// can make the weights Inf while this step's loss was still finite): the older ones stay.
void Loop::Save(int64_t step, double val_loss) {
  Engine& engine = *l_.engine;
  SSHSDP_CHECK(engine.StateIsFinite(), NonFiniteError,
               "step {}: the weights or optimizer state are not finite; checkpoint not written "
               "(the earlier ones in {} are kept; lower --lr or set --clip)",
               step, o_.ckpt_dir);
  const int64_t per_step = int64_t{run_.cfg.microbatches} * W_ * run_.cfg.batch_size;
  // The data position is the loop's step (SampleIndex; the engine's step lags it by skipped
  // steps); the seed fixes the data source and the initial weights; sr_seed and the step fix
  // the bf16sr rounding stream.
  CheckpointMeta meta{run_.model_json,
                      run_.run_json,
                      {{"data_position", step},
                       {"data_samples", l_.first_sample + (step - l_.start) * per_step},
                       {"seed", o_.seed},
                       {"sr_seed", engine.config().sr_seed}}};
  // A validation loss of this very step: pruning keeps the best such checkpoint.
  if (!std::isnan(val_loss)) meta.scalars["val_loss"] = val_loss;
  SaveResult s = SaveCheckpoint(engine, *l_.world, o_.ckpt_dir, meta, {o_.keep, o_.ckpt_fault});
  if (rank_ != 0) return;
  fmt::print("saved {} ({} files, {} bytes, {:.3f} s){}\n", s.dir, s.files, s.bytes, s.seconds,
             s.pruned.empty() ? "" : fmt::format("; pruned {}", fmt::join(s.pruned, ", ")));
  std::fflush(stdout);
}

void Loop::PrintStopped(int signal, int64_t step) const {
  if (rank_ != 0) return;
  fmt::print(stderr, "sshsdp: {} received: stopped after step {}{}; exiting with {}\n",
             strsignal(signal), step,
             o_.ckpt_dir.empty() ? " (no --ckpt-dir: nothing saved)"
                                 : fmt::format(", checkpoint saved in {}", o_.ckpt_dir),
             128 + signal);
  std::fflush(stderr);
}

int Loop::Run() {
  Engine& engine = *l_.engine;
  const BatchFn batch = TrainBatches();
  const int val_batches = ValidationBatches(run_, W_, rank_);
  const BatchFn val_batch = ValidationBatchFn(val_batches);
  OpenMetrics();
  if (run_.cfg.tracer) StartTrace(run_.tracer, *l_.world);  // aligned clocks (collective)
  t0_ = std::chrono::steady_clock::now();
  double ema = 0;
  int64_t skipped = 0;  // steps left out under --on-nonfinite skip
  SetTraining(true);
  for (cur_ = l_.start; cur_ < o_.steps; ++cur_) {
    StepReport r;
    r.step = cur_ + 1;
    const double factor = run_.schedule.Factor(cur_);
    r.lr = static_cast<float>(o_.lr * factor);
    engine.SetLearningRate(r.lr);
    engine.SetMuonLearningRate(static_cast<float>(o_.muon_lr * factor));
    run_.tracer.Enable(run_.cfg.tracer && run_.trace_window.Contains(r.step));
    const StepStats st = engine.Step(batch);
    r.st = &st;
    if (o_.eval_every > 0 && (r.step % o_.eval_every == 0 || r.step == o_.steps)) {
      const auto v0 = std::chrono::steady_clock::now();
      r.val_loss = engine.Evaluate(val_batch, val_batches);  // collective
      r.val_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - v0).count();
    }
    r.fig = GatherFigures(st, engine, *l_.world);
    r.tps = st.tokens / r.fig.seconds;
    r.mfu = l_.model->FlopsPerToken() * r.tps / (l_.gemm_peak.per_rank * W_);
    if (!st.skipped)
      ema = cur_ == l_.start || skipped == cur_ - l_.start ? st.loss : 0.9 * ema + 0.1 * st.loss;
    r.ema = ema;
    skipped += st.skipped;
    if (rank_ == 0) Report(r, skipped);
    const bool stopping = r.fig.stop_signal != 0;
    // Every --save-every steps, on a stop signal, and after the last step (as TorchTitan does:
    // a --ckpt-dir without --save-every, or one not dividing --steps, still ends with the
    // final state saved).
    if ((o_.save_every > 0 && r.step % o_.save_every == 0) ||
        (!o_.ckpt_dir.empty() && (stopping || r.step == o_.steps)))
      Save(r.step, r.val_loss);
    if (stopping) {
      PrintStopped(r.fig.stop_signal, r.step);
      return 128 + r.fig.stop_signal;
    }
  }
  Finish();
  return 0;
}

// The trace, --save-weights and the memory report (with what `sshsdp plan` predicted).
void Loop::Finish() {
  Engine& engine = *l_.engine;
  if (run_.cfg.tracer) {
    run_.tracer.Enable(false);
    std::vector<std::string> rows;
    for (int r = 0; r < W_; ++r) rows.push_back(fmt::format("rank {}", r));
    WriteTraceFile(run_.tracer, *l_.world, o_.trace, rows);  // collective
    if (rank_ == 0)
      fmt::print("wrote {} (steps {}-{}; {} spans on rank 0)\n", o_.trace, run_.trace_window.first,
                 std::min<int64_t>(run_.trace_window.last, o_.steps), run_.tracer.size());
  }
  if (!o_.save_weights.empty()) {
    SSHSDP_CHECK(engine.StateIsFinite(), NonFiniteError,
                 "the final weights or optimizer state are not finite; --save-weights {} not "
                 "written",
                 o_.save_weights);
    auto w = engine.GatherMainWeights();  // collective
    if (rank_ == 0) {
      std::map<std::string, SafeTensor> t;
      for (const UpdateParam& u : engine.UpdateParams()) t[u.name] = {u.shape, w.at(u.name)};
      WriteSafetensors(o_.save_weights, t,
                       {{"format", "sshsdp"},
                        {"preset", o_.model},
                        {"model", run_.model_json.dump()},
                        {"steps", std::to_string(o_.steps)},
                        {"layout", engine.topology().ToString()},
                        {"tokenizer", run_.tokenizer}});
      fmt::print("wrote {} ({} update parameters)\n", o_.save_weights, t.size());
    }
  }
  if (rank_ != 0) return;
  fmt::print("memory per rank (accounted, rank 0):");
  for (const auto& [cat, u] : engine.memory().by_category())
    fmt::print(" {} {:.2f} MiB;", cat, u.peak / 1048576.0);
  // What `sshsdp plan` predicted for this rank (the same construction code, run without
  // communicators; activations are the model's own and not planned).
  if (run_.cfg.comm_path == CommPath::kCollective) {
    try {  // a report only: the run has finished, whatever happens here
      const RunPlan plan = PlanRun(*l_.model, W_, run_.cfg);
      fmt::print("\nplanned (sshsdp plan, rank 0):");
      for (const auto& [cat, bytes] : plan.ranks[0].memory)
        fmt::print(" {} {:.2f} MiB;", cat, bytes / 1048576.0);
    } catch (const Error& e) {
      fmt::print("\nno plan of this run: {}", e.what());
    }
  }
  fmt::print("\n");
}

}  // namespace

int RunTrainLoop(TrainRun& run, const TrainLoop& loop) { return Loop(run, loop).Run(); }

}  // namespace sshsdp
