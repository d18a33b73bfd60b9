// FullTensorMuon: Muon the way an FSDP2 user runs it (switch ⑥ kFullTensor, redundancy.h) —
// every rank of a ZeRO-1 group gathers every whole matrix (DTensor.full_tensor()), runs
// Newton–Schulz on all of them redundantly and keeps only its own shard of the result.
//
// Per step, on every rank of one ZeRO-1 group (the so ranks that together hold one copy of the
// optimizer state; each HSDP replica runs its own):
//   f0 "momentum" on this rank's ZeRO-1 fragments of every Muon parameter (elementwise, the
//      kernel of MuonProgram), writing u into a chunk-shaped send buffer;
//   one all-gather of u PER GATHER ITEM over the ZeRO-1 group — an item is what FSDP2 calls
//      full_tensor() on: one update parameter (unit "head": a head, a matrix, a stacked [E, f, d]
//      expert weight) or the merged parts of one runtime parameter (unit "matrix": the packed
//      QKV). Rank j contributes the item's elements inside its ZeRO-1 chunk (padding rows of a
//      dim-0 piece included), every rank sends count = the largest contribution (equal-count
//      all-gather: FSDP2 pads dim-0 chunks to rank 0's size), so a ring all-gather sends
//      (so − 1) · count · sizeof(u) bytes per rank and item;
//   reassembly: when the gathered pieces are not already the row-major matrix (dim-0 pieces of
//      several parts merged by "matrix", flat shards of uneven size), they are copied into a
//      whole-matrix buffer (MemberPiece mapping; counted in bytes_copied). Dim-0 pieces of one
//      parameter gathered rank-major ARE the matrix followed by padding rows, and a parameter
//      inside one flat chunk arrives whole: no copy;
//   f1 Newton–Schulz on EVERY Muon unit on every rank (batched by shape): so× the Newton–Schulz
//      FLOPs of the balanced point-to-point units (the redundancy of Figure 2 ⑥);
//   f2 "weight_update" on this rank's fragments, reading v at the fragments' matrix positions.
// Numerics are those of MuonProgram (same kernels), so results match the point-to-point units
// and the single-process reference up to summation order.
//
//   FullTensorMuon ft(groups, units, muon_cfg, rank, *zero1_comm, *cpu_backend, &memory);
//   ft.Run(zero1_state, scalars);   // "grad_scale", "muon.lr"
//   ft.last_run().bytes_sent;       // Σ_items (so − 1) · count · sizeof(u)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "sshsdp/base/memory_account.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/layout/shard_chain.h"
#include "sshsdp/update/muon.h"
#include "sshsdp/update/update_executor.h"

namespace sshsdp {

struct FullTensorGroup {
  const GroupLayout* layout = nullptr;  // the buffer layout (any shard layout)
  const ShardChain* chain = nullptr;    // this rank's chain of layout->list
  std::vector<MemberPiece> members;     // one per buffer member
  // Element offset of every update parameter in the group's logical (unsharded, unpadded,
  // row-major back to back) order — the coordinates of `units`.
  std::vector<size_t> logical_offset;
};

// One all-gather: the update parameters [first, first + count) of one group.
struct GatherItem {
  int group = 0;
  int first = 0, count = 1;
  size_t logical_begin = 0, numel = 0;
  size_t send_count = 0;        // elements every rank sends (the largest contribution)
  std::vector<size_t> lo, hi;   // per ZeRO-1 chunk j: its contribution [lo, hi) (buffer elems)
  bool zero_copy = false;       // the gathered buffer holds the matrix contiguously ...
  size_t zero_copy_offset = 0;  // ... from this element
  std::vector<int> units;       // Newton–Schulz units inside it
};

class FullTensorMuon {
 public:
  // `units`: the Muon units in logical coordinates (UpdateUnit::first_member / num_members
  // name update parameters). `zero1`: the ZeRO-1 group of this rank, position = ZeRO-1 chunk
  // index. Throws PlanError when it is not.
  FullTensorMuon(std::vector<FullTensorGroup> groups, std::vector<UpdateUnit> units,
                 const MuonConfig& cfg, int rank, Communicator& zero1, Backend& backend,
                 MemoryAccount* account);

  void Run(const std::vector<Zero1State>& state, const ScalarState& scalars);

  const std::vector<GatherItem>& items() const { return items_; }
  const UpdateRunStats& last_run() const { return stats_; }
  uint64_t temporary_bytes() const;
  // Bytes this rank sends per step: Σ_items (so − 1) · send_count · sizeof(u).
  uint64_t BytesSent() const;

 private:
  struct Run1 {  // gathered element src → logical element dst (within one item)
    size_t src = 0, dst = 0, len = 0;
  };
  std::vector<FullTensorGroup> groups_;
  std::vector<UpdateUnit> units_;
  MuonConfig cfg_;
  UpdateProgram program_;
  int rank_;
  Communicator& comm_;
  MemoryAccount* account_;
  std::vector<GatherItem> items_;
  std::vector<std::vector<Run1>> runs_;               // per item, when not zero_copy
  std::vector<size_t> recv_offset_, logical_offset_;  // per item, in elements
  size_t recv_elems_ = 0, logical_elems_ = 0, send_elems_ = 0;
  std::vector<size_t> send_offset_;  // per group: element offset of its chunk in the send buffer
  double exec_cost_ = 0;
  UpdateRunStats stats_;
};

}  // namespace sshsdp
