// UpdatePlan: where every unit of an update program runs and which point-to-point messages
// its unit stages need (paper §3.2 "Distributed updates", §3.4 "Update", Figure 5a).
//
// From the shard chains, every unit is cut into the pieces each rank owns at ZeRO-1. A unit
// with one piece is local: its owner runs it in place. A split unit gets ONE execution rank,
// shared by all unit stages of the program, chosen among its owners so that the work is
// balanced:
//   1. every rank starts with the cost of its local units (cost = Σ over the unit stages of
//      UpdateStage::cost, e.g. Newton–Schulz FLOPs 5·(4m²n + 2m³));
//   2. split units are placed in order of decreasing cost (ties: unit order), each on the
//      owner with the least load so far;
//   3. ties go to the owner holding the most elements of the unit (fewest bytes to move),
//      then to the owner of the unit's first element.
// Every rank computes the same plan from metadata alone, without communication. With HSDP
// (so < W) the plan is built for one replica: each replica runs the same plan on its own
// ranks (Topology coordinate d).
//
// For each unit stage, the messages are: fetch — every input-operand piece of a split unit not
// on its execution rank travels owner → exec; return — every output-operand piece travels
// exec → owner. Only declared operands travel; elementwise stages never communicate. The
// executor posts each stage's fetches as one batched exchange and its returns as another.
//
// In the paper's example (W=4, sw=sg=2, so=4; Linear [6,4] then Q heads [4,4]×3, Muon on the
// heads) Head0 has 12 elements on rank 2 and 4 on rank 1; both start with no load, so rank 2
// (more elements) executes it: u[12..16) (8 bf16 bytes) goes 1 → 2, v[12..16) (16 fp32
// bytes) goes 2 → 1.
//
//   UpdatePlan plan(MuonProgram(cfg), units, {&chain0, &chain1}, /*replica=*/0);
//   plan.placements()[0].exec_rank;     // 2
//   for (const PlannedMessage& m : plan.messages()) ...   // kind, field, src → dst, bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sshsdp/layout/shard_chain.h"
#include "sshsdp/update/update_stage.h"

namespace sshsdp {

// A contiguous piece of a unit owned by one rank at ZeRO-1.
struct UnitPiece {
  int rank = 0;      // world rank in the plan's replica
  int chunk = 0;     // ZeRO-1 chunk index
  size_t begin = 0;  // first group element
  size_t length = 0;
};

struct UnitPlacement {
  std::vector<UnitPiece> pieces;  // in element order, one per owning chunk
  int exec_rank = 0;
  double cost = 0;  // Σ over the program's unit stages
  bool split() const { return pieces.size() > 1; }
};

struct PlannedMessage {
  enum class Kind { kFetch, kReturn };
  Kind kind = Kind::kFetch;
  int stage = 0;
  std::string field;
  int unit = 0;
  int src = 0, dst = 0;  // world ranks
  size_t begin = 0;      // first group element
  size_t length = 0;     // elements
  size_t bytes = 0;
};

class UpdatePlan {
 public:
  // `chains[g]` is this rank's shard chain of runtime group g (units name groups by index).
  // Validates the program (ValidateProgram) and throws LayoutError when a unit leaves its
  // group's members.
  UpdatePlan(UpdateProgram program, std::vector<UpdateUnit> units,
             const std::vector<const ShardChain*>& chains, int replica);

  const UpdateProgram& program() const { return program_; }
  const std::vector<UpdateUnit>& units() const { return units_; }
  const std::vector<StageKind>& stage_kinds() const { return kinds_; }
  const std::vector<UnitPlacement>& placements() const { return placements_; }
  // Every message of the replica, in posting order (stage by stage, fetches then returns).
  const std::vector<PlannedMessage>& messages() const { return messages_; }

  // Cost of the units `rank` executes (local and split), and the bytes it sends.
  double ExecCost(int rank) const;
  uint64_t BytesSent(int rank) const;
  int num_split() const;
  // The ranks of the plan's replica.
  const std::vector<int>& ranks() const { return ranks_; }
  // One line per split unit and message, for logs and examples.
  std::string Describe() const;

 private:
  UpdateProgram program_;
  std::vector<UpdateUnit> units_;
  std::vector<StageKind> kinds_;
  std::vector<UnitPlacement> placements_;
  std::vector<PlannedMessage> messages_;
  std::vector<int> ranks_;
  int replica_ = 0;
};

}  // namespace sshsdp
