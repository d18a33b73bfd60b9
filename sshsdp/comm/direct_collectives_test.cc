// Multi-rank tests of the DirectCommunicator collectives (the ZeroSM path): all-gather and
// reduce-scatter results and byte counts per message size and reduction mode, split from
// direct_communicator_test.cc to keep each executable about one concern (see
// direct_communicator.h).
//
// Run through mpirun on 1-8 ranks, each with 1, 2 and 4 simulated nodes where they divide the
// world (and one rank per node). Style of mpi_communicator_test.cc: exact integer-valued data so
// every sum is exact and results compare with ==; every collective asserts the byte counters
// exactly (the formulas of direct_communicator.h). Covered: all-gather bitwise equal to the ring
// (MpiCommunicator) for fp32 / bf16 / 1-byte data, in and out of place; reduce-scatter equal to
// the ring and to the exact sums in fp32, bf16+fp32 and bf16-out modes, plain and accumulating;
// bf16sr equal bit for bit to a reference built from the numerics SR and reproducible per seed;
// 200 back-to-back reduce-scatters reusing the one workspace with skewed ranks.
#include "sshsdp/comm/direct_communicator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/testing/direct_test_util.h"
#include "sshsdp/numerics/stochastic_rounding.h"

namespace sshsdp {
namespace {

using testing::direct::AllGatherBytes;
using testing::direct::DirectWorld;
using testing::direct::Expect;
using testing::direct::ExpectCounters;
using testing::direct::kNaN;
using testing::direct::RanksPerNodeChoices;
using testing::direct::ReduceScatterBytes;
using testing::direct::RegisterBuffer;
using testing::direct::SameBytes;
using testing::direct::Small;
using testing::direct::Trace;
using testing::direct::V;
using testing::direct::WorldSize;

// ---------------------------------------------------------------------------------------
// All-gather.

class DirectCountTest : public ::testing::TestWithParam<size_t> {};

TEST_P(DirectCountTest, AllGatherBitwiseEqualsRing) {
  const size_t count = GetParam();
  for (int rpn : RanksPerNodeChoices()) {
    SCOPED_TRACE(Trace(rpn));
    auto ring = MpiCommunicator::World(rpn);
    auto direct = DirectWorld(rpn);
    const NodeGeometry& g = direct->geometry();
    const int n = direct->size(), p = direct->rank();
    EXPECT_EQ(g.K * g.L, n);
    EXPECT_EQ(g.K, n / std::min(n, rpn));

    // fp32 bit patterns, NaN payloads included: out of place from an unregistered source.
    auto bits = [](int r, size_t i) {
      return 0x7FC00001u + static_cast<uint32_t>(r * 7919 + i * 31);
    };
    std::vector<uint32_t> send(count), want(n * count, 0xDEADBEEF);
    for (size_t i = 0; i < count; ++i) send[i] = bits(p, i) ^ (i % 3 ? 0x80000000u : 0);
    DataNode& buf = RegisterBuffer(*direct, "ag.f32", DType::kF32, n * count);
    std::fill_n(buf.data_as<uint32_t>(), n * count, 0xDEADBEEFu);
    direct->AllGather(send.data(), buf.data(), count, DType::kF32);
    ring->AllGather(send.data(), want.data(), count, DType::kF32);
    EXPECT_TRUE(SameBytes(buf.data(), want.data(), n * count * 4)) << "fp32 all-gather differs";
    ExpectCounters(*direct, AllGatherBytes(g, count, 4), "fp32 AllGather");

    // bf16 in place.
    direct->ResetCounters();
    DataNode& b16 = RegisterBuffer(*direct, "ag.bf16", DType::kBF16, n * count);
    std::vector<bf16> want16(n * count);
    for (size_t i = 0; i < count; ++i) {
      const bf16 v{static_cast<uint16_t>(p * 613 + i * 7)};
      b16.data_as<bf16>()[p * count + i] = v;
      want16[p * count + i] = v;
    }
    direct->AllGatherInPlace(b16.data(), count, DType::kBF16);
    ring->AllGatherInPlace(want16.data(), count, DType::kBF16);
    EXPECT_TRUE(SameBytes(b16.data(), want16.data(), n * count * 2)) << "bf16 differs";
    // 1-byte elements (e4m3 weights).
    DataNode& b8 = RegisterBuffer(*direct, "ag.e4m3", DType::kE4M3, n * count);
    std::vector<uint8_t> s8(count);
    for (size_t i = 0; i < count; ++i) s8[i] = static_cast<uint8_t>(p * 37 + i);
    direct->AllGather(s8.data(), b8.data(), count, DType::kE4M3);
    for (size_t k = 0; k < n * count; ++k) {
      ASSERT_EQ(b8.data_as<uint8_t>()[k], static_cast<uint8_t>((k / count) * 37 + k % count)) << k;
    }
    Expect e2 = AllGatherBytes(g, count, 2), e1 = AllGatherBytes(g, count, 1);
    ExpectCounters(*direct, {e2.intra + e1.intra, e2.inter + e1.inter, 2}, "bf16+e4m3 AllGather");
  }
}

// Inter-node bytes of the direct all-gather are those of a hierarchical gather that exchanges
// after the intra-node step, divided by the members per node.
TEST(DirectAllGather, InterNodeBytesFallByMembersPerNode) {
  for (int rpn : RanksPerNodeChoices()) {
    SCOPED_TRACE(Trace(rpn));
    auto direct = DirectWorld(rpn);
    const NodeGeometry& g = direct->geometry();
    const size_t count = 96;
    DataNode& buf = RegisterBuffer(*direct, "ag", DType::kF32, g.n * count);
    for (size_t i = 0; i < count; ++i) buf.data_as<float>()[direct->rank() * count + i] = 1.0f;
    direct->AllGatherInPlace(buf.data(), count, DType::kF32);
    const uint64_t intra_first_inter = static_cast<uint64_t>(g.K - 1) * g.L * count * 4;
    EXPECT_EQ(direct->counters().inter_node_bytes * g.L, intra_first_inter);
  }
}

// ---------------------------------------------------------------------------------------
// Reduce-scatter.

TEST_P(DirectCountTest, ReduceScatterFp32EqualsRingAndExactSums) {
  const size_t count = GetParam();
  for (int rpn : RanksPerNodeChoices()) {
    SCOPED_TRACE(Trace(rpn));
    auto ring = MpiCommunicator::World(rpn);
    auto direct = DirectWorld(rpn);
    const NodeGeometry& g = direct->geometry();
    const int n = direct->size(), p = direct->rank();
    DataNode& gp = RegisterBuffer(*direct, "G'", DType::kF32, n * count);
    float* send = gp.data_as<float>();
    for (size_t j = 0; j < n * count; ++j) send[j] = V(p, j);
    std::vector<float> got(count, kNaN), want(count, kNaN);
    direct->ReduceScatter(send, DType::kF32, got.data(), DType::kF32, count, false);
    ring->ReduceScatter(send, DType::kF32, want.data(), DType::kF32, count, false);
    for (size_t i = 0; i < count; ++i) {
      float exact = 0;
      for (int r = 0; r < n; ++r) exact += V(r, p * count + i);
      ASSERT_EQ(got[i], exact) << i;
      ASSERT_EQ(got[i], want[i]) << i;
    }
    // Accumulate into the persistent destination: recv += Σ.
    auto old = [](size_t i) { return 0.5f * static_cast<float>(i) - 3.0f; };
    for (size_t i = 0; i < count; ++i) got[i] = want[i] = old(i);
    direct->ReduceScatter(send, DType::kF32, got.data(), DType::kF32, count, true);
    ring->ReduceScatter(send, DType::kF32, want.data(), DType::kF32, count, true);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], want[i]) << i;
    Expect e = ReduceScatterBytes(g, count, 4, 4);
    ExpectCounters(*direct, {2 * e.intra, 2 * e.inter, 2}, "fp32 ReduceScatter");
    // Totals equal the ring's (n-1)·c·4.
    EXPECT_EQ(direct->counters().total(), ring->counters().total());
  }
}

TEST_P(DirectCountTest, ReduceScatterBf16InputModes) {
  const size_t count = GetParam();
  for (int rpn : RanksPerNodeChoices()) {
    SCOPED_TRACE(Trace(rpn));
    auto direct = DirectWorld(rpn);
    const NodeGeometry& g = direct->geometry();
    const int n = direct->size(), p = direct->rank();
    DataNode& gp = RegisterBuffer(*direct, "G'bf16", DType::kBF16, n * count);
    bf16* send = gp.data_as<bf16>();
    for (size_t j = 0; j < n * count; ++j) send[j] = FloatToBf16(Small(p, j));
    auto exact = [&](size_t i) {
      float s = 0;
      for (int r = 0; r < n; ++r) s += Small(r, p * count + i);
      return s;
    };
    auto old = [](size_t i) { return static_cast<float>(static_cast<int>(i % 5) - 2); };
    // bf16+fp32: bf16 G′, fp32 partials, accumulated into an fp32 G′ᶻ².
    std::vector<float> acc(count);
    for (size_t i = 0; i < count; ++i) acc[i] = old(i);
    direct->ReduceScatter(send, DType::kBF16, acc.data(), DType::kF32, count, true);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(acc[i], old(i) + exact(i)) << i;
    // bf16 out, written then accumulated.
    std::vector<bf16> out(count, bf16{0x7FC1});
    direct->ReduceScatter(send, DType::kBF16, out.data(), DType::kBF16, count, false);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(Bf16ToFloat(out[i]), exact(i)) << i;
    direct->ReduceScatter(send, DType::kBF16, out.data(), DType::kBF16, count, true);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(Bf16ToFloat(out[i]), 2 * exact(i)) << i;
    // bf16 slices travel within the node, fp32 partials between nodes.
    Expect e = ReduceScatterBytes(g, count, 2, 4);
    ExpectCounters(*direct, {3 * e.intra, 3 * e.inter, 3}, "bf16 ReduceScatter");
  }
}

INSTANTIATE_TEST_SUITE_P(Counts, DirectCountTest, ::testing::Values(0, 1, 37, 1000, 5000));

// bf16sr: node partials stored in bf16 with stochastic rounding. The result equals, bit for
// bit, a reference assembled from the numerics SR with the documented element indexing, is
// identical for the same key and differs for another seed (when partials exist).
TEST(DirectReduceScatter, Bf16SrMatchesReferenceAndReproduces) {
  const size_t count = 777;
  for (int rpn : RanksPerNodeChoices()) {
    SCOPED_TRACE(Trace(rpn));
    auto direct = DirectWorld(rpn);
    const NodeGeometry& g = direct->geometry();
    const int n = direct->size(), p = direct->rank();
    // Values whose sums need more than bf16's 8 significant bits.
    auto G = [](int r, size_t j) {
      return FloatToBf16(1.0f + static_cast<float>((r * 13 + j * 7) % 97) / 64.0f +
                         static_cast<float>(j % 5) * 3.0f);
    };
    DataNode& gp = RegisterBuffer(*direct, "G'sr", DType::kBF16, n * count);
    for (size_t j = 0; j < n * count; ++j) gp.data_as<bf16>()[j] = G(p, j);
    ReduceScatterOptions o;
    o.partial_dtype = DType::kBF16;
    o.sr_key = SrKey{1234, 7, 3};
    auto old = [](size_t i) { return static_cast<float>(i % 11) * 0.25f; };
    std::vector<float> a(count), b(count), c(count);
    for (size_t i = 0; i < count; ++i) a[i] = b[i] = c[i] = old(i);
    direct->ReduceScatterPartials(gp.data(), DType::kBF16, a.data(), DType::kF32, count, true, o);
    // The same key again: the same draws.
    direct->ReduceScatterPartials(gp.data(), DType::kBF16, b.data(), DType::kF32, count, true, o);
    ReduceScatterOptions o2 = o;
    o2.sr_key.seed = 99;
    direct->ReduceScatterPartials(gp.data(), DType::kBF16, c.data(), DType::kF32, count, true, o2);

    // Reference: P_k = SR(Σ_l G_{at[k][l]}) with element indices k·n·count + p·count + i for
    // k != k0; this node's P_k0 stays fp32; total in node order; recv = old + total.
    std::vector<std::vector<bf16>> slices(n, std::vector<bf16>(count));
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) slices[q][i] = G(q, p * count + i);
    std::vector<float> total(count, 0.0f);
    std::vector<bf16> part(count);
    for (int k = 0; k < g.K; ++k) {
      std::vector<const bf16*> srcs;
      for (int l = 0; l < g.L; ++l) srcs.push_back(slices[g.at[k][l]].data());
      std::vector<float> pk(count);
      if (k == g.k0) {
        for (size_t i = 0; i < count; ++i) {
          float s = Bf16ToFloat(srcs[0][i]);
          for (int l = 1; l < g.L; ++l) s += Bf16ToFloat(srcs[l][i]);
          pk[i] = s;
        }
      } else {
        StochasticRoundSumBf16(srcs.data(), srcs.size(), part.data(), count, o.sr_key,
                               static_cast<uint64_t>(k) * n * count + p * count);
        for (size_t i = 0; i < count; ++i) pk[i] = Bf16ToFloat(part[i]);
      }
      for (size_t i = 0; i < count; ++i) total[i] = k == 0 ? pk[i] : total[i] + pk[i];
    }
    size_t differ = 0;
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(a[i], old(i) + total[i]) << i;
      ASSERT_EQ(a[i], b[i]) << "same seed must reproduce, element " << i;
      differ += a[i] != c[i];
    }
    if (g.K > 1 && g.L > 1) {
      EXPECT_GT(differ, 0u) << "another seed should round some partial differently";
    } else {
      // One node: no partials. One member per node: a partial is one bf16 slice, exact.
      EXPECT_EQ(differ, 0u) << "nothing to round here";
    }
    ExpectCounters(*direct,
                   {3 * ReduceScatterBytes(g, count, 2, 2).intra,
                    3 * ReduceScatterBytes(g, count, 2, 2).inter, 3},
                   "bf16sr: one bf16 partial per node");
  }
}

// bf16sr on data whose partial sums are exact in bf16: stochastic rounding changes nothing, so
// the direct path (one rounded partial per node) and the ring (one rounded partial per hop)
// give the same bits, each reproducibly for its key.
TEST(DirectReduceScatter, Bf16SrEqualsRingWhenPartialsAreExact) {
  const size_t count = 501;
  for (int rpn : RanksPerNodeChoices()) {
    SCOPED_TRACE(Trace(rpn));
    auto ring = MpiCommunicator::World(rpn);
    auto direct = DirectWorld(rpn);
    const int n = direct->size(), p = direct->rank();
    DataNode& gp = RegisterBuffer(*direct, "G'", DType::kBF16, n * count);
    for (size_t j = 0; j < n * count; ++j) gp.data_as<bf16>()[j] = FloatToBf16(Small(p, j));
    ReduceScatterOptions o;
    o.partial_dtype = DType::kBF16;
    o.sr_key = SrKey{42, 3, 1};
    std::vector<float> a(count, 1.0f), b(count, 1.0f);
    direct->ReduceScatterPartials(gp.data(), DType::kBF16, a.data(), DType::kF32, count, true, o);
    ring->ReduceScatterPartials(gp.data(), DType::kBF16, b.data(), DType::kF32, count, true, o);
    for (size_t i = 0; i < count; ++i) {
      float exact = 1.0f;
      for (int r = 0; r < n; ++r) exact += Small(r, p * count + i);
      ASSERT_EQ(a[i], exact) << i;
      ASSERT_EQ(a[i], b[i]) << i;
    }
    const NodeGeometry& g = direct->geometry();
    ExpectCounters(*direct, ReduceScatterBytes(g, count, 2, 2), "bf16sr");
  }
}

// ---------------------------------------------------------------------------------------
// The one RS workspace under many back-to-back calls: data changes every iteration, ranks are
// skewed (some sleep before calling, some right after), G′ is overwritten as soon as the call
// returns (as the engine recycles it), counts vary inside the reserved size, accumulation
// alternates, bf16+fp32 iterations are mixed in. Every result is checked exactly.
TEST(DirectStress, TwoHundredBackToBackReduceScattersReuseOneWorkspace) {
  const int W = WorldSize();
  const int rpn = W % 2 == 0 && W > 2 ? W / 2 : 1;  // several nodes, several members each
  auto d = DirectWorld(rpn);
  const NodeGeometry& g = d->geometry();
  const int n = d->size(), p = d->rank();
  const size_t max_count = 300;
  d->ReserveReduceScatter(max_count);
  const size_t reserved = d->registered_bytes();
  DataNode& gp = RegisterBuffer(*d, "G'", DType::kF32, n * max_count);
  DataNode& gb = RegisterBuffer(*d, "G'bf16", DType::kBF16, n * max_count);
  auto val = [](int rank, size_t j, int it) {
    return static_cast<float>(((rank + 1) * 31 + static_cast<int>(j) * 7 + it * 13) % 61 - 30);
  };
  std::vector<float> acc(max_count, 0.0f);
  Expect want;
  for (int it = 0; it < 200; ++it) {
    const size_t count = max_count - static_cast<size_t>((it * 37) % 120);
    const bool accumulate = it % 3 != 0;
    const bool use_bf16 = it % 4 == 3;
    if (use_bf16) {
      for (size_t j = 0; j < n * count; ++j) gb.data_as<bf16>()[j] = FloatToBf16(val(p, j, it));
    } else {
      for (size_t j = 0; j < n * count; ++j) gp.data_as<float>()[j] = val(p, j, it);
    }
    if ((p + it) % 5 == 0) usleep(200);  // skew: this rank arrives late
    std::vector<float> before(acc.begin(), acc.begin() + count);
    d->ReduceScatter(use_bf16 ? gb.data() : gp.data(), use_bf16 ? DType::kBF16 : DType::kF32,
                     acc.data(), DType::kF32, count, accumulate);
    // Recycled at once: if a node peer were still reading this G′, its sum would break.
    std::fill_n(gp.data_as<float>(), n * max_count, kNaN);
    std::fill_n(gb.data_as<bf16>(), n * max_count, bf16{0x7FC0});
    for (size_t i = 0; i < count; ++i) {
      float s = 0;
      for (int r = 0; r < n; ++r) s += val(r, p * count + i, it);
      ASSERT_EQ(acc[i], (accumulate ? before[i] : 0.0f) + s) << "iteration " << it << " elem " << i;
    }
    Expect e = ReduceScatterBytes(g, count, use_bf16 ? 2 : 4, 4);
    want.intra += e.intra;
    want.inter += e.inter;
    want.calls += 1;
  }
  ExpectCounters(*d, want, "200 reduce-scatters");
  EXPECT_EQ(d->registered_bytes(), reserved + gp.root().bytes() + gb.root().bytes())
      << "the workspace must not grow within the reserved size";
}

}  // namespace
}  // namespace sshsdp
