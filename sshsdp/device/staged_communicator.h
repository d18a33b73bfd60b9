// StagedCommunicator: the Communicator seam for buffers in a device backend's memory over a
// communicator that moves host memory only (MPI): each call copies what it reads out of the
// device into one host buffer, runs the inner collective there, and copies what it wrote back.
// It is how the engine on a device runs its outer phase — the replica group's reduce-scatter
// and all-gather, HSDP's all-reduce — when those groups are not on NCCL: once per step, not
// per microbatch, so two PCIe crossings per byte cost little next to the step (and across
// nodes MPI moves host memory anyway). The runtime ZeRO-3 / ZeRO-2 groups, run every
// microbatch, stay on the direct path or NCCL.
//
// Same semantics and byte counters as the inner communicator (counters() is the inner's,
// call for call); the device ↔ host bytes are counted apart (staged_bytes()). The one
// precondition the inner communicator cannot see on host copies — send and recv overlapping in
// device memory — is checked here, as MpiCommunicator checks it (CommError naming the call).
//
// The copies run on a stream of their own (Backend::NewStream), so the communicator may be
// called from the communication thread while the compute thread uses the backend; the caller
// synchronizes the compute stream before handing a buffer over, as for any communicator. One
// thread at a time per communicator. The host buffer is the backend's AllocHost (page-locked
// on CUDA, where pageable memory would add a bounce copy; not yet measured on a GPU).
//
//   auto up = std::make_unique<StagedCommunicator>(world.Split(color, key), gpu.get());
//   up->Reserve(bytes);                          // the host buffer, before the hot path
//   up->ReduceScatter(g_z2, DType::kF32, g_z1, DType::kF32, shard, /*accumulate=*/false);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/comm/communicator.h"

namespace sshsdp {

class StagedCommunicator final : public Communicator {
 public:
  // `inner` moves host memory (an MpiCommunicator or a split of one); `device` is the backend
  // whose memory the calls' buffers are in (it must outlive this; only its device is used:
  // the copies run on a handle of its own).
  StagedCommunicator(std::unique_ptr<Communicator> inner, Backend* device);
  ~StagedCommunicator() override;
  StagedCommunicator(const StagedCommunicator&) = delete;
  StagedCommunicator& operator=(const StagedCommunicator&) = delete;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int world_rank(int position) const override { return inner_->world_rank(position); }
  std::string name() const override { return inner_->name() + " (staged)"; }

  void AllGatherInPlace(void* buf, size_t count, DType dtype) override;
  void AllGather(const void* send, void* recv, size_t count, DType dtype) override;
  void ReduceScatter(const void* send, DType send_dtype, void* recv, DType recv_dtype, size_t count,
                     bool accumulate) override;
  void ReduceScatterPartials(const void* send, DType send_dtype, void* recv, DType recv_dtype,
                             size_t count, bool accumulate,
                             const ReduceScatterOptions& options) override;
  void AllReduce(void* buf, size_t count, DType dtype) override;
  void Exchange(const std::vector<P2POp>& sends, const std::vector<P2POp>& recvs) override;
  void Barrier() override;
  std::unique_ptr<Communicator> Split(int color, int key) override;
  std::unique_ptr<Communicator> Duplicate() override;

  // Sizes the host buffer to at least `bytes` now (the largest call's device bytes: send +
  // recv), so no call allocates; a larger call grows it.
  void Reserve(size_t bytes);
  size_t host_bytes() const { return host_bytes_; }
  // Bytes copied device → host and host → device by this communicator's calls so far.
  uint64_t staged_bytes() const { return staged_bytes_; }

 private:
  char* Host(size_t bytes);
  void ToHost(void* host, const void* dev, size_t bytes);
  void ToDevice(void* dev, const void* host, size_t bytes);
  // Runs `call` on the inner communicator and adds what it counted to this one's counters.
  template <typename F>
  void Counted(F&& call);

  std::unique_ptr<Communicator> inner_;
  Backend* device_;
  std::unique_ptr<Backend> copies_;  // device_->NewStream(): this communicator's thread only
  char* host_ = nullptr;             // copies_->AllocHost: page-locked on CUDA
  size_t host_bytes_ = 0;
  uint64_t staged_bytes_ = 0;
};

}  // namespace sshsdp
