// ParallelFor's OpenMP region (see parallel.h): callers pass a plain function and stay free
// of OpenMP pragmas; the pool is libgomp's, shared with oneDNN.
#include "sshsdp/kernels/parallel.h"

#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>

namespace sshsdp::kernels {
namespace {

// ConfigureKernelThreads' default, a cap for threads that did not inherit the main thread's
// OpenMP setting (the communication thread's reductions).
std::atomic<int> g_thread_cap{INT_MAX};

}  // namespace

int KernelThreads() {
  return omp_in_parallel() ? 1 : std::min(omp_get_max_threads(), g_thread_cap.load());
}

int AllowedCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return static_cast<int>(std::max(sysconf(_SC_NPROCESSORS_ONLN), 1L));
}

std::string ThreadBindingWarning() {
  const int threads = KernelThreads(), cpus = AllowedCpus();
  if (threads <= cpus) return "";
  return fmt::format(
      "{} kernel threads (OMP_NUM_THREADS) share {} CPU{} this process is bound to: they run "
      "one at a time (launch with mpirun --bind-to none, or --map-by slot:PE={}; under Slurm "
      "set --cpus-per-task={})",
      threads, cpus, cpus == 1 ? "" : "s", threads, threads);
}

void SetKernelThreads(int n) { omp_set_num_threads(std::max(n, 1)); }

int DefaultKernelThreads(int allowed_cpus, int node_cpus, int local_ranks, bool disjoint) {
  allowed_cpus = std::max(allowed_cpus, 1);
  if (disjoint) return allowed_cpus;
  return std::clamp(node_cpus / std::max(local_ranks, 1), 1, allowed_cpus);
}

KernelThreadChoice ConfigureKernelThreads(int local_ranks, int node_cpus, bool disjoint) {
  KernelThreadChoice c;
  const int allowed = AllowedCpus();
  node_cpus = std::max(node_cpus, 1);
  // Set means a number, as libgomp reads it (it ignores anything else and uses every CPU).
  const char* env = std::getenv("OMP_NUM_THREADS");
  char* end = nullptr;
  const long given = env != nullptr ? std::strtol(env, &end, 10) : 0;
  if (env != nullptr && end != env && given > 0) {
    c.threads = KernelThreads();
    c.description = fmt::format("{} per rank (OMP_NUM_THREADS={})", c.threads, env);
    c.warning = ThreadBindingWarning();
    if (c.warning.empty() && !disjoint && int64_t{c.threads} * local_ranks > node_cpus) {
      c.warning = fmt::format(
          "{} ranks on this node × {} kernel threads (OMP_NUM_THREADS) share {} CPU{}: they take "
          "turns (set OMP_NUM_THREADS={}, or unset it for that default)",
          local_ranks, c.threads, node_cpus, node_cpus == 1 ? "" : "s",
          DefaultKernelThreads(allowed, node_cpus, local_ranks, disjoint));
    }
    return c;
  }
  c.threads = DefaultKernelThreads(allowed, node_cpus, local_ranks, disjoint);
  SetKernelThreads(c.threads);
  g_thread_cap.store(c.threads);
  if (disjoint) {
    c.description = fmt::format(
        "{} per rank (OMP_NUM_THREADS unset: the CPU{} this rank may use; {} rank{} on this "
        "node, none sharing a CPU)",
        c.threads, allowed == 1 ? "" : "s", local_ranks, local_ranks == 1 ? "" : "s");
  } else {
    c.description =
        fmt::format("{} per rank (OMP_NUM_THREADS unset: {} ranks on this node share {} CPU{})",
                    c.threads, local_ranks, node_cpus, node_cpus == 1 ? "" : "s");
  }
  return c;
}

void ParallelForChunks(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx) {
  if (n <= 0) return;
  const int64_t chunks = std::min<int64_t>(KernelThreads(), n / std::max<int64_t>(grain, 1));
  if (chunks <= 1) {
    fn(ctx, 0, n);
    return;
  }
#pragma omp parallel num_threads(static_cast <int>(chunks))
  {
    const int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
    const int64_t begin = n * t / k, end = n * (t + 1) / k;
    if (begin < end) fn(ctx, begin, end);
  }
}

}  // namespace sshsdp::kernels
