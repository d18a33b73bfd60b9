// The direct path on CUDA device memory (comm/direct_device.h): registered roots are
// cudaMalloc allocations exported with CUDA IPC and mapped by every node peer, pushes are
// cudaMemcpyAsync copies into the peers' mappings (the copy engines), the reduce-scatter's final
// reduction is one kernel reading the node's slices in place (cuda_direct_kernels.cu), all on
// one stream per communicator family that Complete() waits for. Several processes on one GPU
// work the same way as one process per GPU (IPC mappings of one device), which is how a single
// GPU runs the direct path's multi-rank tests.
//
//   std::unique_ptr<Backend> gpu = MakeBackend("cuda:0");
//   std::unique_ptr<DirectDeviceMemory> mem = MakeCudaDirectMemory(*gpu);
//   auto z2 = DirectCommunicator::Create(std::move(mpi_group), mem.get());   // one node
#pragma once

#include <memory>

#include "sshsdp/backend/backend.h"
#include "sshsdp/comm/direct_device.h"

namespace sshsdp {

// On the device of a cuda backend ("cuda:<n>"); DeviceError for another backend or a build
// without CUDA.
std::unique_ptr<DirectDeviceMemory> MakeCudaDirectMemory(const Backend& backend);

}  // namespace sshsdp
