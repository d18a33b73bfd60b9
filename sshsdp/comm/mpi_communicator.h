// MpiCommunicator: the MPI backend of Communicator, with collectives written as our own ring
// algorithms over MPI point-to-point (docs/design.md, Communication).
//
// Why not MPI_Allgather / MPI_Reduce_scatter_block / MPI_Allreduce: (1) the byte counters
// must be exactly what this rank sends, split intra-/inter-node, which only an algorithm we
// own can promise; (2) the reduce-scatter must fuse the gradient accumulation into its last
// step (recv += Σ) and accept bf16 input with fp32 partials, which MPI reductions cannot.
// comm_bench compares each algorithm with the raw MPI call in the same run.
//
//   sshsdp::MpiRuntime mpi(&argc, &argv);
//   auto world = sshsdp::MpiCommunicator::World(/*ranks_per_node=*/2);
//   auto z3 = world->Split(topo.GroupColor(Group::kZero3, r),
//                          topo.GroupPosition(Group::kZero3, r));
//   z3->AllGatherInPlace(buf, shard, DType::kBF16);  // input at buf + z3->rank()*shard
//   z2->ReduceScatter(g, DType::kBF16, acc, DType::kF32, shard, /*accumulate=*/true);
//   uint64_t sent = world->counters().inter_node_bytes;  // exact, see below
//
// Algorithms and the bytes this rank sends (n = size(), e = DTypeSize, all sends go to the
// ring successor, position (rank()+1) % n, and are counted as intra-node when its world rank
// lies on this rank's node (world_rank / ranks_per_node equal), inter-node otherwise):
//   AllGather[InPlace]  ring, n-1 steps; step s sends chunk (p-s) mod n.
//                       bytes = (n-1) * count * e
//   ReduceScatter       ring, n-1 steps; step s sends the fp32 partial of chunk (p-s-1) mod n,
//                       receives that of chunk (p-s-2) mod n and adds the local slice in fp32;
//                       the last step adds the received partial and the local slice straight
//                       into recv (accumulate: recv += total; else recv = total).
//                       bytes = (n-1) * count * 4            (fp32 partials, any send dtype)
//   AllReduce           ring reduce-scatter then ring all-gather over n chunks of
//                       c_j = count/n + (j < count%n) elements (uneven when n ∤ count).
//                       bytes = 4 * (count - c_p) + e * (count - c_{(p+1) mod n})
//                             = (n-1)/n * count * (4 + e)    when n | count
//   Exchange            bytes = Σ sends[i].bytes, each by its peer's node.
//   Barrier, Split, Duplicate: no payload bytes.
// Count 0 and n = 1 send nothing. Each data-moving call and each Barrier adds 1 to calls.
//
// One MpiCommunicator must be used by one thread at a time, and collectives on it issued in
// the same order on every member; a communication thread gets its own via Duplicate().
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/comm/communicator.h"

namespace sshsdp {

class MpiCommunicator final : public Communicator {
 public:
  // Tags of Exchange messages must lie in [0, kMaxUserTag]; the tags above it (up to 32767,
  // the smallest MPI_TAG_UB the standard allows) are reserved for the ring collectives.
  static constexpr int kMaxUserTag = 32767 - 16;
  // Default cap on one MPI message; larger transfers are split (MPI counts are ints).
  static constexpr size_t kDefaultMaxMessageBytes = size_t{1} << 30;

  // All ranks of MPI_COMM_WORLD (a duplicate, so sshsdp traffic has its own message space),
  // ordered by world rank. `ranks_per_node` consecutive world ranks form one (possibly
  // simulated) node; it must divide the world size, else CommError. Collective over the world.
  static std::unique_ptr<MpiCommunicator> World(int ranks_per_node);

  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  int world_rank(int position) const override;
  std::string name() const override;

  void AllGatherInPlace(void* buf, size_t count, DType dtype) override;
  void AllGather(const void* send, void* recv, size_t count, DType dtype) override;
  void ReduceScatter(const void* send, DType send_dtype, void* recv, DType recv_dtype, size_t count,
                     bool accumulate) override;
  void ReduceScatterPartials(const void* send, DType send_dtype, void* recv, DType recv_dtype,
                             size_t count, bool accumulate,
                             const ReduceScatterOptions& options) override;
  void AllReduce(void* buf, size_t count, DType dtype) override;
  // Messages between the same pair with the same tag are matched in list order. A receive
  // must name exactly the size of the matching send: a shorter send is a CommError on the
  // receiver; a longer one is MPI's truncation error (undefined after it, as in MPI).
  // Messages to self are allowed and counted as intra-node bytes.
  void Exchange(const std::vector<P2POp>& sends, const std::vector<P2POp>& recvs) override;
  void Barrier() override;
  // color >= 0; members ordered by key (ties by rank in this group).
  std::unique_ptr<Communicator> Split(int color, int key) override;
  std::unique_ptr<Communicator> Duplicate() override;

  // Label used in name(), e.g. "zero3" gives "zero3{0,1}". Splits start as "split".
  void set_label(std::string label) { label_ = std::move(label); }
  int ranks_per_node() const { return ranks_per_node_; }
  // Whether the member at `position` lies on this rank's node.
  bool SameNode(int position) const;
  // Splits every transfer into MPI messages of at most this many bytes (tests lower it to
  // exercise the splitting that messages over INT_MAX bytes need). Must be in [1, INT_MAX].
  void set_max_message_bytes(size_t bytes);
  // The underlying MPI communicator (benchmarks compare against raw MPI calls on it).
  MPI_Comm handle() const { return comm_; }

 private:
  MpiCommunicator(MPI_Comm comm, int ranks_per_node, std::string label);

  struct Chunks;  // how a collective's buffer is cut into n chunks
  // Ring all-gather, in place, of chunks (in bytes) of `buf`.
  void RingAllGather(char* buf, const Chunks& bytes, const char* op);
  // Ring reduce-scatter of the chunks (elements) of `in`; the total of chunk rank() goes to
  // `out` (+= when accumulate).
  void RingReduceScatter(const void* in, DType in_dtype, const Chunks& elems, void* out,
                         DType out_dtype, bool accumulate, const char* op,
                         const ReduceScatterOptions* options = nullptr);
  // One ring step: send `send_bytes` to the successor while receiving `recv_bytes` from the
  // predecessor, split into messages of at most max_message_bytes_.
  void RingStep(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, int tag,
                const char* op);
  void CountSend(int position, size_t bytes);
  void Check(int rc, const char* op, const char* mpi_call) const;
  std::unique_ptr<MpiCommunicator> Adopt(MPI_Comm comm, const char* label) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int ranks_per_node_ = 1;
  std::vector<int> world_ranks_;  // world rank of every member, by position
  std::string label_;
  size_t max_message_bytes_ = kDefaultMaxMessageBytes;
  std::vector<float> scratch_;   // two fp32 chunk buffers for reduce-scatter partials
  std::vector<bf16> scratch16_;  // two bf16 chunk buffers (bf16 + SR partials)
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
};

}  // namespace sshsdp
