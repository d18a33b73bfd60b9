// Communicator: the only seam through which sshsdp moves bytes between ranks (docs/design.md,
// Communication).
//
// A Communicator is a context object for one ordered group of ranks (gloo style: no
// global state). Position i in the group reads/writes the i-th slice of a collective's
// buffer, so groups built from a Topology act on ZeRO buffers in place. Every call checks
// its preconditions (sizes, dtypes, aliasing) before any transfer and throws CommError
// naming the call, the group and the failing argument. Every byte this rank sends is
// counted, split intra-/inter-node by the world's ranks_per_node.
//
// Backends: MpiCommunicator (always built). A CUDA/NCCL backend slots in behind this
// interface.
//
//   auto world = MpiCommunicator::World(/*ranks_per_node=*/4);
//   auto z3 = world->Split(topo.GroupColor(Group::kZero3, r),
//                          topo.GroupPosition(Group::kZero3, r));
//   z3->AllGatherInPlace(buf, shard_count, DType::kBF16);  // input at buf + pos*shard
//   z2->ReduceScatter(grad, DType::kBF16, shard, DType::kF32, shard_count,
//                     /*accumulate=*/true);                 // shard += Σ slices
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/numerics/dtype.h"
#include "sshsdp/numerics/stochastic_rounding.h"

namespace sshsdp {

// Bytes this rank sent, by destination locality. Deterministic: tests assert them exactly.
struct CommCounters {
  uint64_t intra_node_bytes = 0;
  uint64_t inter_node_bytes = 0;
  uint64_t calls = 0;
  // Bytes a collective copied inside this process, not sent: an out-of-place all-gather's own
  // shard into its slot of the output. Not in total(); engines report it next to their own
  // copies so "bytes copied" compares like with like (StepCounters::collective_copy_bytes).
  uint64_t local_copy_bytes = 0;
  uint64_t total() const { return intra_node_bytes + inter_node_bytes; }
  CommCounters& operator+=(const CommCounters& o) {
    intra_node_bytes += o.intra_node_bytes;
    inter_node_bytes += o.inter_node_bytes;
    calls += o.calls;
    local_copy_bytes += o.local_copy_bytes;
    return *this;
  }
};

// Counters accumulated between two reads of a communicator's counters().
inline CommCounters Delta(const CommCounters& after, const CommCounters& before) {
  CommCounters d;
  d.intra_node_bytes = after.intra_node_bytes - before.intra_node_bytes;
  d.inter_node_bytes = after.inter_node_bytes - before.inter_node_bytes;
  d.calls = after.calls - before.calls;
  d.local_copy_bytes = after.local_copy_bytes - before.local_copy_bytes;
  return d;
}

// Whether two byte ranges overlap (empty ranges never do): collectives refuse aliasing buffers.
inline bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// One message of a batched point-to-point exchange. `peer` is a position in this group.
struct P2POp {
  int peer = 0;
  void* data = nullptr;  // send: read from; recv: written to
  size_t bytes = 0;
  int tag = 0;
};

// Precision of a reduce-scatter's intermediate partial sums (paper §4.3 reduction modes):
//   fp32      fp32 partials (the default; ReduceScatter),
//   bf16 + SR partials stored as bf16 with stochastic rounding (mode bf16sr), the draw of a
//             partial element keyed by `sr_key` (seed, step, stream) and the element's LOGICAL
//             index (backend-defined from its position in the send buffer and the reduction
//             hop, never from timing), so a run reproduces bit for bit and resumes exactly.
// Inputs are always summed in fp32 and the final reduction accumulates in fp32 into recv.
struct ReduceScatterOptions {
  DType partial_dtype = DType::kF32;  // kF32 or kBF16 (stochastically rounded)
  SrKey sr_key;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // position in this group
  virtual int size() const = 0;
  virtual int world_rank(int position) const = 0;  // world rank of a member
  virtual std::string name() const = 0;            // for error messages, e.g. "zero3{0,1}"

  // All-gather of `count` elements per rank. In place: this rank's input already sits at
  // buf + rank()*count elements; on return buf holds size()*count elements.
  virtual void AllGatherInPlace(void* buf, size_t count, DType dtype) = 0;
  // Out of place: `send` (count elements) -> `recv` (size()*count elements).
  virtual void AllGather(const void* send, void* recv, size_t count, DType dtype) = 0;

  // Reduce-scatter (SUM) of size()*count elements of `send`; this rank receives the sum of
  // slice rank() in `recv` (count elements, fp32 or bf16). With accumulate,
  // the final reduction adds straight into the existing `recv` (recv += Σ slices), so no
  // separate result buffer or add pass is needed. `send` may be fp32 or bf16 (summed in
  // fp32); `recv` dtype is given separately. `send` and `recv` must not overlap.
  virtual void ReduceScatter(const void* send, DType send_dtype, void* recv, DType recv_dtype,
                             size_t count, bool accumulate) = 0;

  // ReduceScatter with explicit partial precision. The default handles fp32 partials (=
  // ReduceScatter) and throws CommError for others; MpiCommunicator implements bf16+SR in its
  // ring (hop h's partial of element i of the send buffer is rounded with the draw of logical
  // index h·size()·count + i).
  virtual void ReduceScatterPartials(const void* send, DType send_dtype, void* recv,
                                     DType recv_dtype, size_t count, bool accumulate,
                                     const ReduceScatterOptions& options) {
    SSHSDP_CHECK(options.partial_dtype == DType::kF32, CommError,
                 "ReduceScatterPartials on {}: {} partials are not supported by this backend",
                 name(), DTypeName(options.partial_dtype));
    ReduceScatter(send, send_dtype, recv, recv_dtype, count, accumulate);
  }

  // In-place all-reduce (SUM) of `count` elements (fp32 or bf16, summed in fp32).
  virtual void AllReduce(void* buf, size_t count, DType dtype) = 0;

  // Batched point-to-point: all sends and receives are posted together and completed
  // before return. Peers are positions in this group.
  virtual void Exchange(const std::vector<P2POp>& sends, const std::vector<P2POp>& recvs) = 0;

  virtual void Barrier() = 0;

  // A sub-group of the ranks passing the same `color`, ordered by `key` (the buffer
  // position). Collective over this group.
  virtual std::unique_ptr<Communicator> Split(int color, int key) = 0;
  // A duplicate with its own message space (for a communication thread).
  virtual std::unique_ptr<Communicator> Duplicate() = 0;

  const CommCounters& counters() const { return counters_; }
  void ResetCounters() { counters_ = {}; }

 protected:
  CommCounters counters_;
};

}  // namespace sshsdp
