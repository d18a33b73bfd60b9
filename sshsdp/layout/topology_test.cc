// Topology tests: the paper's four-rank example pinned exactly, group/chunk consistency
// over every valid layout up to W=16 (each group's collective reads/writes the buffer in
// order, without reordering), and the errors for invalid layouts.
#include "sshsdp/layout/topology.h"

#include <gtest/gtest.h>

#include <set>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

using V = std::vector<int>;

TEST(Topology, PaperFourRankExample) {
  Topology t(4, 4, /*sw=*/2, /*sg=*/2, /*so=*/4);
  // ZeRO-1 chunk owners in buffer order: [0, 2, 1, 3].
  V owners;
  for (int j = 0; j < 4; ++j) owners.push_back(t.Zero1ChunkOwner(j, 0));
  EXPECT_EQ(owners, (V{0, 2, 1, 3}));
  EXPECT_EQ(t.GroupMembers(Group::kZero3, 0), (V{0, 1}));
  EXPECT_EQ(t.GroupMembers(Group::kZero3, 3), (V{2, 3}));
  EXPECT_EQ(t.GroupMembers(Group::kReplicaAG, 0), (V{0, 2}));
  EXPECT_EQ(t.GroupMembers(Group::kReplicaAG, 1), (V{1, 3}));
  EXPECT_EQ(t.GroupMembers(Group::kReplicaRS, 2), (V{0, 2}));
  EXPECT_EQ(t.GroupMembers(Group::kZero2, 1), (V{0, 1}));
  EXPECT_EQ(t.GroupMembers(Group::kHsdp, 1), (V{1}));
  // Outer AG in {0,2} gives ZeRO-3 chunk 0 = ZeRO-1 chunks 0,1 (contiguous half).
  EXPECT_EQ(t.ChunkIndex(Shard::kZero3, 0), 0);
  EXPECT_EQ(t.ChunkIndex(Shard::kZero3, 2), 0);
  EXPECT_EQ(t.ChunkIndex(Shard::kZero3, 1), 1);
  EXPECT_EQ(t.ChunkIndex(Shard::kZero1, 2), 1);
  EXPECT_EQ(t.ChunkIndex(Shard::kZero1, 1), 2);
}

// Every rank's group members agree, positions match, and each group's collective touches
// consecutive chunks in member order.
void CheckLayout(const Topology& t) {
  const int W = t.world();
  for (int r = 0; r < W; ++r) {
    for (int gi = 0; gi < kNumGroups; ++gi) {
      Group g = static_cast<Group>(gi);
      V m = t.GroupMembers(g, r);
      ASSERT_EQ(m[t.GroupPosition(g, r)], r) << t.ToString() << " " << GroupName(g);
      ASSERT_EQ(static_cast<int>(m.size()), t.GroupSize(g)) << t.ToString() << " " << GroupName(g);
      for (size_t i = 0; i < m.size(); ++i) {
        EXPECT_EQ(t.GroupMembers(g, m[i]), m) << t.ToString() << " " << GroupName(g);
        EXPECT_EQ(t.GroupPosition(g, m[i]), static_cast<int>(i));
        EXPECT_EQ(t.GroupColor(g, m[i]), t.GroupColor(g, r));
      }
    }
    // ZeRO-3 group: member i holds ZeRO-3 chunk i.
    V z3 = t.GroupMembers(Group::kZero3, r);
    ASSERT_EQ(static_cast<int>(z3.size()), t.sw());
    for (int i = 0; i < t.sw(); ++i) EXPECT_EQ(t.ChunkIndex(Shard::kZero3, z3[i]), i);
    // ZeRO-2 group: member i holds ZeRO-2 chunk i.
    V z2 = t.GroupMembers(Group::kZero2, r);
    ASSERT_EQ(static_cast<int>(z2.size()), t.sg());
    for (int i = 0; i < t.sg(); ++i) EXPECT_EQ(t.ChunkIndex(Shard::kZero2, z2[i]), i);
    // Replica RS group: same ZeRO-2 chunk, member i holds its i-th ZeRO-1 sub-chunk.
    V rs = t.GroupMembers(Group::kReplicaRS, r);
    ASSERT_EQ(static_cast<int>(rs.size()), t.so() / t.sg());
    int z2c = t.ChunkIndex(Shard::kZero2, r);
    for (size_t i = 0; i < rs.size(); ++i) {
      EXPECT_EQ(t.ChunkIndex(Shard::kZero2, rs[i]), z2c);
      EXPECT_EQ(t.ChunkIndex(Shard::kZero1, rs[i]), z2c * static_cast<int>(rs.size()) + int(i));
    }
    // Replica AG group: same ZeRO-3 chunk, member i holds its i-th ZeRO-1 sub-chunk.
    V ag = t.GroupMembers(Group::kReplicaAG, r);
    ASSERT_EQ(static_cast<int>(ag.size()), t.so() / t.sw());
    int z3c = t.ChunkIndex(Shard::kZero3, r);
    for (size_t i = 0; i < ag.size(); ++i) {
      EXPECT_EQ(t.ChunkIndex(Shard::kZero3, ag[i]), z3c);
      EXPECT_EQ(t.ChunkIndex(Shard::kZero1, ag[i]), z3c * static_cast<int>(ag.size()) + int(i));
    }
    // HSDP group: same ZeRO-1 chunk in every replica.
    V h = t.GroupMembers(Group::kHsdp, r);
    ASSERT_EQ(static_cast<int>(h.size()), t.num_replicas());
    for (int x : h) EXPECT_EQ(t.ChunkIndex(Shard::kZero1, x), t.ChunkIndex(Shard::kZero1, r));
    EXPECT_EQ(t.Zero1ChunkOwner(t.ChunkIndex(Shard::kZero1, r), t.Coord(r).d), r);
    EXPECT_EQ(t.RankOf(t.Coord(r)), r);
  }
  // Within one replica every ZeRO-1 chunk has exactly one owner.
  for (int d = 0; d < t.num_replicas(); ++d) {
    std::set<int> seen;
    for (int j = 0; j < t.so(); ++j) seen.insert(t.Zero1ChunkOwner(j, d));
    EXPECT_EQ(static_cast<int>(seen.size()), t.so());
  }
}

TEST(Topology, AllValidLayoutsUpTo16) {
  int layouts = 0;
  for (int W = 1; W <= 16; ++W)
    for (int so = 1; so <= W; ++so) {
      if (W % so) continue;
      for (int sg = 1; sg <= so; ++sg) {
        if (so % sg) continue;
        for (int sw = 1; sw <= sg; ++sw) {
          if (sg % sw) continue;
          for (int rpn = 1; rpn <= W; ++rpn) {
            if (W % rpn) continue;
            CheckLayout(Topology(W, rpn, sw, sg, so));
            ++layouts;
          }
        }
      }
    }
  EXPECT_GT(layouts, 300);
}

void ExpectLayoutError(int W, int rpn, int sw, int sg, int so, const std::string& needle) {
  try {
    Topology t(W, rpn, sw, sg, so);
    ADD_FAILURE() << "accepted W=" << W << " sw=" << sw << " sg=" << sg << " so=" << so;
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Topology, InvalidLayoutsNameTheNumbers) {
  ExpectLayoutError(4, 4, 3, 3, 3, "so=3 must divide the world size 4");
  ExpectLayoutError(8, 8, 2, 3, 6, "sw=2 must divide sg=3");
  ExpectLayoutError(8, 8, 2, 4, 6, "sg=4 must divide so=6");
  ExpectLayoutError(6, 4, 1, 1, 6, "ranks_per_node=4");
  ExpectLayoutError(4, 4, 0, 2, 4, "positive");
}

TEST(Topology, NodesAndHsdp) {
  Topology t(8, 2, 2, 2, 4);  // 4 nodes of 2, two HSDP replicas
  EXPECT_EQ(t.num_nodes(), 4);
  EXPECT_EQ(t.num_replicas(), 2);
  EXPECT_TRUE(t.SameNode(2, 3));
  EXPECT_FALSE(t.SameNode(1, 2));
  EXPECT_EQ(t.GroupMembers(Group::kHsdp, 1), (V{1, 5}));
  EXPECT_EQ(t.ToString(), "W=8 nodes=4x2 sw=2 sg=2 so=4");
}

}  // namespace
}  // namespace sshsdp
