// MPI process lifetime for sshsdp programs: initialisation with MPI_THREAD_MULTIPLE,
// error-code conversion, and "one rank fails -> the whole job ends" (docs/design.md, Communication
// and Execution conditions).
//
// A communication thread issues collectives while the main thread does point-to-point
// work, so sshsdp needs MPI_THREAD_MULTIPLE and refuses to run with less. Communicators
// use MPI_ERRORS_RETURN, and every MPI return code goes through CheckMpi, which throws a
// CommError carrying MPI_Error_string. An exception that escapes on one rank must not leave
// the other ranks blocked in a collective: RunMpiMain prints it with the rank and calls
// MPI_Abort, which ends every process of the job.
//
//   int main(int argc, char** argv) {
//     return sshsdp::RunMpiMain(argc, argv, [&] {
//       auto world = sshsdp::MpiCommunicator::World(/*ranks_per_node=*/4);
//       ...                      // any exception: "sshsdp: rank 3: <what>", MPI_Abort
//       return 0;
//     });
//   }
#pragma once

#include <mpi.h>

#include <functional>
#include <string_view>

namespace sshsdp {

// RAII MPI initialisation. Initialises MPI with MPI_THREAD_MULTIPLE (or, when MPI is already
// initialised, checks the level it was initialised with) and sets MPI_ERRORS_RETURN on
// MPI_COMM_WORLD. Throws CommError naming the provided level when it is below
// MPI_THREAD_MULTIPLE. Finalises MPI on destruction if it initialised it. One per process.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int thread_level() const { return provided_; }

 private:
  bool owns_ = false;
  int provided_ = 0;
  int world_rank_ = 0;
  int world_size_ = 1;
};

// "MPI_THREAD_SERIALIZED" etc.
const char* MpiThreadLevelName(int level);

// Throws CommError "<what>: <MPI_Error_string(rc)> (MPI error <rc>)" unless rc is
// MPI_SUCCESS.
void CheckMpi(int rc, std::string_view what);

// This process's rank in MPI_COMM_WORLD, or -1 when MPI is not (or no longer) initialised.
int WorldRankOrMinusOne();
// Number of processes in MPI_COMM_WORLD (MPI must be initialised; CommError otherwise).
int WorldSize();
// This node's processes of MPI_COMM_WORLD (those sharing its memory, this one included) and
// the CPUs their affinity masks cover: `cpus` is the union's size (a cgroup or container's
// cpuset, not the host's count), `disjoint` whether no CPU is in two ranks' masks (each rank
// bound to its own). Collective over MPI_COMM_WORLD.
struct NodeCpus {
  int local_ranks = 1;
  int cpus = 1;
  bool disjoint = true;
};
NodeCpus NodeCpuMasks();

// Runs `body` inside an MpiRuntime and returns its result. If body (or the MPI
// initialisation) throws, prints "sshsdp: rank R: <what>" to stderr and calls
// MPI_Abort(MPI_COMM_WORLD, 1), so that no other rank waits forever for this one.
int RunMpiMain(int argc, char** argv, std::function<int()> body);

// Prints "sshsdp: rank R: <message>" to stderr and aborts the whole MPI job (exit code 1).
[[noreturn]] void AbortJob(std::string_view message);

}  // namespace sshsdp
