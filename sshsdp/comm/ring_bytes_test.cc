// Ring byte accounting (ring_bytes.h) on exact integers: world sizes 1..8 and element counts
// 0, 1, odd and uneven against a chunk-by-chunk walk of the ring's steps written out here, the
// all-reduce's uneven chunks included. MpiCommunicator counts with these functions, and
// comm_mpi_collectives_test checks its counters against real transfers.
#include "sshsdp/comm/ring_bytes.h"

#include <gtest/gtest.h>

#include <vector>

namespace sshsdp {
namespace {

// Chunk sizes of `total` elements over n ranks, the first total % n one larger.
std::vector<size_t> Chunks(size_t total, int n) {
  std::vector<size_t> c(n, total / n);
  for (size_t j = 0; j < total % n; ++j) c[j]++;
  return c;
}

TEST(RingBytes, EqualAWalkOfTheRingSteps) {
  for (int n = 1; n <= 8; ++n) {
    for (size_t count : {0u, 1u, 2u, 7u, 61u, 1000u}) {
      for (int p = 0; p < n; ++p) {
        SCOPED_TRACE(testing::Message() << "n=" << n << " count=" << count << " position=" << p);
        // All-gather: step s sends chunk (p - s) mod n, s = 0..n-2.
        uint64_t ag = 0, rs = 0;
        for (int s = 0; s + 1 < n; ++s) ag += count * 2;  // bf16 chunks
        EXPECT_EQ(RingAllGatherSendBytes(n, count, 2), ag);
        // Reduce-scatter: step s sends the partial of chunk (p - 1 - s) mod n.
        for (int s = 0; s + 1 < n; ++s) rs += count * 4;
        EXPECT_EQ(RingReduceScatterSendBytes(n, count, 4), rs);
        // All-reduce of `count` elements in uneven chunks: fp32 partials of every chunk but
        // p's own, then bf16 values of every chunk but (p + 1)'s.
        const std::vector<size_t> c = Chunks(count, n);
        uint64_t ar = 0;
        for (int s = 0; s + 1 < n; ++s) ar += c[((p - 1 - s) % n + n) % n] * 4;
        for (int s = 0; s + 1 < n; ++s) ar += c[((p - s) % n + n) % n] * 2;
        EXPECT_EQ(RingAllReduceSendBytes(n, p, count, 4, 2), ar);
        EXPECT_EQ(RingAllReduceChunk(count, n, p), c[p]);
      }
    }
  }
  EXPECT_EQ(RingAllReduceSendBytes(3, 0, 10, 4, 4), 52u);  // the header's example: 6*4 + 7*4
}

}  // namespace
}  // namespace sshsdp
