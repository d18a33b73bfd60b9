// MpiCommunicator test helpers: what mpi_collectives_test.cc and mpi_communicator_test.cc
// share — ranks_per_node choices, exact data, element checks and the ring's byte-counter
// formulas — so both executables build and check the same way (see mpi_communicator.h).
//
//   auto world = MpiCommunicator::World(rpn);     // rpn from RanksPerNodeChoices()
//   world->AllReduce(buf.data(), count, DType::kF32);
//   EXPECT_TRUE(AllEqual(buf, [&](size_t i) { return SumV(i); }));
//   ExpectCounters(*world, SentTo(Successor(), rpn, AllReduceBytes(count, n, p, 4)));
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "sshsdp/comm/communicator.h"

namespace sshsdp::testing::mpi {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline int WorldSize() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// 1, 2 (when it divides the world) and the whole world: all-inter, mixed, all-intra.
inline std::vector<int> RanksPerNodeChoices() {
  const int w = WorldSize();
  std::set<int> s = {1, w};
  if (w % 2 == 0) s.insert(2);
  return {s.begin(), s.end()};
}

// Exact integers in fp32 for every rank count and index used here (sums < 2^24).
inline float V(int rank, size_t i) {
  return static_cast<float>(rank * 100000 + static_cast<int>(i));
}
// Tiny integers, exact in bf16, and so are their sums over 8 ranks.
inline float Small(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((rank * 3 + i) % 7) - 3);
}

// Counters expected when this rank sends `bytes` to world rank `to` in `calls` calls.
inline CommCounters SentTo(int to, int ranks_per_node, uint64_t bytes, uint64_t calls = 1) {
  CommCounters c;
  if (WorldRank() / ranks_per_node == to / ranks_per_node) {
    c.intra_node_bytes = bytes;
  } else {
    c.inter_node_bytes = bytes;
  }
  c.calls = calls;
  return c;
}

inline void ExpectCounters(const Communicator& comm, const CommCounters& want) {
  EXPECT_EQ(comm.counters().intra_node_bytes, want.intra_node_bytes) << comm.name();
  EXPECT_EQ(comm.counters().inter_node_bytes, want.inter_node_bytes) << comm.name();
  EXPECT_EQ(comm.counters().calls, want.calls) << comm.name();
}

// World successor in a ring over the world communicator.
inline int Successor() { return (WorldRank() + 1) % WorldSize(); }

template <class T, class F>
inline ::testing::AssertionResult AllEqual(const std::vector<T>& got, F want) {
  for (size_t i = 0; i < got.size(); ++i) {
    const auto w = want(i);
    if (!(got[i] == w)) {
      return ::testing::AssertionFailure()
             << "element " << i << " of " << got.size() << ": got " << got[i] << ", want " << w;
    }
  }
  return ::testing::AssertionSuccess();
}

// Sum over all ranks of Small(r, j) / V(r, j).
inline float SumSmall(size_t j) {
  float s = 0;
  for (int r = 0; r < WorldSize(); ++r) s += Small(r, j);
  return s;
}
inline float SumV(size_t j) {
  float s = 0;
  for (int r = 0; r < WorldSize(); ++r) s += V(r, j);
  return s;
}

// 4*(count - c_p) + e*(count - c_{(p+1) mod n}), c_j = count/n + (j < count%n).
inline uint64_t AllReduceBytes(size_t count, int n, int p, size_t e) {
  auto c = [&](int j) { return count / n + (static_cast<size_t>(j) < count % n ? 1 : 0); };
  return 4 * (count - c(p)) + e * (count - c((p + 1) % n));
}

}  // namespace sshsdp::testing::mpi
