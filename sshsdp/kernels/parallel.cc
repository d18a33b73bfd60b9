// ParallelFor's OpenMP region (see parallel.h): callers pass a plain function and stay free
// of OpenMP pragmas; the pool is libgomp's, shared with oneDNN.
#include "sshsdp/kernels/parallel.h"

#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace sshsdp::kernels {

int KernelThreads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

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
