// comm_failure_probe: one rank fails while the others block in a collective, to prove that
// a failing rank ends the whole job instead of leaving its peers hanging (docs/design.md, Execution
// conditions). Run by expect_abort.sh under `timeout`; it must exit non-zero quickly. Modes
// (argv[1]):
//   throw              rank 1 throws a CommError on the main thread; RunMpiMain prints
//                      "sshsdp: rank 1: ..." and calls MPI_Abort.
//   kill               rank 1 sends itself SIGKILL; mpirun must notice and end the job.
//   throw-comm-thread  rank 1's CommThread is blocked in a collective its peers never join
//                      when the main thread throws; the CommThread destructor must not
//                      block the abort.
// Every other rank waits in an all-reduce that rank 1 never joins.
//
//   mpirun -np 3 comm_failure_probe throw      # exits non-zero, stderr names rank 1
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/comm_thread.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  return sshsdp::RunMpiMain(argc, argv, [&] {
    SSHSDP_CHECK(mode == "throw" || mode == "kill" || mode == "throw-comm-thread",
                 sshsdp::ConfigError,
                 "usage: comm_failure_probe throw|kill|throw-comm-thread (got '{}')", mode);
    auto world = sshsdp::MpiCommunicator::World(1);
    SSHSDP_CHECK(world->size() >= 2, sshsdp::ConfigError, "run with at least 2 ranks");
    auto side = world->Duplicate();
    world->Barrier();  // everyone is up before rank 1 fails
    std::vector<float> data(1024, 1.0f);
    if (world->rank() == 1) {
      if (mode == "kill") {
        raise(SIGKILL);
      } else if (mode == "throw-comm-thread") {
        sshsdp::CommThread thread("probe");
        thread.Submit([&] { side->Barrier(); });  // the peers never enter this barrier
        usleep(200 * 1000);                       // let the task start blocking
        throw sshsdp::CommError("probe: rank 1 failed while its comm thread was blocked");
      }
      throw sshsdp::CommError("probe: rank 1 failed on purpose");
    }
    world->AllReduce(data.data(), data.size(), sshsdp::DType::kF32);  // blocks: rank 1 is gone
    std::fprintf(stderr, "comm_failure_probe: rank %d passed a collective it should not pass\n",
                 world->rank());
    return 0;
  });
}
