// MpiRuntime, CheckMpi and RunMpiMain: MPI start-up, error conversion and job-wide abort.
#include "sshsdp/comm/mpi_runtime.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/rma_window.h"

namespace sshsdp {

namespace {

bool MpiActive() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace

const char* MpiThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown MPI thread level";
}

void CheckMpi(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    std::snprintf(text, sizeof(text), "unknown error");
  }
  throw CommError(fmt::format("{}: {} (MPI error {})", what, text, rc));
}

int WorldRankOrMinusOne() {
  if (!MpiActive()) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int WorldSize() {
  SSHSDP_CHECK(MpiActive(), CommError, "WorldSize: MPI is not initialised");
  int size = 0;
  CheckMpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  return size;
}

NodeCpus NodeCpuMasks() {
  SSHSDP_CHECK(MpiActive(), CommError, "NodeCpuMasks: MPI is not initialised");
  MPI_Comm node = MPI_COMM_NULL;
  CheckMpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
           "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  int size = 0;
  int rc = MPI_Comm_size(node, &size);
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) {  // unknown: every online CPU
    const long online = std::max(sysconf(_SC_NPROCESSORS_ONLN), 1L);
    for (long c = 0; c < online && c < CPU_SETSIZE; ++c) CPU_SET(static_cast<int>(c), &mine);
  }
  std::vector<cpu_set_t> all(static_cast<size_t>(std::max(size, 1)));
  if (rc == MPI_SUCCESS)
    rc = MPI_Allgather(&mine, sizeof(cpu_set_t), MPI_BYTE, all.data(), sizeof(cpu_set_t), MPI_BYTE,
                       node);
  MPI_Comm_free(&node);
  CheckMpi(rc, "NodeCpuMasks (MPI_Comm_size, MPI_Allgather)");
  cpu_set_t both;
  CPU_ZERO(&both);
  int sum = 0;
  for (cpu_set_t& s : all) {
    CPU_OR(&both, &both, &s);
    sum += CPU_COUNT(&s);
  }
  NodeCpus n;
  n.local_ranks = size;
  n.cpus = std::max(CPU_COUNT(&both), 1);
  n.disjoint = sum == CPU_COUNT(&both);
  return n;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  CheckMpi(MPI_Initialized(&initialized), "MPI_Initialized");
  if (initialized) {
    CheckMpi(MPI_Query_thread(&provided_), "MPI_Query_thread");
  } else {
    PrepareRmaBeforeMpiInit();  // one-sided windows of the direct path (see rma_window.h)
    // The communication thread shares its rank's cores with compute (OpenMPI binds a rank to
    // one core with -np 2 or less, to a socket above): an MPI wait that spins takes a core from
    // the compute threads (GPT small, 2 ranks, 2 cores: 20-26k tokens/s spinning, 28-32k
    // yielding). Idle waits yield unless the launcher chose (--mca or the variable; an MCA
    // parameter file's setting is outranked by this variable). OpenMPI only: other MPIs have
    // their own wait-mode settings.
#ifdef OPEN_MPI
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
#endif
    CheckMpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_), "MPI_Init_thread");
    owns_ = true;
  }
  // From here on MPI calls on the world report errors instead of aborting silently.
  CheckMpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
           "MPI_Comm_set_errhandler(MPI_COMM_WORLD)");
  CheckMpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank(MPI_COMM_WORLD)");
  CheckMpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size(MPI_COMM_WORLD)");
  // MPI stays initialised when this throws, so RunMpiMain can still abort the job cleanly.
  SSHSDP_CHECK(provided_ >= MPI_THREAD_MULTIPLE, CommError,
               "MPI provided thread level {} ({}), but sshsdp needs MPI_THREAD_MULTIPLE: a "
               "communication thread issues collectives while the main thread communicates; "
               "use an MPI library built with thread support",
               MpiThreadLevelName(provided_), provided_);
}

MpiRuntime::~MpiRuntime() {
  if (owns_ && MpiActive()) {
    MPI_Finalize();
    CleanupRmaAfterMpiFinalize();
  }
}

void AbortJob(std::string_view message) {
  int rank = WorldRankOrMinusOne();
  if (rank >= 0) {
    std::fprintf(stderr, "sshsdp: rank %d: %.*s\n", rank, static_cast<int>(message.size()),
                 message.data());
  } else {
    std::fprintf(stderr, "sshsdp: %.*s\n", static_cast<int>(message.size()), message.data());
  }
  std::fflush(stderr);
  if (MpiActive()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

int RunMpiMain(int argc, char** argv, std::function<int()> body) {
  // Declared outside the try block: MPI must still be initialised (not finalised, which
  // could block on the other ranks) when the handler aborts the job.
  std::optional<MpiRuntime> mpi;
  try {
    mpi.emplace(&argc, &argv);
    return body();
  } catch (const std::exception& e) {
    AbortJob(e.what());
  } catch (...) {
    AbortJob("unknown exception (not derived from std::exception)");
  }
}

}  // namespace sshsdp
