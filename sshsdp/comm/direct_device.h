// DirectDeviceMemory: what the direct path (direct_communicator.h) needs from a device to move
// payload between registered buffers in device memory — the paper's direct transfers between
// the GPUs of a node (registered peer buffers, copy-engine puts, reduce on arrival). Several
// processes on one GPU are the same mechanism, which is how a single GPU tests multi-rank GPU
// code (NCCL before 2.30 refuses two ranks on one GPU).
//
// The direct path keeps its protocol: the descriptor rendezvous over MPI, the "done" flags in
// host shared memory. With a DirectDeviceMemory a registered root is device memory that every
// node peer has mapped (OpenRegions: CUDA IPC handles, all-gathered over the node), the
// all-gather's pushes are device copies into the peers' regions, the reduce-scatter's final
// reduction is a device kernel reading the node's slices in place, and Complete() waits for
// both before the flags say "done". Only one node: across nodes device buffers go over NCCL.
// AllReduce and Exchange (small: norms, update fragments) are staged through host memory over
// MPI, with MPI's counters.
//
// ReduceSlices must give the bits of the host path (HostReduceSlices below): out (=|+=) the
// fp32 sum of the slices in their order, each loaded as fp32, no fused multiply-add.
//
//   std::unique_ptr<DirectDeviceMemory> mem = MakeCudaDirectMemory(gpu.get());  // device/
//   auto z2 = DirectCommunicator::Create(std::move(mpi_group), mem.get());
//   DataNode& g = z2->Register(std::move(root));      // device memory, mapped by node peers
//   z2->ReduceScatter(g.data(), DType::kBF16, gz2, DType::kF32, shard, /*accumulate=*/true);
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

class DirectDeviceMemory {
 public:
  virtual ~DirectDeviceMemory() = default;
  virtual std::string name() const = 0;  // "cuda:0 (NVIDIA H200, sm_90)"

  // Moves `bytes` from every node member to every member, in member order (all = L·bytes).
  using NodeAllGather = std::function<void(const void* mine, void* all, size_t bytes)>;
  // Collective over the node's L members: allocates `bytes` (> 0, 64-byte aligned, zeroed)
  // here and maps every member's allocation; returns the L bases by node-local index (own at
  // my_l). Throws on failure (every member then throws: the mapping step all-gathers a status).
  virtual std::vector<char*> OpenRegions(size_t bytes, int my_l, int L,
                                         const NodeAllGather& all_gather) = 0;
  // Unmaps the peers' regions, waits at node_barrier until every member has, then frees this
  // rank's. Collective over the node; never throws (it runs in destructors).
  virtual void CloseRegions(const std::vector<char*>& bases, int my_l,
                            const std::function<void()>& node_barrier) noexcept = 0;

  // Whether [p, p + bytes) is memory of this device (bytes == 0: true).
  virtual bool IsDeviceMemory(const void* p, size_t bytes) const = 0;
  // Device copy (dst or src may be a node peer's region); may return before it completes.
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  // out[i] (=|+=) Σ_{j<m} srcs[j][i] in fp32, in the order of j; srcs fp32 or bf16 (src_dtype),
  // out fp32 or bf16 (bf16: rounded to nearest even from fp32). May return before it completes.
  virtual void ReduceSlices(const void* const* srcs, DType src_dtype, int m, void* out,
                            DType out_dtype, size_t n, bool accumulate) = 0;
  // Waits until every Copy and ReduceSlices issued here has completed and is visible to the
  // node peers.
  virtual void Complete() = 0;
  // Blocking copies between host and device memory.
  virtual void ToHost(void* host, const void* src, size_t bytes) = 0;
  virtual void FromHost(void* dst, const void* host, size_t bytes) = 0;
};

// The host reference of ReduceSlices (the direct path's own final reduction on one node).
void HostReduceSlices(const void* const* srcs, DType src_dtype, int m, void* out, DType out_dtype,
                      size_t n, bool accumulate);

}  // namespace sshsdp
