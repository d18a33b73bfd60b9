// Watchdog of blocking waits (see watchdog.h). The registry and its thread are created on the
// first watched wait and never destroyed (a wait may still be open during static
// destruction); the thread sleeps between checks, so an idle job pays nothing.
#include "sshsdp/comm/watchdog.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_runtime.h"

namespace sshsdp {
namespace {

using Clock = std::chrono::steady_clock;

struct Wait {
  const char* op;
  std::string group;
  std::vector<int> peers;
  Clock::time_point start;
};

struct Registry {
  std::mutex mu;
  std::map<unsigned long long, Wait> open;
  unsigned long long next_id = 1;
  double timeout = kDefaultCommTimeoutSeconds;
  bool thread_started = false;
};

Registry& Get() {
  static Registry* r = new Registry();
  return *r;
}

void WatchLoop() {
  Registry& r = Get();
  for (;;) {
    double timeout;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      timeout = r.timeout;
    }
    // Check often enough that the job ends within about a tenth of the timeout past it.
    const double period = timeout > 0 ? std::clamp(timeout / 10, 0.05, 1.0) : 1.0;
    std::this_thread::sleep_for(std::chrono::duration<double>(period));
    std::string message;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      if (r.timeout <= 0) continue;
      const auto now = Clock::now();
      for (const auto& [id, w] : r.open) {
        const double waited = std::chrono::duration<double>(now - w.start).count();
        if (waited > r.timeout) {
          message = DescribeStalledWait(w.op, w.group, w.peers, waited, r.timeout);
          break;
        }
      }
    }
    if (!message.empty()) AbortJob(message);  // prints "sshsdp: rank R: ..." and MPI_Abort
  }
}

}  // namespace

void SetCommTimeout(double seconds) {
  SSHSDP_CHECK(std::isfinite(seconds) && seconds >= 0, ConfigError,
               "--comm-timeout must be a number of seconds >= 0 (0: no watchdog), got {}", seconds);
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  r.timeout = seconds;
}

WaitScope::WaitScope(const char* op, const std::string& group, std::vector<int> peers) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.thread_started && r.timeout > 0) {
    std::thread(WatchLoop).detach();
    r.thread_started = true;
  }
  id_ = r.next_id++;
  r.open.emplace(id_, Wait{op, group, std::move(peers), Clock::now()});
}

WaitScope::~WaitScope() {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  r.open.erase(id_);
}

std::string DescribeStalledWait(const char* op, const std::string& group,
                                const std::vector<int>& peers_in, double seconds, double timeout) {
  std::vector<int> peers = peers_in;  // a peer met twice in one wait is named once
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return fmt::format(
      "watchdog: waited {:.1f} s (--comm-timeout {:g} s) in {} on {} for {}; a peer is stuck, "
      "stopped or died, or issued different collectives; ending the job",
      seconds, timeout, op, group,
      peers.empty() ? std::string("every member")
                    : fmt::format("world ranks {}", fmt::join(peers, ", ")));
}

}  // namespace sshsdp
