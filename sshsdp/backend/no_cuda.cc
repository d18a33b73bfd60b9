// The CUDA entry points of backend.h in a build without CUDA (SSHSDP_CUDA off, or no nvcc
// found): there is no CUDA backend, and asking for one says how to get it.
#include "sshsdp/backend/backend.h"

namespace sshsdp {

bool CudaCompiled() { return false; }
int CudaDeviceCount() { return 0; }

std::unique_ptr<Backend> MakeCudaBackend(int ordinal) {
  throw DeviceError(fmt::format(
      "cuda:{}: this sshsdp was built without CUDA; rebuild with the CUDA toolkit installed "
      "(nvcc on PATH) and -DSSHSDP_CUDA=ON, or use --backend cpu",
      ordinal));
}

}  // namespace sshsdp
