// SetUpNode (node_setup.h): the node's CPU masks, the kernel threads, the memory check.
#include "sshsdp/cli/node_setup.h"

#include "sshsdp/cli/process_memory.h"
#include "sshsdp/comm/mpi_runtime.h"

namespace sshsdp {

NodeSetup SetUpNode(double params, int world_size, bool host_state) {
  const NodeCpus cpus = NodeCpuMasks();
  NodeSetup s;
  s.local_ranks = cpus.local_ranks;
  s.threads = kernels::ConfigureKernelThreads(cpus.local_ranks, cpus.cpus, cpus.disjoint);
  if (host_state) CheckModelFitsNode(params, world_size, cpus.local_ranks);
  return s;
}

}  // namespace sshsdp
