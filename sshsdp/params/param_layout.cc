// GroupLayout packing and Atom schema checks (see param_layout.h).
#include "sshsdp/params/param_layout.h"

#include "sshsdp/base/error.h"

namespace sshsdp {

const char* OptimizerName(OptimizerKind k) { return k == OptimizerKind::kAdamW ? "adamw" : "muon"; }

GroupLayout BuildGroupLayout(int group, const std::vector<RuntimeParamSpec>& specs,
                             DType runtime_dtype, size_t pad_multiple) {
  GroupLayout L{group, {}, {}, TensorList("group" + std::to_string(group), runtime_dtype)};
  for (size_t r = 0; r < specs.size(); ++r) {
    const RuntimeParamSpec& s = specs[r];
    ValidateSpec(s);
    RuntimeParam rp;
    rp.name = s.name;
    rp.shape = s.shape;
    rp.first_member = static_cast<int>(L.list.num_members());
    rp.num_members = static_cast<int>(s.parts.size());
    rp.numel = static_cast<size_t>(s.numel());
    for (const UpdatePart& p : s.parts) {
      SSHSDP_CHECK(L.list.Find(p.name) < 0, PlanError,
                   "group {}: update parameter '{}' is declared twice", group, p.name);
      int m = L.list.Add(p.name, p.shape);
      UpdateParam u;
      u.name = p.name;
      u.shape = p.shape;
      u.kind = p.kind;
      u.init = p.init;
      u.muon_eligible = p.muon_eligible;
      u.group = group;
      u.member = m;
      u.runtime = static_cast<int>(r);
      L.update.push_back(std::move(u));
    }
    rp.offset = L.list.member(rp.first_member).offset;
    L.runtime.push_back(std::move(rp));
  }
  L.list.Finalize(pad_multiple);
  return L;
}

std::vector<FieldSpec> FieldSchema(OptimizerKind opt, DType runtime_dtype) {
  std::vector<FieldSpec> f = {{"w", runtime_dtype}, {"main", DType::kF32}, {"grad", DType::kF32}};
  f.push_back({"m", DType::kF32});
  if (opt == OptimizerKind::kAdamW) f.push_back({"v", DType::kF32});
  return f;
}

Atom::Atom(OptimizerKind opt, std::vector<FieldSpec> fields)
    : opt_(opt), fields_(std::move(fields)) {}

void Atom::Add(const UpdateParam& p, OptimizerKind opt, const std::vector<FieldSpec>& fields) {
  if (opt != opt_ || fields != fields_) {
    auto describe = [](OptimizerKind o, const std::vector<FieldSpec>& fs) {
      std::string s = OptimizerName(o);
      for (const FieldSpec& f : fs) s += fmt::format(" {}:{}", f.name, DTypeName(f.dtype));
      return s;
    };
    throw PlanError(fmt::format(
        "update parameter '{}' ({}) cannot join the atom of '{}' ({}): atoms pack only "
        "parameters with identical field names, dtypes and optimizer state; put it in its own "
        "atom",
        p.name, describe(opt, fields), members_.empty() ? std::string("<empty>") : members_[0],
        describe(opt_, fields_)));
  }
  members_.push_back(p.name);
}

}  // namespace sshsdp
