// GroupLayout and Atom tests: runtime params are contiguous member runs (QKV packs per-head
// update params), invalid specs and incompatible atom schemas are rejected naming the params.
#include "sshsdp/params/param_layout.h"

#include <gtest/gtest.h>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

RuntimeParamSpec Qkv(int heads, int dh, int d) {
  RuntimeParamSpec s{"qkv", {3 * heads * dh, d}, {}};
  int64_t off = 0;
  for (const char* w : {"q", "k", "v"})
    for (int h = 0; h < heads; ++h) {
      s.parts.push_back(
          {std::string(w) + ".h" + std::to_string(h), {dh, d}, off, UpdateKind::kMatrix, {}});
      off += dh * d;
    }
  return s;
}

TEST(GroupLayout, PacksHeadsIntoOneRuntimeParam) {
  RuntimeParamSpec norm{"norm", {8}, {{"norm", {8}, 0, UpdateKind::kVector, {}}}};
  GroupLayout L = BuildGroupLayout(3, {norm, Qkv(2, 4, 8)}, DType::kBF16, 4);
  ASSERT_EQ(L.runtime.size(), 2u);
  EXPECT_EQ(L.runtime[1].first_member, 1);
  EXPECT_EQ(L.runtime[1].num_members, 6);
  EXPECT_EQ(L.runtime[1].offset, 8u);
  EXPECT_EQ(L.runtime[1].numel, 3u * 2 * 4 * 8);
  EXPECT_EQ(L.update[2].name, "q.h1");
  EXPECT_EQ(L.list.member(2).offset, 8u + 32u);
  EXPECT_EQ(L.update[4].runtime, 1);
  EXPECT_EQ(L.list.padded_numel() % 4, 0u);
}

TEST(GroupLayout, RejectsBadSpecs) {
  RuntimeParamSpec gap{
      "w",
      {4, 4},
      {{"a", {2, 4}, 0, UpdateKind::kMatrix, {}}, {"b", {1, 4}, 8, UpdateKind::kMatrix, {}}}};
  EXPECT_THROW(BuildGroupLayout(0, {gap}, DType::kF32, 1), PlanError);
  RuntimeParamSpec a{"x", {2}, {{"dup", {2}, 0, UpdateKind::kVector, {}}}};
  RuntimeParamSpec b{"y", {2}, {{"dup", {2}, 0, UpdateKind::kVector, {}}}};
  EXPECT_THROW(BuildGroupLayout(0, {a, b}, DType::kF32, 1), PlanError);
}

TEST(Atom, RejectsIncompatibleSchemasNamingParams) {
  auto param = [](std::string name, std::vector<int64_t> shape, UpdateKind kind,
                  OptimizerKind opt) {
    UpdateParam p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.kind = kind;
    p.optimizer = opt;
    return p;
  };
  UpdateParam p1 = param("blocks.0.attn.q.h0", {4, 4}, UpdateKind::kMatrix, OptimizerKind::kAdamW);
  UpdateParam p2 = param("blocks.0.norm", {4}, UpdateKind::kVector, OptimizerKind::kAdamW);
  UpdateParam p3 = param("blocks.0.fc1", {4, 4}, UpdateKind::kMatrix, OptimizerKind::kMuon);
  Atom atom(OptimizerKind::kAdamW, FieldSchema(OptimizerKind::kAdamW, DType::kBF16));
  atom.Add(p1, OptimizerKind::kAdamW, FieldSchema(OptimizerKind::kAdamW, DType::kBF16));
  atom.Add(p2, OptimizerKind::kAdamW, FieldSchema(OptimizerKind::kAdamW, DType::kBF16));
  EXPECT_EQ(atom.members().size(), 2u);
  try {
    atom.Add(p3, OptimizerKind::kMuon, FieldSchema(OptimizerKind::kMuon, DType::kBF16));
    ADD_FAILURE();
  } catch (const PlanError& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("blocks.0.fc1"), std::string::npos) << w;
    EXPECT_NE(w.find("blocks.0.attn.q.h0"), std::string::npos) << w;
  }
  // Same optimizer, different runtime dtype: also a different schema.
  EXPECT_THROW(atom.Add(p2, OptimizerKind::kAdamW, FieldSchema(OptimizerKind::kAdamW, DType::kF32)),
               PlanError);
}

}  // namespace
}  // namespace sshsdp
