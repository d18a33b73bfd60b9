// DataNode tests: views resolve to root + accumulated offset (the packed Q projection and
// its heads share storage), alignment rules, bind/unbind callbacks on (re)allocation and
// external attachment, memory accounting, and errors for overlapping or out-of-range
// children and binding changes.
#include "sshsdp/layout/data_node.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

TEST(DataNode, ViewsShareTheRootStorage) {
  DataNode root("W");
  DataNode& lin = root.AddChild("linear", DType::kBF16, {6, 4});
  DataNode& q = root.AddChild("q", DType::kBF16, {12, 4});
  DataNode* heads[3];
  for (int h = 0; h < 3; ++h) heads[h] = &q.AddChild("h" + std::to_string(h), DType::kBF16, {4, 4});
  root.Finalize();
  EXPECT_EQ(lin.root_offset(), 0u);
  EXPECT_EQ(q.root_offset(), 48u);
  EXPECT_EQ(heads[1]->offset(), 32u);
  EXPECT_EQ(heads[1]->root_offset(), 80u);
  EXPECT_EQ(root.bytes(), 192u);  // 144 used, rounded up to 64
  EXPECT_EQ(heads[2]->path(), "W/q/h2");
  EXPECT_FALSE(heads[0]->bound());
  EXPECT_EQ(heads[0]->data(), nullptr);

  MemoryAccount acct;
  root.Allocate(&acct, "weights");
  EXPECT_EQ(acct.current("weights"), 192u);
  EXPECT_TRUE(root.owns_storage());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(root.data()) % DataNode::kRootAlignment, 0u);
  char* base = root.data_as<char>();
  EXPECT_EQ(q.data_as<char>(), base + 48);
  EXPECT_EQ(heads[0]->data(), q.data());
  EXPECT_EQ(heads[2]->data_as<char>(), base + 112);
  // Writing through a head view is visible through the packed projection (no copy).
  heads[1]->data_as<bf16>()[3] = FloatToBf16(2.5f);
  EXPECT_EQ(Bf16ToFloat(q.data_as<bf16>()[16 + 3]), 2.5f);
  // Allocation is zero-filled.
  EXPECT_EQ(lin.data_as<bf16>()[0].bits, 0);
  root.Release();
  EXPECT_EQ(acct.current("weights"), 0u);
  EXPECT_EQ(acct.peak_total(), 192u);
  EXPECT_EQ(q.data(), nullptr);
  EXPECT_EQ(q.numel(), 48u);  // metadata stays
}

TEST(DataNode, CallbacksAttachAndDetachViews) {
  DataNode root("G");
  DataNode& a = root.AddChild("a", DType::kF32, {3});
  DataNode& b = root.AddChild("b", DType::kF32, {5});
  root.Finalize();
  float* pa = nullptr;
  float* pb = reinterpret_cast<float*>(1);
  int calls = 0;
  a.OnBind([&](void* p) { pa = static_cast<float*>(p), ++calls; });
  b.OnBind([&](void* p) { pb = static_cast<float*>(p), ++calls; });
  EXPECT_EQ(calls, 0);  // not bound yet: not called
  root.Allocate();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(pa, root.data_as<float>());
  EXPECT_EQ(pb, root.data_as<float>() + 3);
  root.Release();
  EXPECT_EQ(pa, nullptr);
  EXPECT_EQ(pb, nullptr);
  // Re-allocation re-points the views.
  root.Allocate();
  EXPECT_EQ(pb, root.data_as<float>() + 3);
  // Registering after binding calls back at once.
  void* late = nullptr;
  b.OnBind([&](void* p) { late = p; });
  EXPECT_EQ(late, b.data());
  root.Release();

  // External storage (e.g. a registered window): attach, same base again is fine, a
  // different base while bound is a detected binding change.
  void* ext = std::aligned_alloc(64, 128);
  void* ext2 = std::aligned_alloc(64, 128);
  root.AttachExternal(ext, 128);
  EXPECT_EQ(pa, static_cast<float*>(ext));
  EXPECT_FALSE(root.owns_storage());
  EXPECT_NO_THROW(root.AttachExternal(ext, 128));
  EXPECT_THROW(root.AttachExternal(ext2, 128), LayoutError);
  root.Release();
  root.AttachExternal(ext2, 128);
  EXPECT_EQ(pb, static_cast<float*>(ext2) + 3);
  root.Release();
  EXPECT_THROW(root.AttachExternal(static_cast<char*>(ext) + 4, 64), LayoutError);  // misaligned
  EXPECT_THROW(root.AttachExternal(ext, 16), LayoutError);                          // too small
  std::free(ext);
  std::free(ext2);
}

TEST(DataNode, AlignmentRules) {
  DataNode root("R");
  DataNode& a = root.AddChild("a", DType::kBF16, {3});  // 6 bytes at 0
  DataNode& b = root.AddChild("b", DType::kF32, {2});   // auto: rounded up to 8
  DataNode& c = root.AddChild("c", DType::kE4M3, {5}, DataNode::kAuto, /*align=*/32);
  EXPECT_EQ(a.offset(), 0u);
  EXPECT_EQ(b.offset(), 8u);
  EXPECT_EQ(c.offset(), 32u);
  // Explicit offsets must respect the element size and any requested alignment.
  EXPECT_THROW(root.AddChild("d", DType::kF32, {1}, 6), LayoutError);
  EXPECT_THROW(root.AddChild("e", DType::kBF16, {1}, 40, 16), LayoutError);
  root.Finalize();
  EXPECT_THROW(root.AddChild("late", DType::kF32, {1}), LayoutError);
  EXPECT_THROW(root.Finalize(), LayoutError);
  EXPECT_THROW(b.Allocate(), LayoutError);  // only the root allocates
}

TEST(DataNode, OverlapAndRangeErrors) {
  {
    DataNode root("R");
    root.AddChild("a", DType::kF32, {4}, 0);
    root.AddChild("b", DType::kF32, {4}, 8);  // [8, 24) overlaps a [0, 16)
    try {
      root.Finalize();
      ADD_FAILURE();
    } catch (const LayoutError& e) {
      std::string w = e.what();
      EXPECT_NE(w.find("'R/a'"), std::string::npos) << w;
      EXPECT_NE(w.find("'R/b'"), std::string::npos) << w;
      EXPECT_NE(w.find("overlap"), std::string::npos) << w;
    }
  }
  {
    DataNode root("R");
    root.AddChild("a", DType::kF32, {4}, 0);
    root.AddChild("alias", DType::kF32, {2}, 8, 0, DataNode::View::kAlias);  // declared alias
    EXPECT_NO_THROW(root.Finalize());
  }
  {
    DataNode root("R", /*bytes=*/16);
    root.AddChild("a", DType::kF32, {5}, 0);
    try {
      root.Finalize();
      ADD_FAILURE();
    } catch (const LayoutError& e) {
      EXPECT_NE(std::string(e.what()).find("extends past its parent"), std::string::npos);
    }
  }
  {
    DataNode root("R");
    DataNode& q = root.AddChild("q", DType::kBF16, {4, 4});
    q.AddChild("h", DType::kBF16, {3, 4}, 16);  // rows 1..3: [16, 40) > 32 bytes of q
    EXPECT_THROW(root.Finalize(), LayoutError);
  }
  EXPECT_THROW(DataNode("R").AddChild("neg", DType::kF32, {-1}), LayoutError);
}

}  // namespace
}  // namespace sshsdp
