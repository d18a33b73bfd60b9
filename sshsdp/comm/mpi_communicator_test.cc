// Multi-rank tests of MpiCommunicator beyond single calls over the world: groups split from
// Topology layouts, Split, a CommThread overlapping the main thread, and preconditions; the
// per-size collectives and the exchange are in mpi_collectives_test.cc (see
// mpi_communicator.h).
//
// Run through mpirun on 1, 2, 3, 4 and 8 ranks, with exact integer-valued data and exact byte
// counters as there. Covered: groups split from Topology layouts with the two-level all-gather
// and reduce-scatter acting on the buffer in place; Split ordering by key; a CommThread
// overlapping a collective with the main thread's; precondition errors.
#include "sshsdp/comm/mpi_communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/comm_thread.h"
#include "sshsdp/comm/testing/mpi_test_util.h"
#include "sshsdp/layout/topology.h"

namespace sshsdp {
namespace {

using testing::mpi::AllEqual;
using testing::mpi::AllReduceBytes;
using testing::mpi::ExpectCounters;
using testing::mpi::kNaN;
using testing::mpi::RanksPerNodeChoices;
using testing::mpi::SentTo;
using testing::mpi::Successor;
using testing::mpi::SumV;
using testing::mpi::V;
using testing::mpi::WorldRank;
using testing::mpi::WorldSize;

// ---------------------------------------------------------------------------------------
// Groups split from Topology layouts act on ZeRO buffers in place.

struct Layout {
  int sw, sg, so;
};

std::vector<Layout> AllLayouts(int w) {
  std::vector<Layout> out;
  for (int so = 1; so <= w; ++so) {
    if (w % so) continue;
    for (int sg = 1; sg <= so; ++sg) {
      if (so % sg) continue;
      for (int sw = 1; sw <= sg; ++sw) {
        if (sg % sw == 0) out.push_back({sw, sg, so});
      }
    }
  }
  return out;
}

constexpr Group kGroups[] = {Group::kZero3,     Group::kZero2, Group::kReplicaRS,
                             Group::kReplicaAG, Group::kHsdp,  Group::kWorld};

// Splits every group of `topo` from `world` and checks its members against the topology.
std::vector<std::unique_ptr<Communicator>> SplitGroups(MpiCommunicator& world,
                                                       const Topology& topo) {
  const int r = WorldRank();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (Group g : kGroups) {
    comms.push_back(world.Split(topo.GroupColor(g, r), topo.GroupPosition(g, r)));
    static_cast<MpiCommunicator&>(*comms.back()).set_label(GroupName(g));
    const Communicator& c = *comms.back();
    const std::vector<int> members = topo.GroupMembers(g, r);
    std::vector<int> got(c.size());
    for (int i = 0; i < c.size(); ++i) got[i] = c.world_rank(i);
    EXPECT_EQ(got, members) << GroupName(g) << " " << topo.ToString();
    EXPECT_EQ(c.rank(), topo.GroupPosition(g, r)) << GroupName(g);
    EXPECT_EQ(c.name().rfind(GroupName(g) + std::string("{"), 0), 0u) << c.name();
  }
  return comms;
}

Communicator& Comm(std::vector<std::unique_ptr<Communicator>>& comms, Group g) {
  return *comms[static_cast<int>(g)];
}

// Counters expected for a ring over group g that sends `bytes` in `calls` calls.
CommCounters GroupRing(const Topology& topo, Group g, uint64_t bytes, uint64_t calls = 1) {
  const int r = WorldRank();
  const std::vector<int> m = topo.GroupMembers(g, r);
  const int next = m[(topo.GroupPosition(g, r) + 1) % m.size()];
  return SentTo(next, topo.ranks_per_node(), bytes, calls);
}

// Outer AG (replica group) then ZeRO-3 AG rebuilds the full buffer in place; RS in ZeRO-2
// then the outer RS (then the HSDP all-reduce) yields this rank's ZeRO-1 chunk sums.
void CheckLayout(MpiCommunicator& world, const Topology& topo) {
  SCOPED_TRACE(topo.ToString());
  const int r = WorldRank();
  auto comms = SplitGroups(world, topo);
  const int sw = topo.sw(), sg = topo.sg(), so = topo.so();
  const size_t chunk = 5, total = so * chunk;
  const int d = topo.Coord(r).d;
  auto weight = [&](size_t e) {
    return static_cast<float>((d * so) * 1000 + (e / chunk) * 1000 + e % chunk);
  };

  // ZeRO-1 -> ZeRO-3 -> full, in place at the chunk offsets.
  std::vector<float> buf(total, kNaN);
  const int z1 = topo.ChunkIndex(Shard::kZero1, r), z3 = topo.ChunkIndex(Shard::kZero3, r);
  for (size_t i = 0; i < chunk; ++i) buf[z1 * chunk + i] = weight(z1 * chunk + i);
  const size_t per_z3 = total / sw;  // elements of one ZeRO-3 chunk
  Communicator& outer_ag = Comm(comms, Group::kReplicaAG);
  ASSERT_EQ(outer_ag.size(), so / sw);
  outer_ag.AllGatherInPlace(buf.data() + z3 * per_z3, chunk, DType::kF32);
  for (size_t e = z3 * per_z3; e < (z3 + 1) * per_z3; ++e) EXPECT_EQ(buf[e], weight(e)) << e;
  Communicator& zero3 = Comm(comms, Group::kZero3);
  zero3.AllGatherInPlace(buf.data(), per_z3, DType::kF32);
  EXPECT_TRUE(AllEqual(buf, weight));
  ExpectCounters(outer_ag, GroupRing(topo, Group::kReplicaAG, uint64_t(so / sw - 1) * chunk * 4));
  ExpectCounters(zero3, GroupRing(topo, Group::kZero3, uint64_t(sw - 1) * per_z3 * 4));

  // full -> ZeRO-2 -> ZeRO-1 (-> HSDP sum).
  auto grad = [](int rank, size_t e) {
    return static_cast<float>(rank * 1000 + static_cast<int>(e));
  };
  std::vector<float> g(total);
  for (size_t e = 0; e < total; ++e) g[e] = grad(r, e);
  const size_t per_z2 = total / sg;
  std::vector<float> z2buf(per_z2, kNaN);
  Communicator& zero2 = Comm(comms, Group::kZero2);
  zero2.ReduceScatter(g.data(), DType::kF32, z2buf.data(), DType::kF32, per_z2, false);
  std::vector<float> z1buf(chunk, 0.5f);
  Communicator& outer_rs = Comm(comms, Group::kReplicaRS);
  outer_rs.ReduceScatter(z2buf.data(), DType::kF32, z1buf.data(), DType::kF32, chunk, true);
  auto replica_sum = [&](int replica, size_t e) {
    float s = 0;
    for (int q = 0; q < topo.world(); ++q) {
      if (topo.Coord(q).d == replica) s += grad(q, e);
    }
    return s;
  };
  EXPECT_TRUE(AllEqual(z1buf, [&](size_t i) { return 0.5f + replica_sum(d, z1 * chunk + i); }));
  Communicator& hsdp = Comm(comms, Group::kHsdp);
  hsdp.AllReduce(z1buf.data(), chunk, DType::kF32);
  EXPECT_TRUE(AllEqual(z1buf, [&](size_t i) {
    float s = 0.5f * topo.num_replicas();
    for (int q = 0; q < topo.num_replicas(); ++q) s += replica_sum(q, z1 * chunk + i);
    return s;
  }));
  ExpectCounters(zero2, GroupRing(topo, Group::kZero2, uint64_t(sg - 1) * per_z2 * 4));
  ExpectCounters(outer_rs, GroupRing(topo, Group::kReplicaRS, uint64_t(so / sg - 1) * chunk * 4));
  ExpectCounters(hsdp, GroupRing(topo, Group::kHsdp,
                                 AllReduceBytes(chunk, topo.num_replicas(),
                                                topo.GroupPosition(Group::kHsdp, r), 4)));
}

TEST(TopologyGroups, EveryLayoutOfThisWorld) {
  const int w = WorldSize();
  for (int rpn : RanksPerNodeChoices()) {
    auto world = MpiCommunicator::World(rpn);
    for (const Layout& l : AllLayouts(w)) CheckLayout(*world, Topology(w, rpn, l.sw, l.sg, l.so));
  }
}

// The paper's example, pinned with hand-computed numbers: W=4, two nodes of two ranks,
// sw = sg = 2, so = 4. ZeRO-1 chunk owners [0, 2, 1, 3]; the outer all-gather in {0,2} and
// {1,3} crosses nodes, the ZeRO-3 all-gather in {0,1} and {2,3} stays inside them.
TEST(TopologyGroups, PaperFourRankExample) {
  if (WorldSize() != 4) GTEST_SKIP() << "the paper's example has 4 ranks";
  const Topology topo(4, 2, 2, 2, 4);
  EXPECT_EQ(std::vector<int>({topo.Zero1ChunkOwner(0, 0), topo.Zero1ChunkOwner(1, 0),
                              topo.Zero1ChunkOwner(2, 0), topo.Zero1ChunkOwner(3, 0)}),
            std::vector<int>({0, 2, 1, 3}));
  auto world = MpiCommunicator::World(2);
  auto comms = SplitGroups(*world, topo);
  const int r = WorldRank();
  const std::string ag_names[4] = {"replica-ag{0,2}", "replica-ag{1,3}", "replica-ag{0,2}",
                                   "replica-ag{1,3}"};
  EXPECT_EQ(Comm(comms, Group::kReplicaAG).name(), ag_names[r]);
  EXPECT_EQ(Comm(comms, Group::kZero3).name(), r < 2 ? "zero3{0,1}" : "zero3{2,3}");
  // Chunk j of 6 elements holds 10*j + i; rank r starts with the chunk it owns.
  const int owned[4] = {0, 2, 1, 3};  // ZeRO-1 chunk of rank r
  std::vector<float> buf(24, kNaN);
  for (int i = 0; i < 6; ++i) buf[owned[r] * 6 + i] = 10.0f * owned[r] + i;
  Comm(comms, Group::kReplicaAG).AllGatherInPlace(buf.data() + (r % 2) * 12, 6, DType::kF32);
  Comm(comms, Group::kZero3).AllGatherInPlace(buf.data(), 12, DType::kF32);
  EXPECT_TRUE(AllEqual(buf, [](size_t e) { return 10.0f * (e / 6) + e % 6; }));
  EXPECT_EQ(Comm(comms, Group::kReplicaAG).counters().inter_node_bytes, 24u);
  EXPECT_EQ(Comm(comms, Group::kReplicaAG).counters().intra_node_bytes, 0u);
  EXPECT_EQ(Comm(comms, Group::kZero3).counters().intra_node_bytes, 48u);
  EXPECT_EQ(Comm(comms, Group::kZero3).counters().inter_node_bytes, 0u);
}

TEST(Split, OrdersMembersByKey) {
  auto world = MpiCommunicator::World(1);
  const int w = world->size(), r = world->rank();
  auto half = world->Split(r % 2, -r);  // reverse rank order inside each parity class
  std::vector<int> want;
  for (int q = w - 1; q >= 0; --q) {
    if (q % 2 == r % 2) want.push_back(q);
  }
  std::vector<int> got(half->size());
  for (int i = 0; i < half->size(); ++i) got[i] = half->world_rank(i);
  EXPECT_EQ(got, want);
  EXPECT_EQ(half->world_rank(half->rank()), r);
  std::vector<float> buf(half->size() * 3, kNaN);
  for (int i = 0; i < 3; ++i) buf[half->rank() * 3 + i] = V(r, i);
  half->AllGatherInPlace(buf.data(), 3, DType::kF32);
  EXPECT_TRUE(AllEqual(buf, [&](size_t k) { return V(want[k / 3], k % 3); }));
  EXPECT_EQ(world->counters().total(), 0u);  // the split's traffic is its own
}

// ---------------------------------------------------------------------------------------
// A communication thread on a duplicate overlaps with the main thread's collectives.

TEST(CommThreadOverlap, DuplicateOnCommThreadWhileMainThreadCollects) {
  auto world = MpiCommunicator::World(1);
  auto side = world->Duplicate();
  EXPECT_EQ(side->size(), world->size());
  EXPECT_EQ(side->rank(), world->rank());
  const int n = world->size(), p = world->rank();
  const size_t count = 20000;
  int side_bad = 0;
  std::vector<float> ar(count);
  CommThread thread("overlap");
  CommHandle h = thread.Submit([&] {
    for (int k = 0; k < 3; ++k) {
      for (size_t i = 0; i < count; ++i) ar[i] = V(p, i) + k;
      side->AllReduce(ar.data(), count, DType::kF32);
      for (size_t i = 0; i < count; ++i) side_bad += ar[i] != SumV(i) + n * k;
    }
  });
  std::vector<float> buf(n * count);
  for (int k = 0; k < 3; ++k) {
    std::fill(buf.begin(), buf.end(), kNaN);
    for (size_t i = 0; i < count; ++i) buf[p * count + i] = V(p, i) - k;
    world->AllGatherInPlace(buf.data(), count, DType::kF32);
    EXPECT_TRUE(
        AllEqual(buf, [&](size_t e) { return V(static_cast<int>(e / count), e % count) - k; }));
  }
  h.Wait();
  EXPECT_EQ(side_bad, 0);
  ExpectCounters(*world, SentTo(Successor(), 1, 3 * uint64_t(n - 1) * count * 4, 3));
  ExpectCounters(*side, SentTo(Successor(), 1, 3 * AllReduceBytes(count, n, p, 4), 3));
}

// ---------------------------------------------------------------------------------------
// Preconditions: CommError naming the call and the argument, thrown before any transfer
// (counters unchanged, and the next collective still matches on every rank).

void ExpectCommError(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no CommError; expected one mentioning: " << needle;
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

TEST(Preconditions, RejectedBeforeAnyTransfer) {
  const int w = WorldSize();
  ExpectCommError([&] { MpiCommunicator::World(0); }, "ranks_per_node=0 must be positive");
  ExpectCommError(
      [&] { MpiCommunicator::World(w + 1); },
      fmt::format("ranks_per_node={} must be positive and divide the world size {}", w + 1, w));
  auto world = MpiCommunicator::World(1);
  const int n = world->size(), p = world->rank();
  const std::string name = world->name();
  EXPECT_EQ(name.rfind("world{0", 0), 0u) << name;
  std::vector<float> a(4 * n + 4, 1.0f), b(4 * n + 4, 1.0f);

  ExpectCommError([&] { world->AllGatherInPlace(nullptr, 3, DType::kF32); },
                  "AllGatherInPlace on " + name + ": buf is null with count 3");
  ExpectCommError([&] { world->AllGather(nullptr, a.data(), 2, DType::kF32); },
                  "AllGather on " + name + ": send is null");
  ExpectCommError([&] { world->AllGather(a.data(), nullptr, 2, DType::kF32); },
                  "AllGather on " + name + ": recv is null");
  // Overlapping, but not the exact in-place alias recv + rank*count.
  ExpectCommError([&] { world->AllGather(a.data() + p * 2 + 1, a.data(), 2, DType::kF32); },
                  "send overlaps recv");
  ExpectCommError(
      [&] { world->ReduceScatter(a.data(), DType::kE4M3, b.data(), DType::kF32, 2, false); },
      "ReduceScatter on " + name + ": send_dtype e4m3 is not supported");
  ExpectCommError(
      [&] { world->ReduceScatter(a.data(), DType::kF32, b.data(), DType::kUE8M0, 2, false); },
      "recv_dtype ue8m0 is not supported");
  ExpectCommError(
      [&] { world->ReduceScatter(nullptr, DType::kF32, b.data(), DType::kF32, 2, false); },
      "ReduceScatter on " + name + ": send is null with count 2");
  ExpectCommError(
      [&] { world->ReduceScatter(a.data(), DType::kF32, nullptr, DType::kF32, 2, true); },
      "recv is null with count 2");
  ExpectCommError(
      [&] { world->ReduceScatter(a.data(), DType::kF32, a.data() + 1, DType::kF32, 2, true); },
      "overlap");
  ExpectCommError([&] { world->AllReduce(a.data(), 2, DType::kE5M2); },
                  "AllReduce on " + name + ": dtype e5m2 is not supported");
  ExpectCommError([&] { world->AllReduce(nullptr, 2, DType::kF32); }, "buf is null");
  ExpectCommError(
      [&] {
        world->Exchange({{n, a.data(), 4, 0}}, {});
      },
      fmt::format("Exchange on {}: sends[0].peer = {} is outside the group of {}", name, n, n));
  ExpectCommError(
      [&] {
        world->Exchange({}, {{0, a.data(), 4, 0}, {-1, a.data(), 4, 0}});
      },
      "recvs[1].peer = -1");
  ExpectCommError([&] { world->Exchange({{0, a.data(), 4, -1}}, {}); }, "sends[0].tag = -1");
  ExpectCommError(
      [&] {
        world->Exchange({{0, a.data(), 4, MpiCommunicator::kMaxUserTag + 1}}, {});
      },
      "is outside [0, " + std::to_string(MpiCommunicator::kMaxUserTag) + "]");
  ExpectCommError(
      [&] {
        world->Exchange({}, {{0, nullptr, 4, 0}});
      },
      "recvs[0].data is null with 4 bytes");
  ExpectCommError([&] { world->Split(-1, 0); }, "color -1 must be non-negative");
  ExpectCommError([&] { world->set_max_message_bytes(0); }, "max message bytes 0");
  ExpectCommError([&] { world->world_rank(n); }, "position " + std::to_string(n));
  EXPECT_EQ(world->counters().total(), 0u);
  EXPECT_EQ(world->counters().calls, 0u);

  // Null pointers are fine with count 0, and nothing is sent.
  world->AllGatherInPlace(nullptr, 0, DType::kF32);
  world->AllGather(nullptr, nullptr, 0, DType::kBF16);
  world->ReduceScatter(nullptr, DType::kF32, nullptr, DType::kBF16, 0, true);
  world->AllReduce(nullptr, 0, DType::kBF16);
  EXPECT_EQ(world->counters().total(), 0u);
  EXPECT_EQ(world->counters().calls, 4u);

  // Every rank is still in step.
  std::vector<float> ok(n, 0.0f);
  ok[p] = V(p, 0);
  world->AllGatherInPlace(ok.data(), 1, DType::kF32);
  EXPECT_TRUE(AllEqual(ok, [](size_t k) { return V(static_cast<int>(k), 0); }));
  world->ResetCounters();
  EXPECT_EQ(world->counters().calls, 0u);
}

}  // namespace
}  // namespace sshsdp
