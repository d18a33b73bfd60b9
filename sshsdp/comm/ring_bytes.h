// Ring byte accounting: the bytes one position of MpiCommunicator's ring collectives sends,
// all of them to its successor (position + 1 mod n). MpiCommunicator counts its traffic with
// these functions, and engine/plan.h predicts a step's traffic with the same ones, so a plan's
// bytes and a run's counters cannot drift apart.
//
//   RingAllGatherSendBytes(4, 1000, 2);           // 6000: three chunks of 1000 bf16
//   RingReduceScatterSendBytes(4, 1000, 4);       // 12000: three fp32 partial chunks
//   RingAllReduceSendBytes(3, /*position=*/0, 10, 4, 4);  // chunks 4,3,3: 6*4 + 7*4 = 52
#pragma once

#include <cstddef>
#include <cstdint>

namespace sshsdp {

// All-gather of `count` elements per position (even chunks): every chunk but its own, once.
inline uint64_t RingAllGatherSendBytes(int n, size_t count, size_t elem_bytes) {
  return n > 1 ? static_cast<uint64_t>(n - 1) * count * elem_bytes : 0;
}

// Reduce-scatter to `count` elements per position: n - 1 partial chunks of `partial_bytes`
// per element (fp32 partials: 4, whatever the input dtype; bf16 + SR partials: 2).
inline uint64_t RingReduceScatterSendBytes(int n, size_t count, size_t partial_bytes) {
  return n > 1 ? static_cast<uint64_t>(n - 1) * count * partial_bytes : 0;
}

// Chunk j of an all-reduce's `total` elements cut into n chunks: total / n, plus one for the
// first total % n chunks.
inline size_t RingAllReduceChunk(size_t total, int n, int j) {
  return total / n + (static_cast<size_t>(j) < total % n ? 1 : 0);
}

// All-reduce of `total` elements: its reduce-scatter sends every chunk but the position's own
// as partials (`partial_bytes` per element: 4, fp32, for fp32 and bf16 buffers alike), its
// all-gather every chunk but the successor's (`elem_bytes`, the buffer's dtype).
inline uint64_t RingAllReduceSendBytes(int n, int position, size_t total, size_t partial_bytes,
                                       size_t elem_bytes) {
  if (n <= 1) return 0;
  return static_cast<uint64_t>(total - RingAllReduceChunk(total, n, position)) * partial_bytes +
         static_cast<uint64_t>(total - RingAllReduceChunk(total, n, (position + 1) % n)) *
             elem_bytes;
}

}  // namespace sshsdp
