// StructuredUpdate: unit selection, plans and executors of the update phase (see
// structured_update.h).
#include "sshsdp/update/structured_update.h"

#include <algorithm>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

// Whether two unit lists are the same units (a cached plan serves another rank only then).
bool SameUnits(const std::vector<UpdateUnit>& a, const std::vector<UpdateUnit>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const UpdateUnit& x, const UpdateUnit& y) {
                      return x.name == y.name && x.group == y.group && x.begin == y.begin &&
                             x.rows == y.rows && x.cols == y.cols;
                    });
}

}  // namespace

std::vector<std::string> OptimizerStateFields(OptimizerKind k) {
  const std::unique_ptr<Backend> cpu = MakeCpuBackend();  // the fields only: no kernel runs
  const UpdateProgram p =
      k == OptimizerKind::kAdamW ? AdamWProgram({}, *cpu) : MuonProgram({}, *cpu);
  std::vector<std::string> out;
  for (const FieldDecl& f : p.fields)
    if (f.role == FieldRole::kState && f.name != "main" && f.name != "grad") out.push_back(f.name);
  return out;
}

StructuredUpdate::StructuredUpdate(const std::vector<UpdateGroupView>& groups,
                                   const UpdateOptions& options, int rank, Communicator& p2p,
                                   MemoryAccount* account, Communicator* zero1) {
  Build(groups, options, rank, &p2p, account, zero1);
}

StructuredUpdate::StructuredUpdate(const std::vector<UpdateGroupView>& groups,
                                   const UpdateOptions& options, int rank, PlanCache* plans) {
  SSHSDP_CHECK(!options.full_tensor, PlanError,
               "structured update: a plan-only update cannot model full_tensor (⑥) Muon");
  Build(groups, options, rank, nullptr, nullptr, nullptr, plans);
}

void StructuredUpdate::Build(const std::vector<UpdateGroupView>& groups,
                             const UpdateOptions& options, int rank, Communicator* p2p,
                             MemoryAccount* account, Communicator* zero1, PlanCache* plans) {
  SSHSDP_CHECK(!groups.empty(), PlanError, "structured update: no runtime groups");
  SSHSDP_CHECK(options.backend != nullptr, PlanError,
               "structured update: no backend to run the optimizer on (UpdateOptions::backend; "
               "MakeCpuBackend() for host memory)");
  SSHSDP_CHECK(options.muon_unit == UnitRule::kHead || options.muon_unit == UnitRule::kMatrix,
               ConfigError, "Muon unit must be 'head' or 'matrix', got '{}'",
               UnitRuleName(options.muon_unit));
  UnitPolicy policy;
  policy.muon = options.optimizer == OptimizerKind::kMuon;
  policy.matrix_rule = options.muon_unit;
  policy.overrides = options.overrides;
  std::vector<UpdateUnit> adamw, muon;
  std::vector<const ShardChain*> chains;
  std::vector<FullTensorGroup> ft_groups;  // options.full_tensor: logical coordinates
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupLayout& L = *groups[g].layout;
    chains.push_back(groups[g].chain);
    SSHSDP_CHECK(L.group == static_cast<int>(g), PlanError,
                 "structured update: layout {} is group {}; pass the groups in order", g, L.group);
    const std::vector<MemberPiece>& pieces = groups[g].pieces;
    const bool identity = pieces.empty();
    SSHSDP_CHECK(
        identity ? L.update.size() == L.list.num_members() : pieces.size() == L.list.num_members(),
        PlanError,
        "structured update: group {} has {} buffer members but {} update parameters and "
        "{} member pieces",
        g, L.list.num_members(), L.update.size(), pieces.size());
    for (size_t m = 0; m < pieces.size(); ++m)
      SSHSDP_CHECK(pieces[m].update >= 0 && pieces[m].update < static_cast<int>(L.update.size()) &&
                       pieces[m].valid <= L.list.member(m).numel,
                   PlanError,
                   "structured update: group {} member {} maps to update parameter {} with {} "
                   "valid elements (the group has {} parameters, the member {} elements)",
                   g, m, pieces[m].update, pieces[m].valid, L.update.size(),
                   L.list.member(m).numel);
    std::vector<OptimizerKind> opt(L.update.size(), OptimizerKind::kAdamW);
    if (options.full_tensor) {
      // Units in the logical order of the update parameters (back to back, unpadded): the
      // matrices full_tensor reassembles, whatever the buffer layout.
      FullTensorGroup ft{&L, groups[g].chain, {}, {}};
      GroupLayout logical = L;
      TensorList list(L.list.name(), L.list.dtype());
      for (size_t u = 0; u < L.update.size(); ++u) {
        const int idx = list.Add(L.update[u].name, L.update[u].shape);
        logical.update[u].member = idx;
        ft.logical_offset.push_back(list.member(idx).offset);
      }
      list.Finalize(1);
      logical.list = std::move(list);
      for (RuntimeParam& rp : logical.runtime) rp.offset = ft.logical_offset[rp.first_member];
      UnitSelection sel = SelectUnits(logical, policy);
      opt = sel.optimizer;
      muon.insert(muon.end(), sel.muon.begin(), sel.muon.end());
      for (size_t m = 0; m < L.list.num_members(); ++m) {
        ft.members.push_back(identity ? MemberPiece{static_cast<int>(m), 0, L.list.member(m).numel}
                                      : pieces[m]);
      }
      ft_groups.push_back(std::move(ft));
    } else if (identity) {
      UnitSelection sel = SelectUnits(L, policy);
      opt = sel.optimizer;
      muon.insert(muon.end(), sel.muon.begin(), sel.muon.end());
    } else {
      for (const RuntimeParam& rp : L.runtime)
        for (int u = rp.first_member; u < rp.first_member + rp.num_members; ++u) {
          const UnitRule r = RuleFor(L.update[u], rp, policy);
          SSHSDP_CHECK(r == UnitRule::kAdamW, PlanError,
                       "update parameter '{}' has rule '{}', but group {}'s buffer splits update "
                       "parameters into several members (a baseline shard layout), so "
                       "point-to-point units cannot find its matrix; use the flat or aligned "
                       "layout, or AdamW",
                       L.update[u].name, UnitRuleName(r), g);
        }
    }
    // AdamW units: one per buffer member of an AdamW parameter (elementwise: any layout).
    for (size_t m = 0; m < L.list.num_members(); ++m) {
      const int u = identity ? static_cast<int>(m) : pieces[m].update;
      const TensorListMember& mem = L.list.member(m);
      total_elements_ += mem.numel;
      if (opt[u] == OptimizerKind::kMuon) {
        muon_elements_ += mem.numel;
        continue;
      }
      UpdateUnit a;
      a.name = mem.name;
      a.group = static_cast<int>(g);
      a.first_member = static_cast<int>(m);
      a.kind = L.update[u].kind;
      a.begin = mem.offset;
      a.rows = 1;
      a.cols = static_cast<int64_t>(mem.numel);
      adamw.push_back(std::move(a));
    }
    optimizers_.push_back(std::move(opt));
  }
  const int replica = chains[0]->topology().Coord(rank).d;
  auto add = [&](OptimizerKind k, UpdateProgram prog, std::vector<UpdateUnit> units) {
    if (units.empty()) return;
    const std::pair<int, int> key{static_cast<int>(k), replica};
    std::shared_ptr<const UpdatePlan> plan = plans ? (*plans)[key] : nullptr;
    SSHSDP_CHECK(!plan || SameUnits(plan->units(), units), PlanError,
                 "structured update: a cached {} plan of replica {} has other units than rank "
                 "{}'s; share a PlanCache only between ranks of one model and options",
                 OptimizerName(k), replica, rank);
    if (!plan) {
      plan = std::make_shared<const UpdatePlan>(std::move(prog), std::move(units), chains, replica);
      if (plans) (*plans)[key] = plan;
    }
    executors_.push_back(
        std::make_unique<UpdateExecutor>(plan, chains, rank, p2p, *options.backend, account));
    kinds_.push_back(k);
  };
  add(OptimizerKind::kAdamW, AdamWProgram(options.adamw, *options.backend), std::move(adamw));
  if (options.full_tensor) {
    SSHSDP_CHECK(options.backend->host_memory(), PlanError,
                 "structured update: full_tensor Muon runs on host memory only");
    if (!muon.empty()) {
      SSHSDP_CHECK(zero1 != nullptr, PlanError,
                   "structured update: full_tensor Muon needs the ZeRO-1 group communicator");
      full_tensor_ =
          std::make_unique<FullTensorMuon>(std::move(ft_groups), std::move(muon), options.muon,
                                           rank, *zero1, *options.backend, account);
    }
  } else {
    add(OptimizerKind::kMuon, MuonProgram(options.muon, *options.backend), std::move(muon));
  }
}

void StructuredUpdate::Run(const std::vector<Zero1State>& state, const ScalarState& scalars) {
  stats_ = {};
  for (auto& ex : executors_) {
    ex->Run(state, scalars);
    stats_ += ex->last_run();
  }
  if (full_tensor_) {
    full_tensor_->Run(state, scalars);
    stats_ += full_tensor_->last_run();
  }
}

const UpdatePlan* StructuredUpdate::plan(OptimizerKind opt) const {
  for (size_t i = 0; i < kinds_.size(); ++i)
    if (kinds_[i] == opt) return &executors_[i]->plan();
  return nullptr;
}

uint64_t StructuredUpdate::peak_temporary_bytes() const {
  uint64_t b = 0;
  for (const auto& ex : executors_) b = std::max(b, ex->temporary_bytes());
  if (full_tensor_) b = std::max(b, full_tensor_->temporary_bytes());
  return b;
}

uint64_t StructuredUpdate::temporary_bytes() const {
  uint64_t b = 0;
  for (const auto& ex : executors_) b += ex->temporary_bytes();
  if (full_tensor_) b += full_tensor_->temporary_bytes();
  return b;
}

double StructuredUpdate::muon_share() const {
  return total_elements_ ? static_cast<double>(muon_elements_) / total_elements_ : 0.0;
}

}  // namespace sshsdp
