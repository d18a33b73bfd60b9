// CommThread: FIFO task queue with one worker thread, completion handles that rethrow, and a
// destructor that never blocks an abort behind a collective that cannot finish.
#include "sshsdp/comm/comm_thread.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp {

namespace comm_thread_internal {

struct Task {
  std::function<void()> fn;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::atomic<bool> observed{false};  // some Wait/Drain has seen `error`

  void Complete(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      error = std::move(e);
      done = true;
    }
    cv.notify_all();
  }
};

// Everything the worker touches; shared so that an abandoned (detached) worker stays valid.
struct Queue {
  std::mutex mu;
  std::condition_variable work_cv;  // worker: a task arrived or stop was set
  std::condition_variable idle_cv;  // Drain/destructor: a task finished
  std::deque<std::shared_ptr<Task>> tasks;
  size_t pending = 0;  // queued + running
  bool stop = false;
  std::vector<std::shared_ptr<Task>> failed;

  void Run() {
    for (;;) {
      std::shared_ptr<Task> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(lock, [&] { return stop || !tasks.empty(); });
        if (tasks.empty()) return;  // stop requested and nothing left
        task = std::move(tasks.front());
        tasks.pop_front();
      }
      std::exception_ptr error;
      try {
        task->fn();
      } catch (...) {
        error = std::current_exception();
      }
      task->fn = nullptr;  // release what the task captured before signalling completion
      task->Complete(error);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (error) failed.push_back(task);
        --pending;
      }
      idle_cv.notify_all();
    }
  }
};

}  // namespace comm_thread_internal

using comm_thread_internal::Queue;
using comm_thread_internal::Task;

namespace {

std::string Describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

void CommHandle::Wait() const {
  if (!task_) return;
  std::unique_lock<std::mutex> lock(task_->mu);
  task_->cv.wait(lock, [&] { return task_->done; });
  if (task_->error) {
    task_->observed = true;
    std::rethrow_exception(task_->error);
  }
}

bool CommHandle::Ready() const {
  if (!task_) return true;
  std::lock_guard<std::mutex> lock(task_->mu);
  return task_->done;
}

CommThread::CommThread(std::string name)
    : name_(std::move(name)),
      queue_(std::make_shared<Queue>()),
      uncaught_at_construction_(std::uncaught_exceptions()) {
  worker_ = std::thread([q = queue_] { q->Run(); });
}

CommHandle CommThread::Submit(std::function<void()> task) {
  SSHSDP_CHECK(task != nullptr, CommError, "CommThread '{}': Submit of an empty task", name_);
  auto t = std::make_shared<Task>();
  t->fn = std::move(task);
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    SSHSDP_CHECK(!queue_->stop, CommError, "CommThread '{}': Submit after shutdown", name_);
    queue_->tasks.push_back(t);
    ++queue_->pending;
  }
  queue_->work_cv.notify_one();
  return CommHandle(std::move(t));
}

void CommThread::Drain() {
  std::unique_lock<std::mutex> lock(queue_->mu);
  queue_->idle_cv.wait(lock, [&] { return queue_->pending == 0; });
  for (const auto& t : queue_->failed) {
    if (!t->observed.exchange(true)) std::rethrow_exception(t->error);
  }
}

size_t CommThread::pending() const {
  std::lock_guard<std::mutex> lock(queue_->mu);
  return queue_->pending;
}

CommThread::~CommThread() {
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_construction_;
  std::unique_lock<std::mutex> lock(queue_->mu);
  queue_->stop = true;
  if (unwinding) {
    // Nobody will wait for queued tasks, and their buffers are going away: drop them.
    for (auto& t : queue_->tasks) {
      t->fn = nullptr;
      t->Complete(std::make_exception_ptr(CommError(fmt::format(
          "CommThread '{}' was destroyed during exception unwinding before this task ran",
          name_))));
      t->observed = true;
      --queue_->pending;
    }
    queue_->tasks.clear();
  }
  queue_->work_cv.notify_all();
  bool finished = true;
  if (unwinding) {
    finished = queue_->idle_cv.wait_for(lock, unwind_grace_, [&] { return queue_->pending == 0; });
  }
  std::vector<std::shared_ptr<Task>> failed = queue_->failed;
  lock.unlock();
  if (finished) {
    worker_.join();
  } else {
    // The running task is most likely a collective whose peers will never arrive; the
    // process is on its way to an abort. The detached worker only touches `queue_`.
    std::fprintf(stderr,
                 "sshsdp: comm thread '%s': abandoning a running task during exception "
                 "unwinding\n",
                 name_.c_str());
    worker_.detach();
  }
  for (const auto& t : failed) {
    if (!t->observed) {
      std::fprintf(stderr, "sshsdp: comm thread '%s': a task failed and nobody waited for it: %s\n",
                   name_.c_str(), Describe(t->error).c_str());
    }
  }
}

}  // namespace sshsdp
