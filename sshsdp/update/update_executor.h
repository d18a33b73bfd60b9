// UpdateExecutor: runs one UpdatePlan on this rank (paper §3.2, §4.1, appendix "Allocations
// and update execution").
//
// Stages run in order. An elementwise stage runs once over every local piece of every unit
// (one multi-tensor kernel call). A unit stage
//   1. posts the stage's fetches as ONE batched point-to-point exchange (input fragments of
//      split units, owner → execution rank),
//   2. runs the kernel over the units this rank executes, batched by shape (Newton–Schulz as
//      batched GEMMs over equal-shaped matrices),
//   3. posts the returns as ONE exchange (output fragments, execution rank → owner).
// Persistent state stays sharded: kernels read and write the ZeRO-1 arrays in place.
//
// Temporaries (Muon's u and v) live in update-scoped data trees, one root per field, allocated
// at the start of Run and released at its end (category "update_temporaries"). Each root has
// one view per unit this rank executes (the whole [rows, cols] matrix, 64-byte aligned) and
// one view per local fragment of a unit executed elsewhere. An elementwise stage writes the
// local fragment of an executed unit straight into its place inside the whole-unit view, and
// fragments arriving from other ranks are received into that same view, so nothing is copied
// to assemble a unit. Only state operands of a unit stage (none in Muon) need this rank's own
// fragment copied to and from a scratch view; those bytes are reported as bytes_copied.
//
//   UpdateExecutor ex(plan, chains, rank, *p2p_comm, &memory);    // comm: world duplicate
//   std::vector<Zero1State> st(num_groups);           // per group: chunk + {"main","grad",...}
//   ScalarState sc;  sc.Set("grad_scale", 0.25);  sc.Set("muon.lr", 0.02);
//   ex.Run(st, sc);
//   ex.last_run().bytes_sent;                         // == plan->BytesSent(rank)
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/base/memory_account.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/layout/data_node.h"
#include "sshsdp/update/update_plan.h"

namespace sshsdp {

// Chunk elements [begin, end) of a packed field, stored from data[offset].
struct PackedRun {
  size_t begin = 0, end = 0, offset = 0;
};

// One persistent fp32 ZeRO-1 field of a runtime group on this rank. Dense: element i of the
// chunk at data[i] (main, grad, m). Packed: stored only for the runs of chunk elements whose
// optimizer keeps the field (AdamW's v: Muon parameters have none, so they spend no bytes on
// it), runs sorted by begin.
struct Zero1Array {
  float* data = nullptr;
  bool packed = false;
  std::vector<PackedRun> runs;

  Zero1Array() = default;
  Zero1Array(float* dense) : data(dense) {}  // NOLINT: implicit, {"m", m.data()}
  // Element i of the chunk, or nullptr when a packed field does not store it.
  float* At(size_t i) const;
  // Where element i of the chunk is stored (an index from data), or kNotStored.
  static constexpr size_t kNotStored = static_cast<size_t>(-1);
  size_t Index(size_t i) const;
  // Elements stored (packed: Σ run lengths; dense: unknown here, 0).
  size_t stored() const;
};

// This rank's persistent ZeRO-1 fields of one runtime group: element i is element
// chunk.begin + i of the group's flat layout.
struct Zero1State {
  Range chunk;
  std::map<std::string, Zero1Array> fields;
};

struct UpdateRunStats {
  uint64_t bytes_sent = 0;    // point-to-point payload this rank sent
  uint64_t bytes_copied = 0;  // own fragments of state operands copied for unit stages
  uint64_t exchanges = 0;     // Exchange calls issued
  uint64_t units_executed = 0;
  double exec_cost = 0;  // Σ unit cost executed here (e.g. Newton–Schulz FLOPs)
  UpdateRunStats& operator+=(const UpdateRunStats& o) {
    bytes_sent += o.bytes_sent;
    bytes_copied += o.bytes_copied;
    exchanges += o.exchanges;
    units_executed += o.units_executed;
    exec_cost += o.exec_cost;
    return *this;
  }
};

class UpdateExecutor {
 public:
  // `chains[g]` is this rank's shard chain of group g (as given to the plan); `comm` carries
  // the point-to-point messages and is ordered like the topology (position = rank: the world
  // communicator or a duplicate of it). Throws LayoutError when it is not. A null `comm`
  // builds a plan-only executor (engine/plan.h: its temporaries are sized, Run refuses).
  // `backend` (not owned) runs the stages' kernels and holds the fields and the executor's
  // update-scoped roots. On host memory (Backend::host_memory: the CPU backend) the roots are
  // allocated per Run and the communicator moves them in place. On a device they are allocated
  // at the first Run and kept, accounted, until the executor goes (an allocation per step would
  // synchronize the device), own fragments of state operands are copied by Backend::Copy, and
  // every exchange is staged through host buffers (CopyOut, the communicator on host memory,
  // CopyIn): the byte counts and messages are those of host memory.
  UpdateExecutor(std::shared_ptr<const UpdatePlan> plan,
                 const std::vector<const ShardChain*>& chains, int rank, Communicator* comm,
                 Backend& backend, MemoryAccount* account = nullptr);
  ~UpdateExecutor();
  UpdateExecutor(const UpdateExecutor&) = delete;
  UpdateExecutor& operator=(const UpdateExecutor&) = delete;

  // Runs every stage. `state[g]` must provide every state field the program declares for each
  // group that has units (PlanError naming the field otherwise). Collective over the ranks of
  // this replica that share split units.
  void Run(const std::vector<Zero1State>& state, const ScalarState& scalars);

  const UpdatePlan& plan() const { return *plan_; }
  const UpdateRunStats& last_run() const { return stats_; }
  // Bytes of the update-scoped roots this rank allocates per Run.
  uint64_t temporary_bytes() const;

 private:
  struct Loc {
    DataNode* node = nullptr;  // nullptr: a state field
    int group = 0;
    int field = 0;
    size_t byte_offset = 0;
  };
  struct ItemPlan {
    int unit = 0;
    size_t begin = 0;
    int64_t numel = 0;
    std::vector<Loc> locs;  // per operand: inputs, then outputs
  };
  struct Xfer {
    int peer = 0;  // rank = position in comm
    Loc loc;
    size_t bytes = 0;
  };
  struct Copy {
    Loc from, to;
    size_t bytes = 0;
  };
  struct StagePlan {
    StageKind kind = StageKind::kElementwise;
    std::vector<ItemPlan> items;
    std::vector<std::vector<size_t>> by_shape;  // unit stages: item indices of one shape
    std::vector<Xfer> fetch_send, fetch_recv, return_send, return_recv;
    std::vector<Copy> copy_in, copy_out;
  };

  const UnitPiece* MyPiece(int unit) const;
  Loc PieceLoc(int field, int unit) const;  // this rank's piece of `unit`
  Loc UnitLoc(int field, int unit) const;   // the whole unit, on its execution rank
  void* Ptr(const Loc& loc) const;
  void Exchange(const std::vector<Xfer>& sends, const std::vector<Xfer>& recvs, int tag);
  void CopyBytes(const Copy& c);
  void AllocateRoots();
  void ReleaseRoots();

  std::shared_ptr<const UpdatePlan> plan_;
  int rank_;
  Communicator* comm_;  // null: plan only
  MemoryAccount* account_;
  Backend& backend_;
  bool on_device_;                    // !backend_.host_memory()
  std::vector<void*> device_blocks_;  // on a device: the roots' memory, kept from the first Run
  std::vector<size_t> z1_begin_;      // per group
  std::vector<std::unique_ptr<DataNode>> roots_;
  std::vector<std::vector<DataNode*>> whole_, piece_;  // [field][unit] views (or nullptr)
  std::vector<std::vector<DataNode*>> scratch_;        // [field][unit] for state fields
  std::vector<StagePlan> stages_;
  std::vector<std::vector<const Zero1Array*>> state_ptr_;  // [group][field], during Run
  UpdateRunStats stats_;
};

}  // namespace sshsdp
