// ShardChain and TensorList tests: the paper's Figure 4 buffer (one linear weight and three
// packed Q heads; Head0 spans ranks 2 and 1 at ZeRO-1) pinned exactly, then property tests
// over random layouts and member sizes: fragments partition every tensor exactly once per
// level, levels nest, and ZeRO-1 ownership lookups agree with each owner's own fragments.
#include "sshsdp/layout/shard_chain.h"

#include <gtest/gtest.h>

#include <random>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

TEST(TensorList, PacksMembersAndPadsOnlyTheTail) {
  TensorList l("w", DType::kBF16);
  EXPECT_EQ(l.Add("a", {3, 5}), 0);
  EXPECT_EQ(l.Add("b", {7}), 1);
  EXPECT_EQ(l.Add("c", {2, 2}, /*align=*/8), 2);
  l.Finalize(6);
  EXPECT_EQ(l.member(0).offset, 0u);
  EXPECT_EQ(l.member(1).offset, 15u);
  EXPECT_EQ(l.member(2).offset, 24u);  // 22 rounded up to 8
  EXPECT_EQ(l.numel(), 28u);
  EXPECT_EQ(l.padded_numel(), 30u);
  EXPECT_EQ(l.padded_bytes(), 60u);
  EXPECT_EQ(l.Find("b"), 1);
  EXPECT_EQ(l.Find("zz"), -1);
  EXPECT_THROW(l.Add("d", {1}), LayoutError);
  TensorList m("m", DType::kF32);
  m.Add("x", {2});
  EXPECT_THROW(m.Add("x", {3}), LayoutError);
  EXPECT_THROW(m.Add("y", {0, 3}), LayoutError);
}

// Figure 4: so=4, sg=sw=2 on 4 ranks; Linear [6,4] then Q heads [4,4] x3: 72 elements,
// ZeRO-1 chunks of 18 owned by [0, 2, 1, 3].
class PaperExample : public ::testing::Test {
 protected:
  PaperExample() : list_("W", DType::kF32), topo_(4, 4, 2, 2, 4) {
    list_.Add("linear", {6, 4});
    list_.Add("q.h0", {4, 4});
    list_.Add("q.h1", {4, 4});
    list_.Add("q.h2", {4, 4});
    list_.Finalize(4);
  }
  TensorList list_;
  Topology topo_;
};

TEST_F(PaperExample, Head0SpansRanks2And1) {
  ShardChain c(list_, topo_, 0);
  auto owners = c.Zero1Owners(/*q.h0*/ 1, 0, 16);
  ASSERT_EQ(owners.size(), 2u);
  EXPECT_EQ(owners[0].rank, 2);
  EXPECT_EQ(owners[0].fragment.tensor_begin, 0u);
  EXPECT_EQ(owners[0].fragment.length, 12u);
  EXPECT_EQ(owners[0].fragment.shard_offset, 6u);
  EXPECT_EQ(owners[1].rank, 1);
  EXPECT_EQ(owners[1].fragment.tensor_begin, 12u);
  EXPECT_EQ(owners[1].fragment.length, 4u);
  EXPECT_EQ(owners[1].fragment.shard_offset, 0u);
  // Linear lies on ranks 0 and 2; Head2 on rank 3 only.
  auto lin = c.Zero1Owners(0, 0, 24);
  ASSERT_EQ(lin.size(), 2u);
  EXPECT_EQ(lin[0].rank, 0);
  EXPECT_EQ(lin[1].rank, 2);
  auto h2 = c.Zero1Owners(3, 0, 16);
  ASSERT_EQ(h2.size(), 1u);
  EXPECT_EQ(h2[0].rank, 3);
}

TEST_F(PaperExample, LocalRangesAndFragments) {
  ShardChain r2(list_, topo_, 2);
  EXPECT_EQ(r2.LocalRange(Shard::kFull), (Range{0, 72}));
  EXPECT_EQ(r2.LocalRange(Shard::kZero3), (Range{0, 36}));
  EXPECT_EQ(r2.LocalRange(Shard::kZero2), (Range{0, 36}));
  EXPECT_EQ(r2.LocalRange(Shard::kZero1), (Range{18, 36}));
  const auto& f = r2.Fragments(Shard::kZero1);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].member, 0);  // linear elements [18, 24)
  EXPECT_EQ(f[0].tensor_begin, 18u);
  EXPECT_EQ(f[0].length, 6u);
  EXPECT_EQ(f[0].shard_offset, 0u);
  EXPECT_EQ(f[1].member, 1);  // head0 elements [0, 12)
  EXPECT_EQ(f[1].tensor_begin, 0u);
  EXPECT_EQ(f[1].length, 12u);
  EXPECT_EQ(f[1].shard_offset, 6u);
  ShardChain r1(list_, topo_, 1);
  EXPECT_EQ(r1.LocalRange(Shard::kZero1), (Range{36, 54}));
  EXPECT_EQ(r1.LocalRange(Shard::kZero3), (Range{36, 72}));
  EXPECT_FALSE(r1.MemberFragment(0, Shard::kZero1).has_value());
  EXPECT_EQ(r1.MemberFragment(1, Shard::kZero1)->tensor_begin, 12u);
}

TEST(ShardChain, RejectsUnpaddedOrUnfinalizedLists) {
  Topology t(4, 4, 2, 2, 4);
  TensorList l("w", DType::kF32);
  l.Add("a", {5});
  EXPECT_THROW(ShardChain(l, t, 0), LayoutError);
  l.Finalize(2);  // 6 elements: not a multiple of so=4
  try {
    ShardChain c(l, t, 0);
    ADD_FAILURE();
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of so=4"), std::string::npos);
  }
}

// Random layouts and member sizes.
TEST(ShardChain, PropertiesOverRandomLayouts) {
  std::mt19937 rng(12345);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 400; ++trial) {
    int W = pick(1, 12);
    std::vector<int> sos;
    for (int d = 1; d <= W; ++d)
      if (W % d == 0) sos.push_back(d);
    int so = sos[pick(0, int(sos.size()) - 1)];
    std::vector<int> sgs, sws;
    for (int d = 1; d <= so; ++d)
      if (so % d == 0) sgs.push_back(d);
    int sg = sgs[pick(0, int(sgs.size()) - 1)];
    for (int d = 1; d <= sg; ++d)
      if (sg % d == 0) sws.push_back(d);
    int sw = sws[pick(0, int(sws.size()) - 1)];
    Topology topo(W, W, sw, sg, so);
    TensorList list("w", DType::kBF16);
    int nm = pick(1, 7);
    for (int m = 0; m < nm; ++m) {
      if (pick(0, 1))
        list.Add("m" + std::to_string(m), {pick(1, 9), pick(1, 9)}, pick(0, 3) == 0 ? 4 : 1);
      else
        list.Add("m" + std::to_string(m), {pick(1, 40)});
    }
    list.Finalize(static_cast<size_t>(so));
    std::vector<ShardChain> chains;
    for (int r = 0; r < W; ++r) chains.emplace_back(list, topo, r);
    for (int r = 0; r < W; ++r) {
      // Levels nest: z1 ⊂ z2 ⊂ z3 ⊂ full.
      for (int l = 1; l < kNumShardLevels; ++l) {
        Range outer = chains[r].LocalRange(static_cast<Shard>(l - 1));
        Range inner = chains[r].LocalRange(static_cast<Shard>(l));
        EXPECT_LE(outer.begin, inner.begin);
        EXPECT_GE(outer.end, inner.end);
        EXPECT_EQ(inner.size() * topo.Degree(static_cast<Shard>(l)), list.padded_numel());
      }
    }
    // Fragments partition every tensor exactly once per level (within one HSDP replica, and
    // within one ZeRO-3/ZeRO-2 group for those levels: chunks of ranks with distinct indices).
    for (int l = 0; l < kNumShardLevels; ++l) {
      Shard level = static_cast<Shard>(l);
      std::vector<std::vector<int>> cover(list.num_members());
      for (size_t m = 0; m < list.num_members(); ++m) cover[m].assign(list.member(m).numel, 0);
      std::vector<bool> chunk_seen(topo.Degree(level), false);
      for (int r = 0; r < W; ++r) {
        int ci = topo.ChunkIndex(level, r);
        if (chunk_seen[ci]) continue;
        chunk_seen[ci] = true;
        for (const Fragment& f : chains[r].Fragments(level)) {
          const auto& mem = list.member(f.member);
          EXPECT_EQ(chains[r].LocalRange(level).begin + f.shard_offset,
                    mem.offset + f.tensor_begin);
          for (size_t i = f.tensor_begin; i < f.tensor_end(); ++i) cover[f.member][i]++;
        }
      }
      for (size_t m = 0; m < list.num_members(); ++m)
        for (int x : cover[m]) ASSERT_EQ(x, 1) << topo.ToString() << " level " << l;
    }
    // ZeRO-1 owner lookup over a random sub-range equals the owners' own fragments.
    for (int q = 0; q < 5; ++q) {
      int m = pick(0, nm - 1);
      size_t n = list.member(m).numel;
      size_t a = pick(0, int(n) - 1), b = pick(int(a), int(n));
      int replica = pick(0, topo.num_replicas() - 1);
      auto owners = chains[0].Zero1Owners(m, a, b, replica);
      size_t pos = a;
      for (const auto& o : owners) {
        EXPECT_EQ(o.fragment.tensor_begin, pos);
        EXPECT_EQ(topo.Coord(o.rank).d, replica);
        auto own = chains[o.rank].MemberFragment(m, Shard::kZero1);
        ASSERT_TRUE(own.has_value());
        EXPECT_LE(own->tensor_begin, o.fragment.tensor_begin);
        EXPECT_GE(own->tensor_end(), o.fragment.tensor_end());
        EXPECT_EQ(own->shard_offset + (o.fragment.tensor_begin - own->tensor_begin),
                  o.fragment.shard_offset);
        pos += o.fragment.length;
      }
      EXPECT_EQ(pos, b);
    }
  }
}

}  // namespace
}  // namespace sshsdp
