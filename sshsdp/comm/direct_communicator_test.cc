// Multi-rank tests of DirectCommunicator (the ZeroSM path) beyond single collectives: groups
// from Topology layouts and the geometry check, calls rejected on every member before any
// transfer, threads and the delegated calls; the collectives' results are in
// direct_collectives_test.cc (see direct_communicator.h).
//
// Run through mpirun on 1-8 ranks, each with 1, 2 and 4 simulated nodes where they divide the
// world (and one rank per node). Covered: every ZeRO-3 / ZeRO-2 group a Topology can form
// (balanced ones equal to the ring, unbalanced ones rejected at Create); calls rejected on every
// member before any transfer (count, offset, window mismatch, unregistered buffer, binding
// change); a CommThread running one direct communicator while the main thread uses another;
// AllReduce / Barrier counted like the ring.
#include "sshsdp/comm/direct_communicator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/comm_thread.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/testing/direct_test_util.h"
#include "sshsdp/layout/topology.h"

namespace sshsdp {
namespace {

using testing::direct::AllGatherBytes;
using testing::direct::DirectWorld;
using testing::direct::ExpectCounters;
using testing::direct::kNaN;
using testing::direct::RanksPerNodeChoices;
using testing::direct::ReduceScatterBytes;
using testing::direct::RegisterBuffer;
using testing::direct::SameBytes;
using testing::direct::Trace;
using testing::direct::V;
using testing::direct::WorldRank;
using testing::direct::WorldSize;

// ---------------------------------------------------------------------------------------
// Groups from Topology layouts: the per-microbatch ZeRO-3 all-gather and ZeRO-2
// reduce-scatter on every group the layouts of this world form.

bool Balanced(const std::vector<int>& members, int rpn) {
  std::map<int, int> per_node;
  for (int r : members) per_node[r / rpn]++;
  for (const auto& [node, c] : per_node)
    if (c != per_node.begin()->second) return false;
  return true;
}

TEST(DirectGroups, EveryLayoutGroupEqualsRingOrIsRejected) {
  const int W = WorldSize(), r = WorldRank();
  std::vector<int> divisors;
  for (int d = 1; d <= W; ++d)
    if (W % d == 0) divisors.push_back(d);
  int rejected = 0, accepted = 0;
  std::vector<int> rpns = RanksPerNodeChoices();
  if (W % 2 == 0 && W > 2) rpns.push_back(2);  // nodes of 2 (W=6: sw=3 groups are unbalanced)
  for (int rpn : rpns) {
    auto world = MpiCommunicator::World(rpn);
    for (int sw : divisors) {
      for (int sg : divisors) {
        if (sg % sw) continue;
        Topology t(W, rpn, sw, sg, sg);
        for (Group grp : {Group::kZero3, Group::kZero2}) {
          if (grp == Group::kZero3 && sg != sw) continue;  // each ZeRO-3 group once
          SCOPED_TRACE(fmt::format("rpn={} sw={} sg={} {}", rpn, sw, sg, GroupName(grp)));
          const int color = t.GroupColor(grp, r), key = t.GroupPosition(grp, r);
          auto ring = world->Split(color, key);
          auto mpi = std::unique_ptr<MpiCommunicator>(
              static_cast<MpiCommunicator*>(world->Split(color, key).release()));
          const std::vector<int> members = t.GroupMembers(grp, r);
          if (!Balanced(members, rpn)) {
            try {
              DirectCommunicator::Create(std::move(mpi));
              ADD_FAILURE() << "unbalanced group accepted";
            } catch (const LayoutError& e) {
              EXPECT_NE(std::string(e.what()).find("spread evenly"), std::string::npos) << e.what();
            }
            ++rejected;
            continue;
          }
          ++accepted;
          auto d = DirectCommunicator::Create(std::move(mpi));
          const int n = d->size(), p = d->rank();
          ASSERT_EQ(p, key);
          const size_t count = 53;
          if (grp == Group::kZero3) {
            DataNode& buf = RegisterBuffer(*d, "w_full", DType::kBF16, n * count);
            std::vector<bf16> want(n * count);
            for (size_t i = 0; i < count; ++i)
              want[p * count + i] = buf.data_as<bf16>()[p * count + i] =
                  bf16{static_cast<uint16_t>(r * 101 + i)};
            d->AllGatherInPlace(buf.data(), count, DType::kBF16);
            ring->AllGatherInPlace(want.data(), count, DType::kBF16);
            EXPECT_TRUE(SameBytes(buf.data(), want.data(), n * count * 2));
            ExpectCounters(*d, AllGatherBytes(d->geometry(), count, 2), "zero3 AG");
          } else {
            DataNode& gp = RegisterBuffer(*d, "g_full", DType::kF32, n * count);
            for (size_t j = 0; j < n * count; ++j) gp.data_as<float>()[j] = V(r, j);
            std::vector<float> got(count, 1.0f), want(count, 1.0f);
            d->ReduceScatter(gp.data(), DType::kF32, got.data(), DType::kF32, count, true);
            ring->ReduceScatter(gp.data(), DType::kF32, want.data(), DType::kF32, count, true);
            EXPECT_EQ(got, want);
            ExpectCounters(*d, ReduceScatterBytes(d->geometry(), count, 4, 4), "zero2 RS");
          }
        }
      }
    }
  }
  if (W == 6) {
    EXPECT_GT(rejected, 0) << "W=6 with 3 nodes of 2 has unbalanced sw=3 groups";
  }
  EXPECT_GT(accepted, 0);
}

TEST(DirectGeometry, RejectsUnbalancedGroupsBeforeAnyCollective) {
  // Pure function: no MPI involved.
  try {
    NodeGeometry::Of({0, 1, 2}, 0, 2, "zero3{0,1,2}");
    ADD_FAILURE() << "3 ranks over nodes of 2 accepted";
  } catch (const LayoutError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("zero3{0,1,2}"), std::string::npos) << m;
    EXPECT_NE(m.find("node 0 holds 2"), std::string::npos) << m;
    EXPECT_NE(m.find("node 1 holds 1"), std::string::npos) << m;
  }
  NodeGeometry g = NodeGeometry::Of({0, 2, 1, 3}, 2, 2, "zero2");  // interleaved positions
  EXPECT_EQ(g.K, 2);
  EXPECT_EQ(g.L, 2);
  EXPECT_EQ(g.at[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(g.at[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(g.k0, 0);
  EXPECT_EQ(g.l0, 1);
  EXPECT_THROW(NodeGeometry::Of({0, 1}, 0, 0, "x"), LayoutError);

  const int W = WorldSize(), r = WorldRank();
  // ranks_per_node must divide the world: refused before the group (and its windows) exist.
  try {
    DirectCommunicator::Create(MpiCommunicator::World(W + 1));
    ADD_FAILURE() << "ranks_per_node=" << W + 1 << " accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("divide"), std::string::npos) << e.what();
  }
  // Real groups: the first three ranks over nodes of 2 (W >= 4 and even).
  if (W < 4 || W % 2) return;
  auto world = MpiCommunicator::World(2);
  const int color = r < 3 ? 0 : 1;
  auto mpi = std::unique_ptr<MpiCommunicator>(
      static_cast<MpiCommunicator*>(world->Split(color, r).release()));
  std::vector<int> members;
  for (int q = 0; q < W; ++q)
    if ((q < 3 ? 0 : 1) == color) members.push_back(q);
  if (Balanced(members, 2)) {
    auto d = DirectCommunicator::Create(std::move(mpi));
    d->Barrier();
  } else {
    EXPECT_THROW(DirectCommunicator::Create(std::move(mpi)), LayoutError);
  }
}

// ---------------------------------------------------------------------------------------
// Calls rejected on every member before any transfer.

// Expects a CommError containing `needle` (on the members where it is not empty).
template <class F>
void ExpectCommError(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no CommError; wanted one containing '" << needle << "'";
  } catch (const CommError& e) {
    if (!needle.empty()) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

TEST(DirectErrors, MismatchedCallsAreRejectedBeforeAnyTransfer) {
  const int W = WorldSize();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  for (int rpn : RanksPerNodeChoices()) {
    SCOPED_TRACE(Trace(rpn));
    auto d = DirectWorld(rpn);
    const int n = d->size(), p = d->rank();
    const size_t count = 40;
    DataNode& buf = RegisterBuffer(*d, "ag", DType::kF32, n * (count + 1), n * (count + 1));
    float* b = buf.data_as<float>();
    auto reset = [&](size_t c) {
      std::fill_n(b, n * (count + 1), kNaN);
      for (size_t i = 0; i < c; ++i) b[p * c + i] = V(p, i);
    };
    auto untouched = [&](size_t c) {
      for (size_t k = 0; k < n * (count + 1); ++k) {
        if (k >= p * c && k < (p + 1) * c) continue;
        if (!std::isnan(b[k])) return false;
      }
      return true;
    };
    // Unequal shards: rank 0 passes count+1.
    const size_t c = p == 0 ? count + 1 : count;
    reset(c);
    ExpectCommError([&] { d->AllGatherInPlace(b, c, DType::kF32); }, "count differs");
    EXPECT_TRUE(untouched(c)) << "a rejected call moved data";
    // Asymmetric offsets: rank 0 gathers into the second region.
    DataNode* alt = buf.parent()->FindChild("alt");
    float* target = p == 0 ? alt->data_as<float>() : b;
    std::vector<float> src(count, 1.0f);
    ExpectCommError([&] { d->AllGather(src.data(), target, count, DType::kF32); },
                    "window offset differs");
    // An unregistered buffer on the last rank: it names the reason, the others name it.
    std::vector<float> plain(n * count);
    float* where = p == n - 1 ? plain.data() : b;
    ExpectCommError([&] { d->AllGather(src.data(), where, count, DType::kF32); },
                    p == n - 1 ? "not inside a registered window" : "failed its own checks");
    // A reduce-scatter whose G′ is not registered (on every rank), and overlap of send/recv.
    std::vector<float> out(count);
    ExpectCommError(
        [&] { d->ReduceScatter(plain.data(), DType::kF32, out.data(), DType::kF32, count, false); },
        "not inside a registered window");
    ExpectCommError([&] { d->ReduceScatter(b, DType::kF32, b + 1, DType::kF32, count, false); },
                    "overlap");
    // Different collectives at the same point of the sequence.
    ExpectCommError(
        [&] {
          if (p == 0) {
            d->ReduceScatter(b, DType::kF32, out.data(), DType::kF32, count, false);
          } else {
            d->AllGatherInPlace(b, count, DType::kF32);
          }
        },
        "collective differs");
    // The communicator is still usable: a correct call goes through.
    reset(count);
    d->AllGatherInPlace(b, count, DType::kF32);
    for (size_t k = 0; k < n * count; ++k)
      ASSERT_EQ(b[k], V(static_cast<int>(k / count), k % count));
  }
}

TEST(DirectErrors, DetectsBindingChange) {
  for (int rpn : RanksPerNodeChoices()) {
    SCOPED_TRACE(Trace(rpn));
    auto d = DirectWorld(rpn);
    const int n = d->size();
    const size_t count = 16;
    DataNode& buf = RegisterBuffer(*d, "gather_arena", DType::kF32, n * count);
    DataNode& root = const_cast<DataNode&>(buf.root());
    void* registered = buf.data();
    // Re-attaching a different base while bound is refused by the data tree itself.
    alignas(64) static float other[64 * 8];
    EXPECT_THROW(root.AttachExternal(other, sizeof(other)), LayoutError);
    // Released: the window memory is no longer the root's.
    root.Release();
    ExpectCommError([&] { d->AllGatherInPlace(registered, count, DType::kF32); }, "binding change");
    // Re-bound elsewhere: a buffer of the root is no longer registered memory.
    root.AttachExternal(other, sizeof(other));
    ExpectCommError([&] { d->AllGatherInPlace(buf.data(), count, DType::kF32); },
                    "binding changed");
    // Bound back to its window: accepted again.
    root.Release();
    root.AttachExternal(registered, n * count * 4 + 64);
    std::fill_n(buf.data_as<float>(), n * count, 2.0f);
    d->AllGatherInPlace(buf.data(), count, DType::kF32);
  }
}

// A CommThread runs the all-gathers of one direct communicator (its own windows) while the
// main thread runs reduce-scatters on another — the engine's threading.
TEST(DirectThreads, CommThreadAndMainThreadUseSeparateCommunicators) {
  const int W = WorldSize();
  const int rpn = W % 2 == 0 ? W / 2 : W;
  auto main_comm = DirectWorld(rpn);
  auto thread_comm = std::unique_ptr<DirectCommunicator>(
      static_cast<DirectCommunicator*>(main_comm->Duplicate().release()));
  const int n = main_comm->size(), p = main_comm->rank();
  const size_t count = 257;
  DataNode& ag = RegisterBuffer(*thread_comm, "w_full", DType::kF32, n * count);
  DataNode& gp = RegisterBuffer(*main_comm, "g_full", DType::kF32, n * count);
  CommThread thread("direct");
  for (int it = 0; it < 20; ++it) {
    for (size_t i = 0; i < count; ++i) ag.data_as<float>()[p * count + i] = V(p, i) + it;
    for (size_t j = 0; j < n * count; ++j) gp.data_as<float>()[j] = V(p, j) - it;
    CommHandle h =
        thread.Submit([&] { thread_comm->AllGatherInPlace(ag.data(), count, DType::kF32); });
    std::vector<float> out(count);
    main_comm->ReduceScatter(gp.data(), DType::kF32, out.data(), DType::kF32, count, false);
    h.Wait();
    for (size_t k = 0; k < n * count; ++k)
      ASSERT_EQ(ag.data_as<float>()[k], V(static_cast<int>(k / count), k % count) + it);
    for (size_t i = 0; i < count; ++i) {
      float s = 0;
      for (int r = 0; r < n; ++r) s += V(r, p * count + i) - it;
      ASSERT_EQ(out[i], s);
    }
  }
}

// AllReduce / Exchange / Barrier run on the wrapped ring communicator, counted the same.
TEST(DirectDelegated, AllReduceAndBarrierCountLikeTheRing) {
  const int W = WorldSize();
  const int rpn = W % 2 == 0 ? W / 2 : W;
  auto ring = MpiCommunicator::World(rpn);
  auto d = DirectWorld(rpn);
  const size_t count = 101;
  std::vector<float> a(count), b(count);
  for (size_t i = 0; i < count; ++i) a[i] = b[i] = V(d->rank(), i);
  d->AllReduce(a.data(), count, DType::kF32);
  ring->AllReduce(b.data(), count, DType::kF32);
  EXPECT_EQ(a, b);
  d->Barrier();
  ring->Barrier();
  EXPECT_EQ(d->counters().intra_node_bytes, ring->counters().intra_node_bytes);
  EXPECT_EQ(d->counters().inter_node_bytes, ring->counters().inter_node_bytes);
  EXPECT_EQ(d->counters().calls, ring->counters().calls);
  EXPECT_EQ(d->name().rfind("direct:", 0), 0u) << d->name();
}

}  // namespace
}  // namespace sshsdp
