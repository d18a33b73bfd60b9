// The direct path's device memory (cuda_direct_memory.h) in a build without CUDA (SSHSDP_CUDA
// off, or no nvcc found): asking for it says how to get it.
#include "sshsdp/device/cuda_direct_memory.h"

namespace sshsdp {

std::unique_ptr<DirectDeviceMemory> MakeCudaDirectMemory(const Backend& backend) {
  throw DeviceError(fmt::format(
      "the direct path on device memory needs CUDA, and this sshsdp was built without it "
      "(backend {}); rebuild with -DSSHSDP_CUDA=ON",
      backend.name()));
}

}  // namespace sshsdp
