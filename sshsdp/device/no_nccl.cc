// NcclCommunicator in a build without NCCL (no CUDA, or nccl.h / libnccl not found): asking for
// one says how to get it.
#include "sshsdp/device/nccl_communicator.h"

namespace sshsdp {

bool NcclCompiled() { return false; }
std::string NcclVersion() { return "none (built without NCCL)"; }

std::unique_ptr<NcclCommunicator> NcclCommunicator::Create(std::unique_ptr<Communicator> bootstrap,
                                                           Backend* /*backend*/,
                                                           int /*ranks_per_node*/) {
  throw DeviceError(fmt::format(
      "NcclCommunicator on {}: this sshsdp was built without NCCL; install NCCL with the CUDA "
      "toolkit (nccl.h, libnccl) and rebuild with -DSSHSDP_CUDA=ON, or use the MPI or direct "
      "communication path",
      bootstrap ? bootstrap->name() : "(none)"));
}

}  // namespace sshsdp
