// DirectCommunicator internals: what its sources (direct_communicator.cc, direct_all_gather.cc,
// direct_reduce_scatter.cc) share — the call descriptor's fields, the registered-window record,
// polling with backoff and the one-call-at-a-time guard; not part of the API, include it only
// from those sources (see direct_communicator.h).
#pragma once

#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/direct_communicator.h"

namespace sshsdp {

namespace direct_internal {

inline constexpr double kStallSeconds = 300;

enum Kind : int64_t { kAllGather = 1, kReduceScatter = 2 };
enum Field : int {
  kKind = 0,
  kSeq,
  kCount,
  kDtype,
  kWindow,
  kOffset,
  kPartials,
  kSrSeed,
  kSrStep,
  kSrStream,
  kError,
  kNumFields
};

// Polling that lets the other ranks (and this rank's compute thread) run: sched_yield first,
// then short sleeps, so 8 ranks on 2 cores do not starve each other.
class Backoff {
 public:
  explicit Backoff(std::string what) : what_(std::move(what)) {}
  void Pause() {
    ++polls_;
    if (polls_ < 512) {
      sched_yield();
      return;
    }
    timespec ts{0, polls_ < 8192 ? 2000 : 20000};
    nanosleep(&ts, nullptr);
    if ((polls_ & 1023) == 0) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      SSHSDP_CHECK(waited < kStallSeconds, CommError,
                   "{}: no progress for {:.0f} s; a peer died or issued a different sequence of "
                   "collectives on this communicator",
                   what_, waited);
    }
  }

 private:
  std::string what_;
  uint64_t polls_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Serialization guard: one call at a time per communicator (the RS workspace and the flags
// have one owner); a concurrent call is refused instead of corrupting them.
class BusyGuard {
 public:
  BusyGuard(std::atomic<bool>& busy, const std::string& where) : busy_(busy) {
    SSHSDP_CHECK(!busy_.exchange(true), CommError,
                 "{}: called while another call on the same communicator is running; the "
                 "workspace and flags of a DirectCommunicator serve one call at a time — give "
                 "each thread its own communicator (Duplicate())",
                 where);
  }
  ~BusyGuard() { busy_.store(false); }

 private:
  std::atomic<bool>& busy_;
};

}  // namespace direct_internal

struct DirectCommunicator::Descriptor {
  int64_t v[direct_internal::kNumFields] = {};
};

struct DirectCommunicator::Registered {
  int id = 0;
  std::unique_ptr<DataNode> root;
  std::unique_ptr<RmaWindow> window;  // host memory
  std::vector<char*> device;          // or device memory: every node peer's base, by index
  int l0 = 0;                         // this rank's node-local index
  size_t bytes = 0;
  char* base() const { return window ? window->base() : device[l0]; }
  // Node peer l's region, addressable from this process (load/store or device copies).
  char* peer(int l) const { return window ? window->local_base(l) : device[l]; }
  bool Contains(const void* p, size_t n, size_t* offset) const {
    if (window) return window->Contains(p, n, offset);
    const auto b = reinterpret_cast<uintptr_t>(base());
    const auto u = reinterpret_cast<uintptr_t>(p);
    if (u < b || u - b > bytes || n > bytes - (u - b)) return false;
    if (offset) *offset = u - b;
    return true;
  }
  // Where the root is bound now (updated by its bind callback on whichever thread binds).
  std::shared_ptr<std::atomic<void*>> bound = std::make_shared<std::atomic<void*>>(nullptr);
};

}  // namespace sshsdp
