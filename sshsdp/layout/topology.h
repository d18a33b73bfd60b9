// Topology: world size, simulated nodes and the nested sharding degrees sw | sg | so | W.
//
// It fixes, without any communication, where every rank sits in every group and which
// chunk of a flat buffer it owns at each ZeRO level (docs/design.md, Buffers and the shard chain).
// Write rank
//   r = a + b·sw + c·sg + d·so,   a < sw, b < sg/sw, c < so/sg, d < W/so.
// Rank r owns ZeRO-3 chunk a (of sw), ZeRO-2 chunk a·(sg/sw)+b (of sg) and ZeRO-1 chunk
// (a·(sg/sw)+b)·(so/sg)+c (of so). Every group's member list is ordered by the chunk
// index its collective reads or writes, so all-gathers and reduce-scatters act on the
// buffer in place, without reordering. The paper's example (W=4, so=4, sg=sw=2) gives
// ZeRO-1 chunk owners [0, 2, 1, 3].
//
//   Topology t(/*world=*/4, /*ranks_per_node=*/4, /*sw=*/2, /*sg=*/2, /*so=*/4);
//   t.Zero1ChunkOwner(1, /*replica=*/0);    // 2
//   t.GroupMembers(Level::kZero3, 2);       // {2, 3}
//   t.GroupMembers(Level::kReplicaAG, 0);   // {0, 2}
#pragma once

#include <string>
#include <vector>

namespace sshsdp {

// Sharding levels of one flat buffer, from whole to finest.
enum class Shard : int { kFull = 0, kZero3 = 1, kZero2 = 2, kZero1 = 3 };
inline constexpr int kNumShardLevels = 4;
const char* ShardName(Shard s);

// Communication groups of one rank.
enum class Group : int {
  kZero3 = 0,      // sw ranks: per-microbatch weight all-gather
  kZero2 = 1,      // sg ranks: per-microbatch gradient reduce-scatter
  kReplicaRS = 2,  // so/sg ranks holding the same ZeRO-2 chunk: outer reduce-scatter
  kReplicaAG = 3,  // so/sw ranks holding the same ZeRO-3 chunk: outer all-gather
  kHsdp = 4,       // W/so ranks holding the same ZeRO-1 chunk: gradient all-reduce
  kWorld = 5,      // all W ranks in rank order
};
inline constexpr int kNumGroups = 6;
const char* GroupName(Group g);

struct RankCoord {
  int a = 0;  // place in the ZeRO-3 group
  int b = 0;  // which ZeRO-3 group inside the ZeRO-2 group
  int c = 0;  // place in the replica group
  int d = 0;  // HSDP replica
};

class Topology {
 public:
  // Throws LayoutError naming the numbers when degrees are not positive, not nested
  // (sw | sg | so | world) or ranks_per_node does not divide the world.
  Topology(int world, int ranks_per_node, int sw, int sg, int so);

  int world() const { return world_; }
  int ranks_per_node() const { return ranks_per_node_; }
  int num_nodes() const { return world_ / ranks_per_node_; }
  int sw() const { return sw_; }
  int sg() const { return sg_; }
  int so() const { return so_; }
  int num_replicas() const { return world_ / so_; }  // HSDP replicas

  // Shard degree of a level: 1, sw, sg, so.
  int Degree(Shard s) const;

  int NodeOf(int rank) const { return rank / ranks_per_node_; }
  bool SameNode(int r0, int r1) const { return NodeOf(r0) == NodeOf(r1); }

  RankCoord Coord(int rank) const;
  int RankOf(const RankCoord& c) const;

  // Chunk index (of Degree(s)) that `rank` owns at level s; 0 for kFull.
  int ChunkIndex(Shard s, int rank) const;

  // The rank owning ZeRO-1 chunk j (0 <= j < so) in HSDP replica d.
  int Zero1ChunkOwner(int j, int replica) const;

  // Ordered members of `rank`'s group g: position i reads/writes the i-th slice of the
  // collective's buffer.
  std::vector<int> GroupMembers(Group g, int rank) const;
  // GroupMembers(g, rank)[position] and GroupMembers(g, rank).size(), without the list.
  int GroupMember(Group g, int rank, int position) const;
  int GroupSize(Group g) const;
  // Position of `rank` in its group g.
  int GroupPosition(Group g, int rank) const;
  // A key shared by exactly the ranks in the same group g (the MPI_Comm_split color).
  int GroupColor(Group g, int rank) const;

  // "W=4 nodes=1x4 sw=2 sg=2 so=4".
  std::string ToString() const;

 private:
  int world_, ranks_per_node_, sw_, sg_, so_;
};

}  // namespace sshsdp
