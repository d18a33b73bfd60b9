// GroupLayout packing (see param_layout.h).
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

}  // namespace sshsdp
