// Engine step: the one schedule of a training step (see engine.h) — per microbatch the
// forward with prefetched ZeRO-3 gathers, the backward with each group's reduce-scatter on the
// communication thread, then the update phase. Where the data meets the model (views for
// sshsdp, the baselines' copies) is the data path's business (engine_internal.h); the
// schedule is the same for every preset.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/direct_communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/engine_internal.h"
#include "sshsdp/kernels/elementwise.h"

namespace sshsdp {
namespace {

void Append(std::vector<TensorRef>* to, const std::vector<TensorRef>& more) {
  to->insert(to->end(), more.begin(), more.end());
}

// A communication-thread task inside a span of that lane, with the bytes the collective moved
// (its communicator's counters), when tracing.
std::function<void()> Traced(Tracer* t, const char* name, int group, Communicator* comm,
                             std::function<void()> task) {
  if (!t || !t->on()) return task;
  return [=, task = std::move(task)] {
    TraceSpan s(t, name, kTraceComm, {{"group", group}});
    const CommCounters c0 = comm->counters();
    task();
    s.Arg("bytes", static_cast<int64_t>(Delta(comm->counters(), c0).total()));
  };
}

}  // namespace

CommHandle Engine::SubmitComm(const char* name, int gi, Communicator* comm,
                              std::function<void()> task) {
  std::function<void()> traced = Traced(cfg_.tracer, name, gi, comm, std::move(task));
  counters_.backend_events++;
  Tracer* t = cfg_.tracer;
  return comm_thread_->Submit(
      [t, gi, ready = cfg_.backend->RecordEvent(), traced = std::move(traced)] {
        {
          TraceSpan s(t, "wait compute", kTraceComm, {{"group", gi}});
          ready->Wait();
        }
        traced();
      });
}

void Engine::StartOuterGather(int gi) {
  // The outer all-gather deferred from the last update phase, queued just before this group's
  // ZeRO-3 gather (which reads the Wᶻ³ it fills: the queue keeps that order).
  RuntimeGroup& g = *groups_[gi];
  if (!g.outer_gather_pending) return;
  g.outer_gather_pending = false;
  Communicator* ag = up_replica_ag_.get();
  void* buf = g.w_z3->data();
  const size_t count = g.z1.size();
  const DType dt = g.sdt;
  g.outer_gather_handle =
      SubmitComm("outer all-gather", gi, ag, [=] { ag->AllGatherInPlace(buf, count, dt); });
  counters_.outer_overlapped++;
}

void Engine::StartGather(int gi) {
  StartOuterGather(gi);
  RuntimeGroup& g = *groups_[gi];
  if (skip_gather_ || g.gather_started) return;
  const size_t bytes = g.padded * DTypeSize(g.wdt);
  SSHSDP_CHECK(!gather_slots_ || bytes <= gather_slots_->slot_bytes(), LayoutError,
               "group {}: its gathered weights ({} bytes) exceed a registered gather slot ({})", gi,
               bytes, gather_slots_ ? gather_slots_->slot_bytes() : 0);
  g.gather_block = gather_slots_ ? gather_slots_->Acquire() : pool_->Acquire(bytes);
  g.w_full->AttachExternal(g.gather_block, bytes);
  g.gather_started = true;
  counters_.gathers++;
  g.gather_handle =
      SubmitComm("all-gather", gi, rt_zero3_.get(), path_->GatherTask(g, rt_zero3_.get()));
}

void Engine::WaitGather(int gi) {
  RuntimeGroup& g = *groups_[gi];
  StartGather(gi);
  if (!g.outer_gather_handle.Ready()) {
    ScopedTimer t(&time_.comm_wait);
    TraceSpan s(cfg_.tracer, "wait outer all-gather", kTraceCompute, {{"group", gi}});
    g.outer_gather_handle.Wait();  // with sw = 1 the model reads Wᶻ³ itself
  }
  g.outer_gather_handle.Wait();  // ready: rethrows its failure, if any
  g.outer_gather_handle = {};
  if (skip_gather_) return;
  {
    ScopedTimer t(&time_.comm_wait);
    TraceSpan s(cfg_.tracer, "wait all-gather", kTraceCompute, {{"group", gi}});
    g.gather_handle.Wait();
  }
  path_->GatherArrived(g);
}

void Engine::ReleaseGather(int gi) {
  RuntimeGroup& g = *groups_[gi];
  const bool gathered = !skip_gather_ && g.gather_started;
  if (gathered) g.gather_handle.Wait();  // a prefetched gather may be released before use
  path_->ReleaseWeights(g);
  if (!gathered) return;
  g.w_full->Release();
  if (gather_slots_) {
    gather_slots_->Release(g.gather_block);
  } else {
    pool_->Recycle(g.gather_block);
  }
  g.gather_block = nullptr;
  g.gather_started = false;
}

void Engine::SetModelBatch(const int32_t* tokens, const int32_t* targets) {
  model_.SetBatch(tokens, targets, cfg_.batch_size, cfg_.seq_len);
  AccountActivations();
}

void Engine::AccountActivations() {
  if (activation_bytes_ != static_cast<uint64_t>(model_.ActivationBytes())) {
    // The model owns its activation arena; account it with the rest of the rank's memory.
    memory_.Free("activations", activation_bytes_);
    activation_bytes_ = static_cast<uint64_t>(model_.ActivationBytes());
    memory_.Allocate("activations", activation_bytes_);
  }
}

void Engine::ForwardPass(bool release_all) {
  // Forward, layer by layer, prefetching the next layer's weights. Training keeps the last
  // layer (backward starts there) and, without reshard_after_forward, every layer.
  const int n = static_cast<int>(groups_.size());
  for (int g = 0; g < n; ++g) {
    StartGather(g);
    if (cfg_.prefetch && g + 1 < n) StartGather(g + 1);
    WaitGather(g);
    std::vector<TensorRef> w = path_->Weights(*groups_[g]);
    if (tied_ && g == n - 1) Append(&w, path_->Weights(*groups_[0]));  // the tied table
    {
      ScopedTimer t(&time_.compute);
      TraceSpan s(cfg_.tracer, "forward", kTraceCompute, {{"group", g}});
      model_.Forward(g, w);  // on a backend, queued: a regather of W′'s slot waits for it
    }
    const bool held = tied_ && g == 0;  // the last group reads it again
    if (!held && (release_all || (cfg_.reshard_after_forward && g + 1 < n))) ReleaseGather(g);
  }
  if (tied_ && release_all) ReleaseGather(0);
}

double Engine::Evaluate(const BatchFn& batch, int batches) {
  SSHSDP_CHECK(batches >= 1, ConfigError, "Evaluate: need at least one batch per rank, got {}",
               batches);
  SSHSDP_CHECK(cfg_.seq_len > 0, ConfigError,
               "sequence length must be set (EngineConfig::seq_len)");
  std::vector<int32_t> tokens(static_cast<size_t>(cfg_.batch_size) * cfg_.seq_len),
      targets(tokens.size());
  TraceSpan eval_span(cfg_.tracer, "evaluate", kTraceCompute, {{"batches", batches}});
  model_.TakeLosses();  // drops what a call that threw kept
  // The first forward runs the outer all-gathers deferred from the last update: their counts
  // belong to the next step, as without this evaluation.
  const CommCounters ag0 = up_replica_ag_->counters();
  const uint64_t outer0 = counters_.outer_overlapped, staged0 = StagedBytes();
  for (int i = 0; i < batches; ++i) {
    batch(i, tokens.data(), targets.data());
    SetModelBatch(tokens.data(), targets.data());
    ForwardPass(/*release_all=*/true);  // no backward follows: the last layer is released too
    AccountActivations();  // scratch a model sizes in its first forward (MXFP8 dequantization)
    model_.KeepLoss();
  }
  double loss_sum = 0;
  for (double l : model_.TakeLosses()) loss_sum += l;  // one read of the device, in order
  carried_update_comm_ += Delta(up_replica_ag_->counters(), ag0);
  carried_outer_ += counters_.outer_overlapped - outer0;
  carried_staged_ += StagedBytes() - staged0;
  float red = static_cast<float>(loss_sum);  // as Step's loss: an fp32 sum over ranks
  world_.AllReduce(&red, 1, DType::kF32);
  return red / (static_cast<double>(batches) * world_.size());
}

void Engine::BackwardGroup(int gi, int mb) {
  RuntimeGroup& G = *groups_[gi];
  StartGather(gi);
  if (cfg_.prefetch && gi > 0) StartGather(gi - 1);
  WaitGather(gi);
  GradWrite mode = GradWrite::kOverwrite;
  if (skip_rs_ && mb > 0) {
    mode = GradWrite::kAccumulate;  // G′ is G′ᶻ²: accumulate in backward
    counters_.fused_accumulations++;
  }
  const int n = static_cast<int>(groups_.size());
  const bool tied_first = tied_ && gi == 0;  // its gradient holds the last group's already
  if (!tied_first) AttachGradBlock(G);
  std::vector<TensorRef> w = path_->Weights(G);
  std::vector<TensorRef> grads =
      tied_first ? std::exchange(tied_grads_, {}) : path_->GradTargets(G);
  if (tied_first) mode = GradWrite::kAccumulate;
  if (tied_ && gi == n - 1) {  // the head writes the tied table's gradient first
    RuntimeGroup& first = *groups_[0];
    AttachGradBlock(first);
    tied_grads_ = path_->GradTargets(first);
    Append(&w, path_->Weights(first));
    Append(&grads, tied_grads_);
  }
  {
    ScopedTimer t(&time_.compute);
    TraceSpan s(cfg_.tracer, "backward", kTraceCompute, {{"group", gi}, {"microbatch", mb}});
    model_.Backward(gi, w, grads, mode);  // on a backend, queued: the reduce-scatter waits
  }
  if (!skip_rs_) {
    ReduceScatterOptions ro;
    if (cfg_.reduce == ReduceMode::kBf16Sr) {
      // bf16sr: bf16 partials with stochastic rounding, keyed by (seed, step, stream).
      ro.partial_dtype = DType::kBF16;
      ro.sr_key = {cfg_.sr_seed, static_cast<uint64_t>(step_), static_cast<uint32_t>(mb * n + gi)};
    }
    std::function<void()> task = path_->ReduceTask(G, rt_zero2_.get(), mb > 0, ro);
    G.g_full->Release();
    G.rs_handle = SubmitComm("reduce-scatter", gi, rt_zero2_.get(), std::move(task));
  }
  ReleaseGather(gi);
}

void Engine::AttachGradBlock(RuntimeGroup& g) {
  if (skip_rs_) return;  // backward writes G′ᶻ² itself
  const size_t bytes = g.padded * DTypeSize(grad_dtype_);
  g.grad_block = grad_slots_ ? grad_slots_->Acquire() : pool_->Acquire(bytes);
  g.g_full->AttachExternal(g.grad_block, bytes);
}

void Engine::FinishReduceScatter(int gi) {
  RuntimeGroup& P = *groups_[gi];
  {
    ScopedTimer t(&time_.comm_wait);
    TraceSpan s(cfg_.tracer, "wait reduce-scatter", kTraceCompute, {{"group", gi}});
    P.rs_handle.Wait();
  }
  if (grad_slots_) {
    grad_slots_->Release(P.grad_block);
  } else {
    pool_->Recycle(P.grad_block);
  }
  P.grad_block = nullptr;
  path_->ReduceDone(P);
}

void Engine::OuterReduce(RuntimeGroup& g) {
  ScopedTimer t(&time_.comm_wait);
  TraceSpan s(cfg_.tracer, "outer reduce-scatter", kTraceCompute, {{"group", g.layout.group}});
  // On this thread, over another stream: with sg = 1 backward wrote G′ᶻ² on the compute stream.
  if (up_replica_rs_->size() > 1 || up_hsdp_->size() > 1) SyncBackend();
  if (up_replica_rs_->size() > 1)
    up_replica_rs_->ReduceScatter(g.g_z2->data(), DType::kF32, g.g_z1, DType::kF32, g.z1.size(),
                                  false);
  if (up_hsdp_->size() > 1) up_hsdp_->AllReduce(g.g_z1, g.z1.size(), DType::kF32);
}

void Engine::SubmitOuterReduce(int gi) {
  // Group gi's G′ᶻ² is complete (its last reduce-scatter, or its last backward with sg = 1):
  // G′ᶻ² → Gᶻ¹ in the replica group and the HSDP all-reduce run behind it on the
  // communication thread while backward goes on; UpdatePhase waits for them.
  RuntimeGroup& g = *groups_[gi];
  Communicator* rs = up_replica_rs_.get();
  Communicator* ar = up_hsdp_.get();
  if (!cfg_.overlap_outer || (rs->size() == 1 && ar->size() == 1)) return;
  const void* z2 = g.g_z2->data();
  float* z1 = g.g_z1;
  const size_t count = g.z1.size();
  if (rs->size() > 1)
    g.outer_rs_handle = SubmitComm("outer reduce-scatter", gi, rs, [=] {
      rs->ReduceScatter(z2, DType::kF32, z1, DType::kF32, count, false);
    });
  if (ar->size() > 1)
    g.outer_ar_handle =
        SubmitComm("HSDP all-reduce", gi, ar, [=] { ar->AllReduce(z1, count, DType::kF32); });
  g.outer_reduce_submitted = true;
  counters_.outer_overlapped++;
}

StepStats Engine::Step(const BatchFn& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = static_cast<int>(groups_.size());
  const int M = cfg_.microbatches;
  const int B = cfg_.batch_size;
  const int T = cfg_.seq_len;
  SSHSDP_CHECK(T > 0, ConfigError, "sequence length must be set (EngineConfig::seq_len)");
  TraceSpan step_span(cfg_.tracer, "step", kTraceCompute, {{"step", step_ + 1}});
  counters_ = {};
  counters_.outer_overlapped = carried_outer_;  // run by an Evaluate since the last step
  // Each of those outer all-gathers was one hand-off by event.
  counters_.backend_events = carried_outer_;
  carried_outer_ = 0;
  copy_meter_.Reset();
  time_ = {};
  auto update_comms = [&] {
    CommCounters c;
    for (Communicator* u :
         {up_replica_rs_.get(), up_replica_ag_.get(), up_hsdp_.get(), up_p2p_.get(), &world_})
      c += u->counters();
    if (up_zero1_) c += up_zero1_->counters();
    if (mx_replica_ag_) c += mx_replica_ag_->counters();
    return c;
  };
  const CommCounters rt0 = rt_zero3_->counters(), rt1 = rt_zero2_->counters();
  const CommCounters rt2 = mx_zero3_ ? mx_zero3_->counters() : CommCounters{};
  const CommCounters up0 = update_comms();
  const uint64_t staged0 = StagedBytes();

  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  model_.TakeLosses();  // drops what a step that threw kept
  for (int mb = 0; mb < M; ++mb) {
    batch(mb, tokens.data(), targets.data());
    SetModelBatch(tokens.data(), targets.data());
    ForwardPass(/*release_all=*/false);
    AccountActivations();  // scratch a model sizes in its first forward (MXFP8 dequantization)
    model_.KeepLoss();     // read once per step, below: no wait for the device here
    // Backward in reverse; gradients go straight into G′ views, then reduce-scatter. A
    // group's reduce-scatter is waited for after the next group's backward was submitted;
    // in the last microbatch its outer phase is queued then (or right after its backward
    // when sg = 1 leaves no reduce-scatter), overlapping the rest of backward.
    const bool last = mb + 1 == M;
    auto finish = [&](int g) {
      FinishReduceScatter(g);
      if (last) SubmitOuterReduce(g);
    };
    for (int g = n - 1; g >= 0; --g) {
      BackwardGroup(g, mb);
      if (last && skip_rs_) SubmitOuterReduce(g);
      if (g + 1 < n && groups_[g + 1]->grad_block) finish(g + 1);
    }
    for (int g = 0; g < n; ++g)
      if (groups_[g]->grad_block) finish(g);
  }
  {
    ScopedTimer t(&time_.comm_wait);
    TraceSpan s(cfg_.tracer, "wait communication", kTraceCompute);
    comm_thread_->Drain();
  }
  double loss_sum = 0;
  for (double l : model_.TakeLosses()) loss_sum += l;  // in microbatch order, as before

  StepStats st;
  st.tokens = static_cast<int64_t>(M) * B * T * world_.size();
  UpdatePhase(loss_sum, &st);
  st.step = step_;
  st.counters = counters_;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (st.skipped) return st;
  st.counters.copies = copy_meter_.bytes();
  st.counters.copies.update_copy = update_->last_run().bytes_copied;  // ⑥ reassembly
  st.counters.bytes_copied = st.counters.copies.total();
  st.counters.runtime_comm = Delta(rt_zero3_->counters(), rt0);
  st.counters.runtime_comm += Delta(rt_zero2_->counters(), rt1);
  if (mx_zero3_) st.counters.runtime_comm += Delta(mx_zero3_->counters(), rt2);
  st.counters.update_comm = Delta(update_comms(), up0);
  st.counters.update_comm += carried_update_comm_;
  carried_update_comm_ = {};
  st.counters.staged_bytes = StagedBytes() - staged0 + carried_staged_;
  carried_staged_ = 0;
  st.counters.collective_copy_bytes =
      st.counters.runtime_comm.local_copy_bytes + st.counters.update_comm.local_copy_bytes;
  time_.copy = copy_meter_.seconds();
  st.time = time_;
  st.time.other = std::max(0.0, st.seconds - (time_.compute + time_.comm_wait + time_.copy +
                                              time_.cast + time_.add + time_.optimizer));
  return st;
}

void Engine::UpdatePhase(double loss_sum, StepStats* st) {
  // Outer reduce-scatter, HSDP all-reduce, norm, structured update (F), G, outer all-gather.
  const int M = cfg_.microbatches;
  const bool count_norm = topo_.Coord(rank_).d == 0;
  double sumsq = 0;
  for (auto& gp : groups_) {
    RuntimeGroup& g = *gp;
    if (g.outer_reduce_submitted) {
      ScopedTimer t(&time_.comm_wait);
      TraceSpan s(cfg_.tracer, "wait outer reduce", kTraceCompute, {{"group", g.layout.group}});
      g.outer_rs_handle.Wait();
      g.outer_ar_handle.Wait();
      g.outer_rs_handle = g.outer_ar_handle = {};
      g.outer_reduce_submitted = false;
    } else {
      OuterReduce(g);
    }
    ScopedTimer t(&time_.optimizer);
    TraceSpan s(cfg_.tracer, "gradient norm", kTraceCompute, {{"group", g.layout.group}});
    if (count_norm)
      for (const Fragment& f : g.chain->Fragments(Shard::kZero1))
        sumsq += cfg_.backend->SumSquares(g.g_z1 + f.shard_offset, static_cast<int64_t>(f.length));
  }
  float red[2] = {static_cast<float>(loss_sum), static_cast<float>(sumsq)};
  {
    ScopedTimer t(&time_.comm_wait);
    TraceSpan s(cfg_.tracer, "loss/norm all-reduce", kTraceCompute);
    world_.AllReduce(red, 2, DType::kF32);
  }
  const double norm_scale = 1.0 / (static_cast<double>(M) * world_.size());
  st->grad_norm = std::sqrt(static_cast<double>(red[1])) * norm_scale;
  st->loss = red[0] / (static_cast<double>(M) * world_.size());
  if (!std::isfinite(st->loss) || !std::isfinite(st->grad_norm)) {
    // Every rank holds the same all-reduced values, so every rank takes this branch.
    SSHSDP_CHECK(cfg_.on_nonfinite == NonFinitePolicy::kSkip, NonFiniteError,
                 "step {}: non-finite loss or gradient norm (loss {}, gradient norm {}); the "
                 "update was not applied and nothing was saved (lower --lr, set --clip, or "
                 "--on-nonfinite skip)",
                 step_ + 1, st->loss, st->grad_norm);
    st->skipped = true;
    return;
  }
  double clip = 1.0;
  if (cfg_.clip_norm > 0 && st->grad_norm > cfg_.clip_norm)
    clip = cfg_.clip_norm / (st->grad_norm + 1e-6);
  const float grad_scale = static_cast<float>(clip * norm_scale);

  ++step_;
  {
    // F on the ZeRO-1 fragments: AdamW, then Muon (its split units point to point).
    ScopedTimer t(&time_.optimizer);
    TraceSpan s(cfg_.tracer, "update (F)", kTraceCompute);
    std::vector<Zero1State> state;
    for (auto& gp : groups_) {
      RuntimeGroup& g = *gp;
      Zero1State s{g.z1, {{"main", g.main_z1}, {"grad", g.g_z1}}};
      s.fields.insert(g.opt_state.begin(), g.opt_state.end());
      state.push_back(std::move(s));
    }
    ScalarState scalars;
    scalars.Set("grad_scale", grad_scale);
    scalars.Set("step", static_cast<double>(step_));
    scalars.Set("adamw.lr", cfg_.adamw.lr);
    scalars.Set("muon.lr", cfg_.muon.lr);
    const CommCounters p2p0 = up_p2p_->counters();
    const CommCounters z10 = up_zero1_ ? up_zero1_->counters() : CommCounters{};
    update_->Run(state, scalars);
    counters_.update_p2p = Delta(up_p2p_->counters(), p2p0);
    if (up_zero1_) counters_.update_full_tensor = Delta(up_zero1_->counters(), z10);
    counters_.update_exec_cost = update_->last_run().exec_cost;
  }
  PrepareAndGatherWeights();
}

}  // namespace sshsdp
