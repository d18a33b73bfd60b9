// DirectCommunicator: the paper's "ZeroSM" communication path on CPU/MPI (paper §4.3, Fig. 5d/e,
// docs/design.md, Communication) — a second Communicator behind the same seam as MpiCommunicator,
// selectable per run (EngineConfig::comm_path, `sshsdp train --comm-path direct`).
//
// What differs from the ring collectives of MpiCommunicator:
//   * Registered symmetric allocations. Communication buffers (gather buffers W′, runtime
//     gradients G′, the reduce-scatter workspace) live in MPI windows (RmaWindow): a
//     shared-memory window within the node, the same memory exposed as an RMA window across
//     nodes. A data-tree root is registered once (Register) and bound to its window with
//     DataNode::AttachExternal; its views address regions of it — never separate
//     registrations. Payload moves one-sided: stores into a node peer's region, MPI_Put into a
//     remote peer's region; no two-sided messages, no intermediate buffers.
//   * All-gather, inter-node FIRST: each rank puts its shard into its counterparts on the other
//     nodes, then broadcasts its own and its counterparts' shards within the node through the
//     shared window. Inter-node bytes fall by the factor L (members per node) compared with an
//     intra-node gather followed by an inter-node exchange of L shards.
//   * Reduce-scatter, intra-node first: the node-local reducer of a destination (the member of
//     this node with the destination's local index) reads the node's slices of it straight
//     from the peers' G′ (shared window) and sums them in fp32; the node partial (fp32, or
//     bf16 with stochastic rounding in bf16sr mode) is put into the destination's workspace
//     — one partial per node per destination. The destination's final fp32 reduction reads
//     its node's slices and the arrived partials and accumulates straight into `recv` (the
//     persistent G′ᶻ²): no result buffer, no add pass.
//
// Geometry (checked at Create, before any collective): the group's members must be spread
// evenly over the nodes they touch: K nodes x L members, n = K·L (NodeGeometry). Member (k, l)
// is the l-th member of node k in position order; (k, l) over k are "counterparts". Positions
// may interleave nodes (ZeRO-2 groups do); nodes are consecutive blocks of the world's
// ranks_per_node ranks, so one machine can act as several nodes.
//
// Synchronization protocol of one collective (op number s, identical on every member):
//   1. Validate + rendezvous: every member gathers every member's call descriptor (kind, s,
//      count, dtypes, registered window and offset of the registered buffer, reduction mode,
//      SR key, local check result) with one small MPI_Allgather. Any mismatch (count,
//      offset, window, order of calls) or failed local check throws CommError on EVERY member,
//      naming the members and values, BEFORE any payload moves; the communicator stays usable.
//      Since each member enters only after its buffers are ready (the caller finished writing
//      G′ / acquired the gather buffer) and after it finished op s-1 (so it consumed its
//      workspace and no peer still reads its G′), the rendezvous is also the "buffers are
//      free" handshake: after it, any member may write into any other member's registered
//      region for op s.
//   2. Inter-node transfers: MPI_Put into the target's region, MPI_Win_flush (remote
//      completion), then MPI_Accumulate(MPI_REPLACE, s) into the target's arrival flag for
//      this rank's node (control window) + flush. The target polls that flag with
//      MPI_Fetch_and_op(MPI_NO_OP) on itself (atomic with the accumulate) and, once it reads
//      s, calls MPI_Win_sync before loading the data. Flush-before-flag is what makes "flag
//      seen" imply "data complete" (MPI-3 passive target; the MPI_Win_sync also reconciles
//      the public and private window copies should a library use the separate model).
//   3. Intra-node transfers: plain stores into / loads from the peer's region, then a release
//      store of s into the peer's per-source "done" flag (std::atomic_ref on the shared
//      window, bracketed by MPI_Win_sync); the peer waits with acquire loads until it reads s.
//      AG: "done" = the peer finished pushing into my gather buffer. RS: "done" = the peer
//      finished reading my G′ slices, so my G′ may be recycled when the call returns.
//   4. Reduction kernels start only when their inputs have arrived: node partials as soon as
//      the rendezvous says the node's G′ are complete; the final reduction once every remote
//      partial's arrival flag reads s. Flags hold op numbers, never reset, and a member cannot
//      start op s+1 before every member entered it, so a flag never jumps past s while someone
//      still waits for s, and no workspace slot is rewritten before it was consumed.
//   The RS workspace is ONE region (inbound partials from K-1 nodes + outbound partials to
//   K-1 nodes) reused by successive calls with non-overlapping lifetimes: calls on one
//   communicator are serialized (one thread; concurrent use is detected and refused), a call
//   returns only after its puts completed (flush) and its inbound partials were consumed, and
//   the next call's rendezvous orders every peer's next writes after that.
//   Polling loops yield (sched_yield, then short sleeps) so 8 ranks on 2 cores do not starve
//   each other; arrival polls are MPI calls, so they also drive MPI progress. A rank waiting on
//   "done" flags has already seen every arrival it needs and flushed every put it issued, so
//   no peer depends on its progress there.
//
// Bytes this rank sends (counted like MpiCommunicator: payload that leaves this rank's memory
// toward another member — pushed by this rank, or loaded by a node peer from this rank's
// shared region — split by whether that member is on this rank's node; c = count, e = element
// size of the payload dtype, pe = partial element size: 4 (fp32 partials) or 2 (bf16sr)):
//   AllGather[InPlace]  inter = (K-1)·c·e              (vs (K-1)·L·c·e gathering intra first)
//                       intra = (L-1)·K·c·e
//   ReduceScatter       inter = (K-1)·c·pe             (one partial per node per destination)
//                       intra = (n-K)·c·e_send         (slices read by this node's reducers)
//   Totals equal the ring's: (n-1)·c·e for AG, (n-1)·c·4 for RS with fp32 partials.
//   AllReduce / Exchange / Barrier run on the wrapped MpiCommunicator (its formulas).
//   n = 1 and count 0 move nothing. Each call adds 1 to calls.
//
//   auto z2 = DirectCommunicator::Create(std::move(mpi_zero2));   // collective; geometry check
//   auto root = std::make_unique<DataNode>("G'");                 // data tree of G′
//   root->AddChild("slot0", DType::kF32, {n * shard}); root->Finalize();
//   DataNode& g = z2->Register(std::move(root));                  // window + AttachExternal
//   z2->ReserveReduceScatter(shard);                              // size the one workspace
//   ... backward writes g.FindChild("slot0") ...
//   z2->ReduceScatter(g.FindChild("slot0")->data(), DType::kF32, gz2, DType::kF32, shard,
//                     /*accumulate=*/true);                       // gz2 += Σ slices
//   uint64_t inter = z2->counters().inter_node_bytes;             // == (K-1)·shard·4
//
// Device buffers (direct_device.h): Create(group, device) registers roots in device memory
// mapped by every node peer (CUDA IPC), pushes with device copies and reduces on the device,
// same protocol, same counters; one node only (K = 1, CommError otherwise, at Create).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/comm/communicator.h"
#include "sshsdp/comm/direct_device.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/rma_window.h"
#include "sshsdp/layout/data_node.h"
#include "sshsdp/numerics/stochastic_rounding.h"

namespace sshsdp {

// Reduction modes (paper §4.3), chosen per call with the seam's ReduceScatterPartials:
//   fp32       fp32 G′, fp32 node partials       (ReduceScatter, or partial_dtype kF32)
//   bf16+fp32  bf16 G′, fp32 node partials       (send dtype bf16, partial_dtype kF32)
//   bf16sr     bf16 G′, bf16 node partials stored with stochastic rounding (partial_dtype
//              kBF16): the partial of node k for element i of destination slice d is rounded
//              with the Philox draw of logical element k·(n·count) + d·count + i under
//              options.sr_key — a function of (seed, step, stream, element), so runs reproduce
//              bit for bit and resume exactly. This node's own partial is never rounded.
// The final reduction is always fp32, accumulated straight into recv.

class DirectCommunicator final : public Communicator {
 public:
  // Wraps `group` (whose ranks_per_node defines the nodes). Throws LayoutError from
  // NodeGeometry::Of before any collective when the group is not balanced over nodes, and
  // CommError when a node's ranks cannot share memory. Collective over the group otherwise.
  // With `device` (owned by the caller, outliving this and its splits and duplicates),
  // registered roots live in that device's memory (direct_device.h); the group must then lie on
  // one node (CommError otherwise).
  static std::unique_ptr<DirectCommunicator> Create(std::unique_ptr<MpiCommunicator> group,
                                                    DirectDeviceMemory* device = nullptr);
  // The geometry check alone (no MPI), for plan-time validation of a layout.
  static NodeGeometry CheckGeometry(const std::vector<int>& world_ranks, int my_position,
                                    int ranks_per_node, const std::string& who);
  ~DirectCommunicator() override;
  DirectCommunicator(const DirectCommunicator&) = delete;
  DirectCommunicator& operator=(const DirectCommunicator&) = delete;

  // Registers a finalized, unbound data-tree root: allocates root->bytes() on every member as
  // one symmetric RmaWindow and binds the root to it (AttachExternal), so all its views
  // address regions of the registered allocation. Collective; every member must register the
  // same sizes in the same order (checked). The communicator owns the root from now on and
  // watches its binding: releasing or re-binding it is a detected binding change, and the
  // next collective on its memory fails on every member with CommError naming the root.
  DataNode& Register(std::unique_ptr<DataNode> root);
  // Sizes the reduce-scatter workspace for counts up to max_count of partial_dtype (collective;
  // nothing to do on one node). A larger count later grows it collectively inside the call.
  void ReserveReduceScatter(size_t max_count, DType partial_dtype = DType::kF32);
  // Bytes of registered windows + workspace + control block on this rank.
  size_t registered_bytes() const;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int world_rank(int position) const override { return inner_->world_rank(position); }
  std::string name() const override { return "direct:" + inner_->name(); }

  // recv (size()·count elements) must lie inside one registered root's window, at the same
  // offset on every member; send (count elements) may be anywhere.
  void AllGatherInPlace(void* buf, size_t count, DType dtype) override;
  void AllGather(const void* send, void* recv, size_t count, DType dtype) override;
  // send (G′: size()·count fp32 or bf16 elements) must lie inside a registered window at the
  // same offset on every member; recv (fp32 or bf16, count elements) anywhere, not
  // overlapping send. ReduceScatter = fp32 partials.
  void ReduceScatter(const void* send, DType send_dtype, void* recv, DType recv_dtype, size_t count,
                     bool accumulate) override;
  void ReduceScatterPartials(const void* send, DType send_dtype, void* recv, DType recv_dtype,
                             size_t count, bool accumulate,
                             const ReduceScatterOptions& options) override;

  void AllReduce(void* buf, size_t count, DType dtype) override;
  void Exchange(const std::vector<P2POp>& sends, const std::vector<P2POp>& recvs) override;
  void Barrier() override;
  // Sub-groups and duplicates are DirectCommunicators with their own windows and no
  // registrations (register on them what they move).
  std::unique_ptr<Communicator> Split(int color, int key) override;
  std::unique_ptr<Communicator> Duplicate() override;

  const NodeGeometry& geometry() const { return geo_; }

 private:
  struct Registered;
  struct Descriptor;
  struct Resolved {
    Registered* reg = nullptr;
    size_t offset = 0;
  };
  DirectCommunicator(std::unique_ptr<MpiCommunicator> group, NodeGeometry geo,
                     DirectDeviceMemory* device);
  // Whether [p, p + bytes) must be staged through host memory for MPI (device mode).
  bool OnDevice(const void* p, size_t bytes) const;

  // Finds the registered window holding [p, p + n) (or explains why none does).
  int Resolve(const void* p, size_t n, const char* what, Resolved* out, std::string* error) const;
  // Step 1 of the protocol: all-gathers descriptors and throws on any mismatch.
  void Rendezvous(Descriptor& mine, const std::string& where, const std::string& local_error);
  void GrowWorkspace(size_t slot_bytes);

  // Control-block flags.
  uint64_t* DoneFlag(int owner_l, int from_l) const;  // in node peer owner_l's block
  void SignalArrival(int target_position, uint64_t s);
  bool ArrivalSeen(int k, uint64_t s);
  void SignalDone(uint64_t s);  // to every node peer
  void WaitDone(uint64_t s, const char* op);
  void WaitArrivals(uint64_t s, const char* op);

  void DoAllGather(const char* own, char* recv, const Resolved& r, size_t count, size_t e,
                   bool in_place, uint64_t s);
  void DoReduceScatter(const Resolved& r, const char* send, DType send_dtype, void* recv,
                       DType recv_dtype, size_t count, bool accumulate,
                       const ReduceScatterOptions& o, uint64_t s);
  void CountTo(int position, uint64_t bytes);

  std::unique_ptr<MpiCommunicator> inner_;
  NodeGeometry geo_;
  DirectDeviceMemory* device_ = nullptr;  // null: host memory
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  std::unique_ptr<RmaWindow> control_;
  std::vector<std::unique_ptr<Registered>> registered_;
  std::unique_ptr<RmaWindow> workspace_;
  size_t workspace_slot_ = 0;  // bytes of one partial slot
  uint64_t seq_ = 0;           // op number, identical on every member
  std::atomic<bool> busy_{false};
};

// A registered root cut into `slots` equal regions of slot_bytes (rounded up to 64), handed
// out lowest-free-first. Every member runs the same acquire/release sequence (the engine's
// schedule is the same on every rank), so every member takes the same slot — the symmetric
// offset the collectives check (a divergence is caught there, before any transfer).
//
//   RegisteredSlots gather(*z3, "zero3.gather", max_layer_bytes, /*slots=*/2);   // collective
//   void* w = gather.Acquire();        // a region of the registered root
//   w_full->AttachExternal(w, bytes);  // the layer's data tree binds to it
//   z3->AllGather(w_z3, w, shard, DType::kBF16);
//   w_full->Release(); gather.Release(w);
class RegisteredSlots {
 public:
  RegisteredSlots(DirectCommunicator& comm, const std::string& name, size_t slot_bytes, int slots);
  // Throws CommError naming the root when every slot is in use.
  void* Acquire();
  // Throws CommError unless p was acquired here and not released since.
  void Release(void* p);
  size_t slot_bytes() const { return slot_bytes_; }

 private:
  std::string name_;
  size_t slot_bytes_ = 0;
  DataNode* root_ = nullptr;
  std::vector<void*> ptrs_;
  std::vector<bool> used_;
};

}  // namespace sshsdp
