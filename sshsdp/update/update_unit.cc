// Update-unit selection (see update_unit.h).
#include "sshsdp/update/update_unit.h"

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

// Splits [begin, begin + numel) of `shape` into its row-major [rows, cols] matrices (one for
// rank 2, one per leading index for rank >= 3).
void AppendSlices(const std::string& name, int group, int first_member, int num_members,
                  UpdateKind kind, size_t begin, const std::vector<int64_t>& shape,
                  std::vector<UpdateUnit>* out) {
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  int64_t slices = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) slices *= shape[i];
  for (int64_t e = 0; e < slices; ++e) {
    UpdateUnit u;
    u.name = slices == 1 ? name : fmt::format("{}[{}]", name, e);
    u.group = group;
    u.first_member = first_member;
    u.num_members = num_members;
    u.kind = kind;
    u.begin = begin + static_cast<size_t>(e * rows * cols);
    u.rows = rows;
    u.cols = cols;
    out->push_back(std::move(u));
  }
}

}  // namespace

UnitRule RuleFor(const UpdateParam& u, const RuntimeParam& rp, const UnitPolicy& p) {
  if (auto it = p.overrides.find(u.name); it != p.overrides.end()) return it->second;
  if (auto it = p.overrides.find(rp.name); it != p.overrides.end()) return it->second;
  if (!p.muon || !MuonEligible(u.kind, u.muon_eligible) || u.shape.size() < 2)
    return UnitRule::kAdamW;
  return p.matrix_rule;
}

const char* UnitRuleName(UnitRule r) {
  switch (r) {
    case UnitRule::kAdamW:
      return "adamw";
    case UnitRule::kHead:
      return "head";
    case UnitRule::kMatrix:
      return "matrix";
  }
  return "?";
}

UnitRule ParseUnitRule(const std::string& s) {
  if (s == "adamw") return UnitRule::kAdamW;
  if (s == "head") return UnitRule::kHead;
  if (s == "matrix") return UnitRule::kMatrix;
  throw ConfigError(fmt::format("unknown update unit '{}': use adamw, head or matrix", s));
}

UnitSelection SelectUnits(const GroupLayout& layout, const UnitPolicy& policy) {
  UnitSelection sel;
  const size_t n = layout.update.size();
  sel.optimizer.assign(n, OptimizerKind::kAdamW);
  sel.rule.assign(n, UnitRule::kAdamW);
  for (const RuntimeParam& rp : layout.runtime) {
    const int first = rp.first_member, count = rp.num_members;
    int merged = 0;
    for (int m = first; m < first + count; ++m) {
      const UpdateParam& u = layout.update[m];
      const UnitRule r = RuleFor(u, rp, policy);
      sel.rule[m] = r;
      if (r == UnitRule::kAdamW) continue;
      sel.optimizer[m] = OptimizerKind::kMuon;
      if (r == UnitRule::kMatrix) ++merged;
      SSHSDP_CHECK(u.shape.size() >= 2 || r == UnitRule::kMatrix, PlanError,
                   "update parameter '{}' {} has rule '{}' but Muon needs a matrix (rank >= 2); "
                   "give it the 'adamw' rule",
                   u.name, ShapeString(u.shape), UnitRuleName(r));
    }
    if (merged > 0) {
      // One unit per runtime matrix: every part must agree and lie back to back.
      for (int m = first; m < first + count; ++m) {
        SSHSDP_CHECK(sel.rule[m] == UnitRule::kMatrix, PlanError,
                     "runtime parameter '{}': the 'matrix' unit merges all its update parts, but "
                     "'{}' has rule '{}'; give every part of '{}' the same rule",
                     rp.name, layout.update[m].name, UnitRuleName(sel.rule[m]), rp.name);
        SSHSDP_CHECK(m == first || layout.list.member(m).offset == layout.list.member(m - 1).end(),
                     PlanError,
                     "runtime parameter '{}': update parts '{}' and '{}' are not contiguous in "
                     "group {}'s buffer, so they cannot form one 'matrix' unit",
                     rp.name, layout.update[m - 1].name, layout.update[m].name, layout.group);
      }
      SSHSDP_CHECK(rp.shape.size() >= 2, PlanError,
                   "runtime parameter '{}' {} has rule 'matrix' but Muon needs a matrix (rank >= "
                   "2); give it the 'adamw' rule",
                   rp.name, ShapeString(rp.shape));
      AppendSlices(rp.name, layout.group, first, count, layout.update[first].kind, rp.offset,
                   rp.shape, &sel.muon);
      continue;
    }
    for (int m = first; m < first + count; ++m) {
      const UpdateParam& u = layout.update[m];
      const TensorListMember& mem = layout.list.member(m);
      if (sel.rule[m] == UnitRule::kHead) {
        AppendSlices(u.name, layout.group, m, 1, u.kind, mem.offset, u.shape, &sel.muon);
      } else {
        UpdateUnit a;
        a.name = u.name;
        a.group = layout.group;
        a.first_member = m;
        a.kind = u.kind;
        a.begin = mem.offset;
        MatrixView(u.shape, &a.rows, &a.cols);
        sel.adamw.push_back(std::move(a));
      }
    }
  }
  return sel;
}

}  // namespace sshsdp
