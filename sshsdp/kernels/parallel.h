// Threads for the kernels that are not GEMMs (attention's softmax, norms, activations, the
// loss): [0, n) split into contiguous chunks, one per thread of the process's OpenMP pool —
// the pool oneDNN's GEMMs already run on, sized by OMP_NUM_THREADS — when every chunk gets at
// least `grain` items; otherwise, or with one thread, the caller's thread runs f(0, n) alone.
// Chunks only decide which thread computes an item, never how: a kernel written per item (or
// per row) gives the same bits at any thread count. f must not throw (an exception leaving
// an OpenMP region ends the process); the kernels that use it do not.
//
//   kernels::ParallelFor(rows, 64, [&](int64_t begin, int64_t end) {
//     for (int64_t r = begin; r < end; ++r) NormalizeRow(x + r * d, d);
//   });
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

namespace sshsdp::kernels {

// Threads a ParallelFor may use in this process (OpenMP's max threads; 1 inside a parallel
// region).
int KernelThreads();

// Sets the calling thread's OpenMP thread count — what its ParallelFor calls and oneDNN
// products use — as OMP_NUM_THREADS does for every thread at start-up (tests compare thread
// counts within one process; other threads keep theirs).
void SetKernelThreads(int n);

// CPUs this process may run on (its affinity mask; the machine's count where unknown).
int AllowedCpus();

// Empty, or a warning naming the fix when this process has more kernel threads than CPUs it
// may run on — mpirun binds each rank to one core by default when ranks <= cores, so
// OMP_NUM_THREADS=2 there puts both threads on that core:
//   "OMP_NUM_THREADS=2 threads share 1 CPU this process is bound to (launch with mpirun
//    --bind-to none, or --map-by slot:PE=2; under Slurm set --cpus-per-task)"
std::string ThreadBindingWarning();

// Kernel threads for a rank when OMP_NUM_THREADS is not set: the CPUs it may run on where the
// node's ranks are bound to disjoint CPU sets, else an equal share of the CPUs their masks
// cover (node_cpus: a container's or job's cpuset, not the host's count), at least 1 and at
// most what this rank may use. OpenMP's own default (every allowed CPU) put 4 unbound ranks ×
// 2 threads on a 2-CPU machine, each step ~20× slower.
//   DefaultKernelThreads(2, 2, 4, false) == 1    4 unbound ranks on 2 CPUs
//   DefaultKernelThreads(8, 8, 8, false) == 1    8 ranks in one 8-CPU cpuset of a big host
//   DefaultKernelThreads(1, 2, 2, true) == 1     bound, a core each
//   DefaultKernelThreads(16, 32, 3, false) == 10  3 ranks bound per socket on 2 sockets
int DefaultKernelThreads(int allowed_cpus, int node_cpus, int local_ranks, bool disjoint);

// A rank's kernel threads, chosen once at start-up (cli/node_setup.h) before any kernel runs:
// OMP_NUM_THREADS where it is a number, else DefaultKernelThreads (applied to the calling
// thread and, as a cap, to every thread's ParallelFor). The node's layout: NodeCpuMasks.
struct KernelThreadChoice {
  int threads = 1;
  std::string description;  // for the header: "1 per rank (OMP_NUM_THREADS unset: ...)"
  std::string warning;      // empty, or why the threads oversubscribe the CPUs and the fix
};
KernelThreadChoice ConfigureKernelThreads(int local_ranks, int node_cpus, bool disjoint);

void ParallelForChunks(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx);

template <typename F>
void ParallelFor(int64_t n, int64_t grain, F&& f) {
  using Fn = std::remove_reference_t<F>;
  ParallelForChunks(
      n, grain, [](void* c, int64_t b, int64_t e) { (*static_cast<Fn*>(c))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace sshsdp::kernels
