// Stage declarations: scalar state and plan-time program checks (see update_stage.h).
#include "sshsdp/update/update_stage.h"

#include <set>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

std::string DescribeExtent(const Extent& e) {
  return e.kind == Extent::Kind::kUnit ? std::string("a whole unit")
                                       : fmt::format("{} element(s)", e.elements);
}

}  // namespace

double ScalarState::Get(const std::string& name) const {
  auto it = values_.find(name);
  SSHSDP_CHECK(it != values_.end(), PlanError,
               "scalar '{}' was never set; set it in the ScalarState before running the update",
               name);
  return it->second;
}

const FieldDecl* UpdateProgram::Field(const std::string& name) const {
  for (const FieldDecl& f : fields)
    if (f.name == name) return &f;
  return nullptr;
}

std::vector<StageKind> ValidateProgram(const UpdateProgram& program,
                                       const std::vector<UpdateUnit>& units) {
  size_t total = 0;
  for (const UpdateUnit& u : units) total += u.numel();
  const size_t num_units = units.size();
  std::set<std::string> produced;
  std::vector<StageKind> kinds;
  for (const UpdateStage& s : program.stages) {
    const std::string where = fmt::format("program '{}', stage '{}'", program.name, s.name);
    SSHSDP_CHECK(static_cast<bool>(s.kernel), PlanError, "{}: no kernel", where);
    SSHSDP_CHECK(!s.inputs.empty() || !s.outputs.empty(), PlanError, "{}: declares no operand",
                 where);
    // Fields exist; state is fp32; temporaries are produced before they are read.
    for (const Operand& op : s.inputs) {
      const FieldDecl* f = program.Field(op.field);
      SSHSDP_CHECK(f != nullptr, PlanError, "{} reads field '{}' that the program does not declare",
                   where, op.field);
      SSHSDP_CHECK(f->role != FieldRole::kTemporary || produced.count(op.field) > 0, PlanError,
                   "{} reads temporary '{}' before any stage produces it; add a stage writing "
                   "'{}' before '{}'",
                   where, op.field, op.field, s.name);
    }
    for (const Operand& op : s.outputs) {
      const FieldDecl* f = program.Field(op.field);
      SSHSDP_CHECK(f != nullptr, PlanError,
                   "{} writes field '{}' that the program does not declare", where, op.field);
    }
    for (const Operand& op : s.outputs) produced.insert(op.field);
    // Number of units each operand describes.
    bool all_single = true;
    size_t agreed = 0;
    std::string first_desc;
    std::vector<Operand> ops = s.inputs;
    ops.insert(ops.end(), s.outputs.begin(), s.outputs.end());
    for (size_t i = 0; i < ops.size(); ++i) {
      const Operand& op = ops[i];
      const FieldDecl* f = program.Field(op.field);
      SSHSDP_CHECK(f->role == FieldRole::kTemporary || f->dtype == DType::kF32, PlanError,
                   "program '{}': state field '{}' is {}, but ZeRO-1 state is fp32", program.name,
                   f->name, DTypeName(f->dtype));
      size_t count = num_units;
      if (op.per_unit.kind == Extent::Kind::kElements) {
        const int64_t k = op.per_unit.elements;
        SSHSDP_CHECK(k > 0 && total % static_cast<size_t>(k) == 0, PlanError,
                     "{}: operand '{}' declares {} elements per unit, which does not divide its "
                     "{} elements",
                     where, op.field, k, total);
        count = total / static_cast<size_t>(k);
        if (k != 1) all_single = false;
      } else {
        all_single = false;
      }
      const std::string desc = fmt::format("'{}' ({} per unit) describes {} units", op.field,
                                           DescribeExtent(op.per_unit), count);
      if (i == 0) {
        agreed = count;
        first_desc = desc;
      } else {
        SSHSDP_CHECK(count == agreed, PlanError,
                     "{}: operands disagree on the number of units: {} but {}; every operand "
                     "of a stage must describe the same units",
                     where, first_desc, desc);
      }
    }
    if (all_single) {
      kinds.push_back(StageKind::kElementwise);
      continue;
    }
    SSHSDP_CHECK(agreed == num_units, PlanError,
                 "{}: its operands describe {} units but the program has {} update units; a "
                 "stage works on single elements or on whole units",
                 where, agreed, num_units);
    for (const Operand& op : ops) {
      if (op.per_unit.kind != Extent::Kind::kElements) continue;
      for (const UpdateUnit& u : units)
        SSHSDP_CHECK(u.numel() == static_cast<size_t>(op.per_unit.elements), PlanError,
                     "{}: operand '{}' declares {} elements per unit but unit '{}' has {} "
                     "([{}, {}]); declare Extent::Unit()",
                     where, op.field, op.per_unit.elements, u.name, u.numel(), u.rows, u.cols);
    }
    kinds.push_back(StageKind::kUnit);
  }
  return kinds;
}

}  // namespace sshsdp
