// Update units: the pieces of data one structured optimizer stage needs whole (paper §3.2,
// "Distributed updates"), and the per-parameter rule that picks them.
//
// A unit is a contiguous row-major [rows, cols] matrix inside one runtime group's flat tensor
// list (GroupLayout::list), given by its first element and shape. It is one of:
//   * one update parameter — a head's Q, K or V matrix, an MLP matrix;
//   * one slice of a stacked update parameter — expert e of an [E, rows, cols] weight (any
//     parameter of rank >= 3 is split along its leading dimensions);
//   * a run of consecutive update parameters merged into one matrix — every head of the packed
//     QKV runtime parameter treated as the one [3d, d] matrix ("matrix" rule).
// Units depend only on the model, never on sharding: the planner intersects them with the
// ZeRO-1 chunks of each layout afterwards.
//
// Rules (UnitRule) are chosen per parameter: a default for matrix update parts plus overrides
// by update-parameter or runtime-parameter name. Norm gains (UpdateKind::kVector), embedding /
// LM-head tables (kEmbedding) and matrices the model marks muon_eligible = false (an MoE
// router) use AdamW unless an override says otherwise.
//
//   UnitPolicy policy;  policy.muon = true;  policy.matrix_rule = UnitRule::kHead;
//   UnitSelection sel = SelectUnits(layout, policy);
//   sel.muon[0].name;                  // "blocks.0.attn.q.h0", [d_head, d]
//   sel.optimizer[member];             // OptimizerKind::kMuon or kAdamW, per update parameter
//   policy.matrix_rule = UnitRule::kMatrix;   // QKV heads merged: "blocks.0.attn.qkv", [3d, d]
//   policy.overrides["lm_head"] = UnitRule::kHead;   // Muon on the LM head as well
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sshsdp/params/param_layout.h"

namespace sshsdp {

// How one update parameter is updated.
enum class UnitRule {
  kAdamW,   // elementwise AdamW
  kHead,    // Muon, one unit per update parameter (per head of QKV; per expert when stacked)
  kMatrix,  // Muon, one unit per runtime parameter: its update parts merged into one matrix
            // (per leading index when the runtime parameter is stacked, rank >= 3)
};
const char* UnitRuleName(UnitRule r);  // "adamw", "head", "matrix"
// Parses "adamw" | "head" | "matrix"; ConfigError otherwise.
UnitRule ParseUnitRule(const std::string& s);

struct UpdateUnit {
  std::string name;  // update or runtime parameter name, "[e]" appended for a stacked slice
  int group = 0;
  int first_member = 0;  // update parameters it touches: [first_member, first_member+num_members)
  int num_members = 1;
  UpdateKind kind = UpdateKind::kMatrix;  // of its first update parameter
  size_t begin = 0;                       // first element in the group's flat list
  int64_t rows = 0, cols = 0;
  size_t numel() const { return static_cast<size_t>(rows * cols); }
  size_t end() const { return begin + numel(); }
};

struct UnitPolicy {
  bool muon = false;                       // false: AdamW for every parameter
  UnitRule matrix_rule = UnitRule::kHead;  // rule of kMatrix update parts when muon
  // Per-parameter rules by update-parameter name, else by runtime-parameter name; they apply
  // whether or not `muon` is set.
  std::map<std::string, UnitRule> overrides;
};

struct UnitSelection {
  std::vector<OptimizerKind> optimizer;  // per update parameter (tensor-list member)
  std::vector<UnitRule> rule;            // per update parameter
  std::vector<UpdateUnit> adamw;         // one unit per AdamW update parameter
  std::vector<UpdateUnit> muon;          // Muon units, in buffer order
};

// The rule of one update parameter of runtime parameter `rp`: its override by name, else
// its runtime parameter's, else kAdamW unless policy.muon and it is a Muon-eligible matrix
// (MuonEligible, rank >= 2), which gets policy.matrix_rule.
UnitRule RuleFor(const UpdateParam& u, const RuntimeParam& rp, const UnitPolicy& policy);

// Applies `policy` to every update parameter of `layout`. Throws PlanError naming the
// parameter when a Muon rule meets a parameter of rank < 2, when a "matrix" rule applies to
// only some parts of a runtime parameter, or when merged parts are not contiguous.
UnitSelection SelectUnits(const GroupLayout& layout, const UnitPolicy& policy);

}  // namespace sshsdp
