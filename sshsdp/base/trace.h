// Tracer: a timeline of one rank's step — spans of the compute (main) thread and of the
// communication thread, with integer arguments (group, microbatch, bytes) — serialized as
// Chrome trace events (the JSON that Perfetto and chrome://tracing open). A context object,
// not global state: the engine records into the one its config names; null records nothing,
// and a tracer that is off costs one relaxed load per span.
//
//   Tracer tracer;
//   tracer.SetOrigin(std::chrono::steady_clock::now());   // right after a barrier on every rank
//   tracer.Enable(true);
//   { TraceSpan s(&tracer, "forward", kTraceCompute, {{"group", 3}, {"microbatch", 0}}); ... }
//   std::string events = tracer.EventsJson();  // "{...},\n{...}": this rank's, no brackets
//   std::string file = TraceDocument({events_of_rank0, events_of_rank1}, {"rank 0", "rank 1"});
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace sshsdp {

// Thread lanes of a rank's row (Chrome trace "tid").
inline constexpr int kTraceCompute = 0;  // the main thread: compute, copies, waits, update
inline constexpr int kTraceComm = 1;     // the communication thread: runtime collectives

using TraceArgs = std::vector<std::pair<const char*, int64_t>>;

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;

  Tracer() : origin_(Clock::now()) {}
  // Time zero of this rank's events (ranks align their clocks at a barrier).
  void SetOrigin(Clock::time_point t0) { origin_ = t0; }
  // Spans are recorded only while enabled (e.g. for the steps of --trace-steps).
  void Enable(bool on) { on_.store(on, std::memory_order_relaxed); }
  bool on() const { return on_.load(std::memory_order_relaxed); }
  // The process row later spans go to (default 0); rows are named in TraceDocument.
  void SetProcess(int pid) { pid_.store(pid, std::memory_order_relaxed); }

  // A complete span; `name` and `cat` must outlive the tracer (string literals).
  void Record(const char* name, const char* cat, int lane, Clock::time_point begin,
              Clock::time_point end, TraceArgs args);
  size_t size() const;
  // This rank's events as comma-separated Chrome trace objects ("ph": "X", times in µs).
  std::string EventsJson() const;

 private:
  struct Event {
    const char* name;
    const char* cat;
    int pid, lane;
    double ts_us, dur_us;
    TraceArgs args;
  };
  Clock::time_point origin_;
  std::atomic<bool> on_{false};
  std::atomic<int> pid_{0};
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

// Records the wall time of its scope (nothing when the tracer is null or off at entry).
class TraceSpan {
 public:
  TraceSpan(Tracer* t, const char* name, int lane, TraceArgs args = {}, const char* cat = "step")
      : t_(t && t->on() ? t : nullptr), name_(name), cat_(cat), lane_(lane) {
    if (t_) {
      args_ = std::move(args);
      begin_ = Tracer::Clock::now();
    }
  }
  ~TraceSpan() {
    if (t_) t_->Record(name_, cat_, lane_, begin_, Tracer::Clock::now(), std::move(args_));
  }
  // An argument known only at the end of the span (e.g. bytes moved).
  void Arg(const char* key, int64_t value) {
    if (t_) args_.emplace_back(key, value);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer* t_;
  const char* name_;
  const char* cat_;
  int lane_;
  TraceArgs args_;
  Tracer::Clock::time_point begin_;
};

// A whole trace file: the events of every process row (EventsJson strings) and the names of
// the rows (process_names[pid]), with thread names for the two lanes.
std::string TraceDocument(const std::vector<std::string>& events,
                          const std::vector<std::string>& process_names);

}  // namespace sshsdp
