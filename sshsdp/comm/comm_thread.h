// CommThread: the CPU analogue of a communication stream. One worker thread runs submitted
// tasks one at a time in FIFO order, so the engine can prefetch the next layer's all-gather
// (or run the previous layer's reduce-scatter) while the main thread computes (docs/design.md, One
// step and Communication).
//
// Collectives on one communicator must be issued in the same order on every rank, and an
// MPI communicator must not be used by two threads at once. So the thread gets its OWN
// communicators (Duplicate() of the main thread's ones, made before submitting), and only
// tasks of this thread use them; FIFO order keeps their program order identical on every
// rank. The main thread keeps the originals for its own collectives and point-to-point work.
// (A communicator may also pass between the threads when the main thread waits for every
// task that uses it before using it again — the engine's overlapped outer phase.)
//
//   auto ag_comm = z3->Duplicate();             // collective: same order on every rank
//   sshsdp::CommThread comm_thread("prefetch");
//   sshsdp::CommHandle h = comm_thread.Submit([&] { ag_comm->AllGatherInPlace(buf, n, dt); });
//   ComputeCurrentLayer();                      // overlaps with the all-gather
//   h.Wait();                                   // rethrows what the task threw
//
// The destructor drains the queue and joins. If it runs while an exception unwinds the
// stack (typically on its way to RunMpiMain's abort), it instead drops tasks that have not
// started and abandons a running one that does not finish within a short grace period (its
// peers may never arrive), so the abort is not blocked behind a collective that cannot end.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace sshsdp {

namespace comm_thread_internal {
struct Task;
struct Queue;
}  // namespace comm_thread_internal

// Completion handle of one submitted task. Copyable; a default-constructed handle is Ready.
class CommHandle {
 public:
  CommHandle() = default;
  // Blocks until the task has run; rethrows the exception it threw (on every call).
  void Wait() const;
  // True once the task has run (successfully or not).
  bool Ready() const;

 private:
  friend class CommThread;
  explicit CommHandle(std::shared_ptr<comm_thread_internal::Task> t) : task_(std::move(t)) {}
  std::shared_ptr<comm_thread_internal::Task> task_;
};

class CommThread {
 public:
  explicit CommThread(std::string name = "comm");
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `task` behind every earlier one. Tasks keep running after one fails.
  CommHandle Submit(std::function<void()> task);
  // Waits until every submitted task has run, then rethrows the first exception that no
  // CommHandle::Wait has seen (so failures of fire-and-forget tasks are not lost).
  void Drain();
  // Tasks submitted and not yet finished.
  size_t pending() const;
  // How long a destructor running during exception unwinding waits for the running task
  // before abandoning it (default 5 s).
  void set_unwind_grace(std::chrono::milliseconds grace) { unwind_grace_ = grace; }

 private:
  std::string name_;
  std::shared_ptr<comm_thread_internal::Queue> queue_;  // shared with the worker
  std::thread worker_;
  int uncaught_at_construction_;
  std::chrono::milliseconds unwind_grace_{5000};
};

}  // namespace sshsdp
