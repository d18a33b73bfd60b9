// DirectCommunicator test helpers: what direct_collectives_test.cc and
// direct_communicator_test.cc share — simulated-node choices, registered buffers, exact data
// and the byte-counter formulas — so both executables build and check the same way (see
// direct_communicator.h).
//
//   auto d = DirectWorld(rpn);                    // rpn from RanksPerNodeChoices()
//   DataNode& buf = RegisterBuffer(*d, "ag", DType::kF32, d->size() * count);
//   d->AllGatherInPlace(buf.data(), count, DType::kF32);
//   ExpectCounters(*d, AllGatherBytes(d->geometry(), count, 4), "fp32 AllGather");
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sshsdp/comm/direct_communicator.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/testing/mpi_test_util.h"

namespace sshsdp::testing::direct {

// memcmp of n bytes that is also defined for n == 0 (empty buffers may be null).
inline bool SameBytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

using mpi::kNaN;  // shared with the ring collectives' tests (mpi_test_util.h)
using mpi::WorldRank;
using mpi::WorldSize;

// ranks_per_node for 1, 2 and 4 simulated nodes (where they divide the world) and 1 rank per
// node: all-intra, balanced multi-node, and all-inter.
inline std::vector<int> RanksPerNodeChoices() {
  const int w = WorldSize();
  std::set<int> s = {w, 1};
  if (w % 2 == 0) s.insert(w / 2);
  if (w % 4 == 0) s.insert(w / 4);
  return {s.rbegin(), s.rend()};
}

inline std::unique_ptr<DirectCommunicator> DirectWorld(int rpn) {
  return DirectCommunicator::Create(MpiCommunicator::World(rpn));
}

// A registered root holding one buffer "buf" of `numel` elements (plus `extra` elements of a
// second region "alt" behind it); returns the buffer view.
inline DataNode& RegisterBuffer(DirectCommunicator& d, const std::string& name, DType dt,
                                size_t numel, size_t extra = 0) {
  auto root = std::make_unique<DataNode>(name);
  root->AddChild("buf", dt, {static_cast<int64_t>(numel)}, DataNode::kAuto, 64);
  if (extra) root->AddChild("alt", dt, {static_cast<int64_t>(extra)}, DataNode::kAuto, 64);
  root->Finalize();
  return *d.Register(std::move(root)).FindChild("buf");
}

// Exact integers in fp32 (sums < 2^24).
inline float V(int rank, size_t i) {
  return static_cast<float>(rank * 100000 + static_cast<int>(i));
}
// Tiny integers, exact in bf16, and so are their sums over 8 ranks.
inline float Small(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((rank * 3 + i) % 7) - 3);
}

struct Expect {
  uint64_t intra = 0, inter = 0, calls = 0;
};

inline void ExpectCounters(const Communicator& c, const Expect& want, const std::string& what) {
  EXPECT_EQ(c.counters().intra_node_bytes, want.intra) << what << " on " << c.name();
  EXPECT_EQ(c.counters().inter_node_bytes, want.inter) << what << " on " << c.name();
  EXPECT_EQ(c.counters().calls, want.calls) << what << " on " << c.name();
}

// The formulas of direct_communicator.h.
inline Expect AllGatherBytes(const NodeGeometry& g, size_t count, size_t e) {
  return {static_cast<uint64_t>(g.L - 1) * g.K * count * e,
          static_cast<uint64_t>(g.K - 1) * count * e, 1};
}
inline Expect ReduceScatterBytes(const NodeGeometry& g, size_t count, size_t e_send, size_t pe) {
  return {static_cast<uint64_t>(g.n - g.K) * count * e_send,
          static_cast<uint64_t>(g.K - 1) * count * pe, 1};
}

inline std::string Trace(int rpn) { return "ranks_per_node=" + std::to_string(rpn); }

}  // namespace sshsdp::testing::direct
