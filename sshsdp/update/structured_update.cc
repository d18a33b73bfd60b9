// StructuredUpdate: unit selection, plans and executors of the update phase (see
// structured_update.h).
#include "sshsdp/update/structured_update.h"

#include "sshsdp/base/error.h"

namespace sshsdp {

StructuredUpdate::StructuredUpdate(const std::vector<const GroupLayout*>& layouts,
                                   const std::vector<const ShardChain*>& chains,
                                   const UpdateOptions& options, int rank, Communicator& p2p,
                                   MemoryAccount* account) {
  SSHSDP_CHECK(layouts.size() == chains.size() && !layouts.empty(), PlanError,
               "structured update: {} layouts but {} shard chains", layouts.size(), chains.size());
  SSHSDP_CHECK(options.muon_unit == UnitRule::kHead || options.muon_unit == UnitRule::kMatrix,
               ConfigError, "Muon unit must be 'head' or 'matrix', got '{}'",
               UnitRuleName(options.muon_unit));
  UnitPolicy policy;
  policy.muon = options.optimizer == OptimizerKind::kMuon;
  policy.matrix_rule = options.muon_unit;
  policy.overrides = options.overrides;
  std::vector<UpdateUnit> adamw, muon;
  for (size_t g = 0; g < layouts.size(); ++g) {
    const GroupLayout& L = *layouts[g];
    SSHSDP_CHECK(L.group == static_cast<int>(g), PlanError,
                 "structured update: layout {} is group {}; pass the groups in order", g, L.group);
    SSHSDP_CHECK(L.update.size() == L.list.num_members(), PlanError,
                 "structured update: group {} has {} update parameters but {} buffer members; "
                 "point-to-point units need one member per update parameter",
                 g, L.update.size(), L.list.num_members());
    UnitSelection sel = SelectUnits(L, policy);
    optimizers_.push_back(sel.optimizer);
    adamw.insert(adamw.end(), sel.adamw.begin(), sel.adamw.end());
    muon.insert(muon.end(), sel.muon.begin(), sel.muon.end());
    for (size_t m = 0; m < L.list.num_members(); ++m) {
      total_elements_ += L.list.member(m).numel;
      if (sel.optimizer[m] == OptimizerKind::kMuon) muon_elements_ += L.list.member(m).numel;
    }
  }
  const int replica = chains[0]->topology().Coord(rank).d;
  auto add = [&](OptimizerKind k, UpdateProgram prog, std::vector<UpdateUnit> units) {
    if (units.empty()) return;
    auto plan =
        std::make_shared<const UpdatePlan>(std::move(prog), std::move(units), chains, replica);
    executors_.push_back(std::make_unique<UpdateExecutor>(plan, chains, rank, p2p, account));
    kinds_.push_back(k);
  };
  add(OptimizerKind::kAdamW, AdamWProgram(options.adamw), std::move(adamw));
  add(OptimizerKind::kMuon, MuonProgram(options.muon), std::move(muon));
}

void StructuredUpdate::Run(const std::vector<Zero1State>& state, const ScalarState& scalars) {
  stats_ = {};
  for (auto& ex : executors_) {
    ex->Run(state, scalars);
    const UpdateRunStats& s = ex->last_run();
    stats_.bytes_sent += s.bytes_sent;
    stats_.bytes_copied += s.bytes_copied;
    stats_.exchanges += s.exchanges;
    stats_.units_executed += s.units_executed;
    stats_.exec_cost += s.exec_cost;
  }
}

const UpdatePlan* StructuredUpdate::plan(OptimizerKind opt) const {
  for (size_t i = 0; i < kinds_.size(); ++i)
    if (kinds_[i] == opt) return &executors_[i]->plan();
  return nullptr;
}

uint64_t StructuredUpdate::temporary_bytes() const {
  uint64_t b = 0;
  for (const auto& ex : executors_) b += ex->temporary_bytes();
  return b;
}

double StructuredUpdate::muon_share() const {
  return total_elements_ ? static_cast<double>(muon_elements_) / total_elements_ : 0.0;
}

}  // namespace sshsdp
