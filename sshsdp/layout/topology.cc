// Topology: rank coordinates, chunk ownership and ordered group membership (docs/design.md, Buffers
// and the shard chain).
#include "sshsdp/layout/topology.h"

#include "sshsdp/base/error.h"

namespace sshsdp {

const char* ShardName(Shard s) {
  switch (s) {
    case Shard::kFull:
      return "full";
    case Shard::kZero3:
      return "zero3";
    case Shard::kZero2:
      return "zero2";
    case Shard::kZero1:
      return "zero1";
  }
  return "?";
}

const char* GroupName(Group g) {
  switch (g) {
    case Group::kZero3:
      return "zero3";
    case Group::kZero2:
      return "zero2";
    case Group::kReplicaRS:
      return "replica-rs";
    case Group::kReplicaAG:
      return "replica-ag";
    case Group::kHsdp:
      return "hsdp";
    case Group::kWorld:
      return "world";
  }
  return "?";
}

Topology::Topology(int world, int ranks_per_node, int sw, int sg, int so)
    : world_(world), ranks_per_node_(ranks_per_node), sw_(sw), sg_(sg), so_(so) {
  SSHSDP_CHECK(world > 0, LayoutError, "world size must be positive, got {}", world);
  SSHSDP_CHECK(sw > 0 && sg > 0 && so > 0, LayoutError,
               "sharding degrees must be positive, got sw={} sg={} so={}", sw, sg, so);
  SSHSDP_CHECK(sg % sw == 0, LayoutError,
               "sw={} must divide sg={} (each ZeRO-2 group holds whole ZeRO-3 groups); "
               "pick sg as a multiple of sw",
               sw, sg);
  SSHSDP_CHECK(so % sg == 0, LayoutError,
               "sg={} must divide so={} (each ZeRO-1 shard nests in a ZeRO-2 shard); "
               "pick so as a multiple of sg",
               sg, so);
  SSHSDP_CHECK(world % so == 0, LayoutError,
               "so={} must divide the world size {} (the remaining world/so ranks are HSDP "
               "replicas); run with a multiple of so ranks or lower so",
               so, world);
  SSHSDP_CHECK(ranks_per_node > 0 && world % ranks_per_node == 0, LayoutError,
               "ranks_per_node={} must be positive and divide the world size {} "
               "(nodes hold equal numbers of ranks)",
               ranks_per_node, world);
}

int Topology::Degree(Shard s) const {
  switch (s) {
    case Shard::kFull:
      return 1;
    case Shard::kZero3:
      return sw_;
    case Shard::kZero2:
      return sg_;
    case Shard::kZero1:
      return so_;
  }
  return 1;
}

RankCoord Topology::Coord(int rank) const {
  SSHSDP_CHECK(rank >= 0 && rank < world_, LayoutError, "rank {} outside world of {}", rank,
               world_);
  RankCoord c;
  c.a = rank % sw_;
  c.b = (rank / sw_) % (sg_ / sw_);
  c.c = (rank / sg_) % (so_ / sg_);
  c.d = rank / so_;
  return c;
}

int Topology::RankOf(const RankCoord& c) const { return c.a + c.b * sw_ + c.c * sg_ + c.d * so_; }

int Topology::ChunkIndex(Shard s, int rank) const {
  RankCoord c = Coord(rank);
  int k = sg_ / sw_, m = so_ / sg_;
  switch (s) {
    case Shard::kFull:
      return 0;
    case Shard::kZero3:
      return c.a;
    case Shard::kZero2:
      return c.a * k + c.b;
    case Shard::kZero1:
      return (c.a * k + c.b) * m + c.c;
  }
  return 0;
}

int Topology::Zero1ChunkOwner(int j, int replica) const {
  SSHSDP_CHECK(j >= 0 && j < so_, LayoutError, "ZeRO-1 chunk {} outside [0, {})", j, so_);
  SSHSDP_CHECK(replica >= 0 && replica < num_replicas(), LayoutError,
               "HSDP replica {} outside [0, {})", replica, num_replicas());
  int k = sg_ / sw_, m = so_ / sg_;
  RankCoord c;
  c.c = j % m;
  int t = j / m;
  c.b = t % k;
  c.a = t / k;
  c.d = replica;
  return RankOf(c);
}

std::vector<int> Topology::GroupMembers(Group g, int rank) const {
  std::vector<int> out;
  for (int i = 0, n = GroupSize(g); i < n; ++i) out.push_back(GroupMember(g, rank, i));
  return out;
}

int Topology::GroupMember(Group g, int rank, int position) const {
  SSHSDP_CHECK(position >= 0 && position < GroupSize(g), LayoutError,
               "position {} outside the {} members of a {} group of {}", position, GroupSize(g),
               GroupName(g), ToString());
  const RankCoord me = Coord(rank);
  const int k = sg_ / sw_, m = so_ / sg_, i = position;
  switch (g) {
    case Group::kZero3:  // vary a
      return RankOf({i, me.b, me.c, me.d});
    case Group::kZero2:  // vary (a, b), ordered by ZeRO-2 chunk a·k + b
      return RankOf({i / k, i % k, me.c, me.d});
    case Group::kReplicaRS:  // vary c
      return RankOf({me.a, me.b, i, me.d});
    case Group::kReplicaAG:  // vary (b, c), ordered by ZeRO-1 chunk within the ZeRO-3 chunk
      return RankOf({me.a, i / m, i % m, me.d});
    case Group::kHsdp:  // vary d
      return RankOf({me.a, me.b, me.c, i});
    case Group::kWorld:
      return i;
  }
  return 0;
}

int Topology::GroupSize(Group g) const {
  switch (g) {
    case Group::kZero3:
      return sw_;
    case Group::kZero2:
      return sg_;
    case Group::kReplicaRS:
      return so_ / sg_;
    case Group::kReplicaAG:
      return so_ / sw_;
    case Group::kHsdp:
      return num_replicas();
    case Group::kWorld:
      return world_;
  }
  return 0;
}

int Topology::GroupPosition(Group g, int rank) const {
  RankCoord c = Coord(rank);
  int k = sg_ / sw_, m = so_ / sg_;
  switch (g) {
    case Group::kZero3:
      return c.a;
    case Group::kZero2:
      return c.a * k + c.b;
    case Group::kReplicaRS:
      return c.c;
    case Group::kReplicaAG:
      return c.b * m + c.c;
    case Group::kHsdp:
      return c.d;
    case Group::kWorld:
      return rank;
  }
  return 0;
}

int Topology::GroupColor(Group g, int rank) const {
  RankCoord c = Coord(rank);
  int k = sg_ / sw_, m = so_ / sg_;
  switch (g) {
    case Group::kZero3:  // same (b, c, d)
      return (c.d * m + c.c) * k + c.b;
    case Group::kZero2:  // same (c, d)
      return c.d * m + c.c;
    case Group::kReplicaRS:  // same (a, b, d)
      return (c.d * sw_ + c.a) * k + c.b;
    case Group::kReplicaAG:  // same (a, d)
      return c.d * sw_ + c.a;
    case Group::kHsdp:  // same (a, b, c)
      return (c.a * k + c.b) * m + c.c;
    case Group::kWorld:
      return 0;
  }
  return 0;
}

std::string Topology::ToString() const {
  return fmt::format("W={} nodes={}x{} sw={} sg={} so={}", world_, num_nodes(), ranks_per_node_,
                     sw_, sg_, so_);
}

}  // namespace sshsdp
