// Signal handlers of stop_signal.h: async-signal-safe (an atomic, write, _exit).
#include "sshsdp/cli/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace sshsdp {
namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_training{false};

extern "C" void OnStopSignal(int sig) {
  if (!g_training.load()) {
    static const char kEarly[] = "sshsdp: stop signal received before training: exiting\n";
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, kEarly, sizeof(kEarly) - 1);
    _exit(128 + sig);
  }
  if (g_stop_signal.exchange(sig) != 0) _exit(128 + sig);
  static const char kMsg[] =
      "sshsdp: stop signal received: finishing the current step (again to abort now)\n";
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
}

}  // namespace

void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

void SetTraining(bool training) { g_training.store(training); }

int PendingStopSignal() { return g_stop_signal.load(); }

}  // namespace sshsdp
