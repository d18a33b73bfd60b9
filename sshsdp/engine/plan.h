// RunPlan: what a run will allocate and move on every rank, computed in one process before it
// is launched (`sshsdp plan`, issue 18) — no MPI, no model weights or activations allocated.
//
// The plan is built by the engine's own construction code, not a second model of it: each
// rank's runtime groups come from PlanRuntimeGroup and BufferSizes (what Engine::BuildGroup
// allocates for), the optimizer-state layout from Engine::StateLayout, the structured update
// and the MXFP8 G plan from StructuredUpdate / MxWeights built plan-only (the same unit
// selection, placements, messages and temporaries), the transient peak from a dry
// TransientPool replaying the step's gather / gradient buffer order, and every collective's
// bytes from the ring accounting MpiCommunicator counts with (comm/ring_bytes.h). plan_test
// checks the result against the counters and the memory account of real multi-rank steps.
//
// Scope: sshsdp's own data path on the collective comm path. Baseline presets (their copies
// live on other threads and in other buffers), comm_path = direct and ⑥ full_tensor are
// refused by name; activations belong to the model and are not planned.
//
//   EngineConfig cfg;  cfg.sw = 2; cfg.sg = 2; cfg.so = 4; cfg.microbatches = 2; ...
//   RunPlan p = PlanRun(model, /*world=*/4, cfg);   // ConfigError / LayoutError as Engine
//   p.ranks[1].memory.at("optimizer_state");        // bytes on rank 1
//   p.ranks[1].runtime_comm.total();                // bytes rank 1 sends per step
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sshsdp/comm/communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/layout/topology.h"
#include "sshsdp/params/model.h"

namespace sshsdp {

// One kind of collective over one optimizer step on one rank.
struct PlannedCollective {
  std::string name;    // "all-gather", "reduce-scatter", "outer reduce-scatter", ...
  std::string group;   // the group it runs in: "zero3", "zero2", "replica", "hsdp", "world"
  int group_size = 1;  // ranks in that group
  uint64_t calls = 0;  // calls per step
  CommCounters sent;   // bytes this rank sends per step, intra / inter node
};

// A Muon (or MXFP8 G) unit of the plan: where it runs and what it costs.
struct PlannedUnit {
  std::string program;  // "muon" or "mx_quantize"
  std::string name;
  int rows = 0, cols = 0;
  std::vector<int> owners;  // ranks holding its ZeRO-1 pieces, in element order
  int exec_rank = 0;
  double cost = 0;  // Newton–Schulz FLOPs (muon)
};

// One ZeRO-1 chunk of one runtime group: its owner in every replica and the members in it.
struct PlannedChunk {
  int group = 0;
  int chunk = 0;
  size_t begin = 0, end = 0;         // elements of the padded group buffer
  std::vector<int> owners;           // per HSDP replica
  std::vector<std::string> members;  // members (or their pieces) inside [begin, end)
};

struct RankPlan {
  int rank = 0;
  RankCoord coord;
  // Peak bytes by MemoryAccount category: weights, main_weights, gradients, optimizer_state,
  // transient, update_temporaries, scales (MXFP8); activations are the model's (not planned).
  std::map<std::string, uint64_t> memory;
  uint64_t peak = 0;  // Σ of the categories: every one can be live at once
  std::vector<PlannedCollective> collectives;
  // Per step, as StepCounters reports them.
  CommCounters runtime_comm;  // ZeRO-3 all-gathers and ZeRO-2 reduce-scatters (+ MXFP8 S)
  CommCounters update_comm;   // outer RS / HSDP all-reduce / norm / point to point / outer AG
                              // (calls: the ring collectives'; exchanges are not counted)
  CommCounters update_p2p;    // the structured update's point-to-point messages
  uint64_t gathers = 0, reduce_scatters = 0;
  double update_exec_cost = 0;  // Newton–Schulz FLOPs this rank runs
  uint64_t mx_p2p_bytes = 0;    // MXFP8 G: codes and scales sent
};

struct PlannedGroup {
  int group = 0;
  size_t numel = 0, padded = 0;
  std::string dtype;  // runtime weight dtype of the group
  int members = 0, update_params = 0;
};

struct RunPlan {
  Topology topo;
  EngineConfig cfg;
  std::vector<PlannedGroup> groups;
  std::vector<RankPlan> ranks;
  std::vector<PlannedUnit> units;    // split and local Muon / G units of replica 0
  std::vector<PlannedChunk> chunks;  // the ZeRO-1 owner map (paper Figure 5)
  int muon_units = 0, muon_split = 0;
};

// Throws the Engine constructor's ConfigError / LayoutError for a configuration that cannot run
// on `world` ranks, and ConfigError for one outside the plan's scope (see above).
RunPlan PlanRun(const Model& model, int world, const EngineConfig& cfg);

}  // namespace sshsdp
