// What a rank of `train` or `bench` sets up about its node before the engine exists: its
// kernel threads (OMP_NUM_THREADS, or a share of the CPUs the node's ranks may use) and the
// check that the model can fit the node's memory at all. Collective over MPI_COMM_WORLD.
//
//   const NodeSetup node = SetUpNode(model.NumParams(), W, /*host_state=*/!dev.backend);
//   fmt::print("threads {}\n", node.threads.description);   // a warning: node.threads.warning
#pragma once

#include "sshsdp/kernels/parallel.h"

namespace sshsdp {

struct NodeSetup {
  int local_ranks = 1;
  kernels::KernelThreadChoice threads;
};

// host_state: the optimizer state lives in host memory (not on a device backend), so the
// model-fits-the-node check (CheckModelFitsNode) applies.
NodeSetup SetUpNode(double params, int world_size, bool host_state);

}  // namespace sshsdp
