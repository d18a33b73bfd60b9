// StructuredUpdate: the update phase of a training step (docs/design.md, One step, step 3) as the
// engine sees it — which optimizer and unit every update parameter gets, one plan and executor per
// optimizer, run on the ZeRO-1 fragments.
//
// Per runtime group, SelectUnits applies the rule of every update parameter (UpdateOptions:
// AdamW everywhere, or Muon per head / per matrix / per expert for matrices with AdamW for the
// rest). All AdamW parameters of the model form one elementwise program (never communicates;
// its units are buffer members, so it also serves layouts whose members are pieces of update
// parameters, like the FSDP2 baseline's dim-0 shards);
// all Muon units of the model form one three-stage program whose Newton–Schulz stage moves the
// fragments of split units point to point — one batched exchange for the fetches and one for
// the returns, model-wide. Both run on the same ZeRO-1 state: "main", "grad", "m" and "v"
// (AdamW's second moment; unused by Muon parameters). With UpdateOptions::full_tensor (⑥, the
// FSDP2 baseline) the Muon units are instead taken in the parameters' logical order and run by
// FullTensorMuon: every rank of the ZeRO-1 group gathers every whole matrix (any buffer layout).
//
//   UpdateOptions o;  o.optimizer = OptimizerKind::kMuon;  o.muon_unit = UnitRule::kHead;
//   StructuredUpdate up({{&layout0, &chain0}, {&layout1, &chain1}}, o, rank, *p2p, &memory);
//   ScalarState s;  s.Set("grad_scale", scale);  s.Set("step", t);
//   s.Set("adamw.lr", lr);  s.Set("muon.lr", muon_lr);
//   up.Run(zero1_state, s);                 // AdamW program, then Muon program
//   up.plan(OptimizerKind::kMuon)->Describe();
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sshsdp/update/adamw.h"
#include "sshsdp/update/full_tensor_update.h"
#include "sshsdp/update/muon.h"
#include "sshsdp/update/update_executor.h"
#include "sshsdp/update/update_unit.h"

namespace sshsdp {

struct UpdateOptions {
  OptimizerKind optimizer = OptimizerKind::kAdamW;  // kMuon: Muon for eligible matrices
  AdamWConfig adamw;
  MuonConfig muon;
  UnitRule muon_unit = UnitRule::kHead;       // kHead or kMatrix
  std::map<std::string, UnitRule> overrides;  // by update- or runtime-parameter name
  // ⑥ FSDP2-style: Muon gathers every whole matrix on every rank of the ZeRO-1 group
  // (FullTensorMuon, full_tensor_update.h) instead of point-to-point units. Works on any
  // buffer layout (UpdateGroupView::pieces map members to parameters).
  bool full_tensor = false;
  // Runs AdamW's and Muon's kernels and holds the fields and the executors' temporaries
  // (adamw.h, muon.h, update_executor.h); not owned. Required (PlanError when null): the engine
  // passes EngineConfig::backend, the CPU backend by default.
  Backend* backend = nullptr;
};

// One runtime group as the update sees it.
struct UpdateGroupView {
  const GroupLayout* layout = nullptr;
  const ShardChain* chain = nullptr;  // this rank's shard chain of layout->list
  // pieces[m]: the part of an update parameter buffer member m holds. Empty: member m IS
  // update parameter m (the sshsdp flat layout). Point-to-point Muon units need that identity.
  std::vector<MemberPiece> pieces;
};

// The persistent state an optimizer keeps per element besides main and grad (the kState
// fields of its program): AdamW m, v; Muon m. The engine allocates each field only for the
// parameters whose optimizer keeps it.
std::vector<std::string> OptimizerStateFields(OptimizerKind k);

class StructuredUpdate {
 public:
  // groups[g]: runtime group g. `p2p` carries the Muon exchanges: a communicator ordered
  // like the topology (the world or a duplicate of it). Throws PlanError / ConfigError naming the
  // parameter on an invalid rule. `zero1` (options.full_tensor only): this rank's ZeRO-1 group,
  // position = ZeRO-1 chunk index, for the full_tensor all-gathers.
  StructuredUpdate(const std::vector<UpdateGroupView>& groups, const UpdateOptions& options,
                   int rank, Communicator& p2p, MemoryAccount* account = nullptr,
                   Communicator* zero1 = nullptr);
  // Plan only (engine/plan.h): the same selection, plans and executors' temporaries for
  // `rank`, without communicators; Run refuses. Not for options.full_tensor (PlanError).
  // `plans`, when given, keeps each (optimizer, HSDP replica)'s UpdatePlan for the next rank
  // planned with the same groups and options: a replica's plan is the same on all its ranks,
  // so planning every rank of a world builds W/so plans, not W.
  using PlanCache = std::map<std::pair<int, int>, std::shared_ptr<const UpdatePlan>>;
  StructuredUpdate(const std::vector<UpdateGroupView>& groups, const UpdateOptions& options,
                   int rank, PlanCache* plans = nullptr);

  // optimizers()[g][u]: which optimizer updates update parameter u of group g.
  const std::vector<std::vector<OptimizerKind>>& optimizers() const { return optimizers_; }
  // Runs AdamW, then Muon (point-to-point units, or full_tensor). Reads scalars "grad_scale",
  // "step", "adamw.lr", "muon.lr".
  void Run(const std::vector<Zero1State>& state, const ScalarState& scalars);

  // The plan of one optimizer (nullptr when no parameter uses it, and for Muon under
  // full_tensor, which has no plan: see full_tensor()).
  const UpdatePlan* plan(OptimizerKind opt) const;
  // Muon by full_tensor (nullptr unless options.full_tensor and some parameter uses Muon).
  const FullTensorMuon* full_tensor() const { return full_tensor_.get(); }
  // Statistics of the last Run, summed over both programs.
  const UpdateRunStats& last_run() const { return stats_; }
  uint64_t temporary_bytes() const;
  // The largest of the executors' temporaries: the peak of "update_temporaries" (the
  // programs run one after another, each releasing its roots before the next).
  uint64_t peak_temporary_bytes() const;
  // Share of parameters (elements) that Muon updates.
  double muon_share() const;

 private:
  void Build(const std::vector<UpdateGroupView>& groups, const UpdateOptions& options, int rank,
             Communicator* p2p, MemoryAccount* account, Communicator* zero1,
             PlanCache* plans = nullptr);
  std::vector<std::vector<OptimizerKind>> optimizers_;
  std::vector<std::unique_ptr<UpdateExecutor>> executors_;  // AdamW first, then Muon
  std::vector<OptimizerKind> kinds_;
  std::unique_ptr<FullTensorMuon> full_tensor_;
  UpdateRunStats stats_;
  size_t muon_elements_ = 0, total_elements_ = 0;
};

}  // namespace sshsdp
