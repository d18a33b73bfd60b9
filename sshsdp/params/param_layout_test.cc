// GroupLayout tests: runtime params are contiguous member runs (QKV packs per-head update
// params); invalid specs are rejected naming the params.
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

}  // namespace
}  // namespace sshsdp
