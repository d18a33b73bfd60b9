// NcclCommunicator: the Communicator seam (comm/communicator.h) over NCCL, for buffers in CUDA
// device memory — the GPU counterpart of MpiCommunicator, with the same semantics and the same
// byte counters, so the engine's schedule and its counter tests do not change with the
// backend.
//
// What it adds to NCCL's collectives to keep the seam's contract:
//   * Sums in fp32. NCCL reduces bf16 in bf16 on every hop; the seam sums fp32 partials. bf16
//     inputs are widened to fp32 device scratch (the backend's CastBf16ToF32), reduced as fp32,
//     and the result is finished into recv: recv = total, or recv += total (fp32), or
//     recv = bf16(float(recv) + total) (bf16) — the fused accumulation of ReduceScatter.
//   * Checked preconditions, agreed before any NCCL call: device pointers (host memory is
//     refused, naming the buffer), dtypes, overlap — one small all-reduce over the bootstrap
//     per call, so a member that fails its checks does not leave the others inside NCCL — and
//     for Exchange the tags and sizes of every message in both directions of every pair,
//     compared over the bootstrap by both sides (NCCL would hang on a mismatch). NCCL has no
//     tags: Exchange posts each pair's messages sorted by tag (stable), which matches them as
//     MPI's tag matching would.
//   * NCCL is loaded at run time (dlopen "libnccl.so.2"): only Create needs it, and says so
//     (DeviceError on every member) when it cannot be loaded.
//   * One GPU per rank. NCCL before 2.30 refuses two ranks on one GPU; Create compares the
//     members' device UUIDs and throws CommError naming the positions that share one, on every
//     member, before NCCL is initialized. Several processes on one GPU use the direct path
//     (CUDA IPC) instead.
//   * Blocking calls. Each call returns when its result is in place (the seam's contract); the
//     communication stream is waited for under a WaitScope, so the job's watchdog ends a job
//     whose NCCL call hangs.
//
// Counters (exact, as MpiCommunicator's ring formulas, comm/ring_bytes.h; the successor's node
// decides intra or inter): AllGather (n-1)·c·e; ReduceScatter (n-1)·c·4 (fp32 partials for
// either input dtype); AllReduce ring bytes with fp32 in both halves (bf16 buffers are reduced
// as fp32 throughout); Exchange Σ bytes sent by peer node. These are the ring algorithm's
// bytes; NCCL may pick a tree for an all-reduce, which moves the same payload per rank.
//
//   auto world = MpiCommunicator::World(ranks_per_node);
//   std::unique_ptr<Backend> gpu = MakeBackend(fmt::format("cuda:{}", local_rank));
//   auto nccl = NcclCommunicator::Create(world->Duplicate(), gpu.get(), ranks_per_node);
//   nccl->ReduceScatter(g_full, DType::kBF16, g_z2, DType::kF32, shard, /*accumulate=*/true);
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/comm/communicator.h"

namespace sshsdp {

// Whether this build has the NCCL communicator (nccl.h found), and the version of the
// library it loads ("2.28.9"), or why there is none.
bool NcclCompiled();
std::string NcclVersion();

class NcclCommunicator : public Communicator {
 public:
  // Collective over `bootstrap`, whose members (by position) become this group; it carries the
  // NCCL unique id, the device check and Exchange's size check, and is owned from now on.
  // `backend` is this process's CUDA backend (its device is the one NCCL uses; it runs the
  // widening and finishing kernels) and must outlive the communicator. ranks_per_node splits
  // the counters into intra- and inter-node bytes as the world's topology does. Throws
  // DeviceError without NCCL or with a non-CUDA backend, CommError when members share a GPU.
  static std::unique_ptr<NcclCommunicator> Create(std::unique_ptr<Communicator> bootstrap,
                                                  Backend* backend, int ranks_per_node);
  ~NcclCommunicator() override = default;
};

}  // namespace sshsdp
