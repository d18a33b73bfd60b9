// Registered symmetric allocations for the direct-transfer path (paper §4.3 "ZeroSM P2P",
// docs/design.md, Communication): the node geometry of a group and one MPI window pair over it.
//
// Why: the direct path moves payload one-sided — stores into a node peer's memory and
// MPI_Put into a remote peer's memory — which needs the destination to be memory every
// member can address. An RmaWindow is one such allocation, the same size on every member
// ("symmetric"): an MPI_Win_allocate_shared window over the members of this rank's node
// (direct load/store into any node peer's region) whose memory is ALSO exposed as an
// MPI_Win_create window over the whole group (one-sided MPI_Put/MPI_Accumulate across
// nodes). Nodes are consecutive blocks of ranks_per_node world ranks, so one machine can act
// as several nodes; the shared window then simply never spans a simulated node boundary.
//
// NodeGeometry cuts a group into the nodes it touches. The direct path needs every touched
// node to hold the same number L of members ("balanced"): member (k, l) = the l-th member of
// node k in position order, and (k, l) for fixed l across nodes are "counterparts".
//
//   NodeGeometry geo = NodeGeometry::Of(world_ranks, my_position, ranks_per_node, "zero3{...}");
//   // geo.K nodes x geo.L members; geo.at[k][l] = position; geo.k0/geo.l0 = mine
//   RmaWindow win("zero3.gather", bytes, node_comm, group_comm, geo);   // collective
//   std::memcpy(win.local_base(l) + off, src, n);      // store into node peer l's region
//   win.Put(src, n, /*target_position=*/p, off);       // one-sided into a remote peer
//   win.Flush(p);                                      // remote completion
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace sshsdp {

// OpenMPI 4.1's osc/rdma names the shared backing file of an MPI_Win_create window after
// (hostname, job id, communicator id) only. Disjoint groups on one machine that create windows
// at the same time usually get the same communicator id, and their files collide (MPI_ERR_WIN
// or, worse, two windows mapping one file). Giving each process its own backing directory
// (OMPI_MCA_osc_rdma_backing_directory, read at MPI_Init) makes the names unique. MpiRuntime
// calls this before MPI_Init; it keeps a directory the user chose. The directory stays empty
// (osc/rdma unlinks each file once the node's ranks attached); the cleanup removes it, and
// the next start sweeps empty ones of processes that died.
void PrepareRmaBeforeMpiInit();
void CleanupRmaAfterMpiFinalize();

struct NodeGeometry {
  int n = 1;                           // members of the group
  int K = 1;                           // nodes the group touches
  int L = 1;                           // members on each touched node
  int k0 = 0, l0 = 0;                  // this rank's node index and place on its node
  int ranks_per_node = 1;              // of the world
  std::vector<int> node_id;            // world node id of node index k (ascending)
  std::vector<int> node_of, local_of;  // by position
  std::vector<std::vector<int>> at;    // at[k][l] = position of member l of node k

  // The geometry of a group whose member at position i has world rank world_ranks[i].
  // Throws LayoutError naming the group `who`, the nodes and their member counts unless
  // ranks_per_node > 0 and every node the group touches holds the same number of members.
  static NodeGeometry Of(const std::vector<int>& world_ranks, int my_position, int ranks_per_node,
                         const std::string& who);
};

// One symmetric allocation: `bytes` per member, 64-byte aligned, zero-filled.
class RmaWindow {
 public:
  // Collective over node_comm (the members of this rank's node, ordered by local index) and,
  // unless it is MPI_COMM_NULL, group_comm (all members, ordered by position: the RMA window
  // exists only when the group spans several nodes). Every member must pass the same bytes.
  RmaWindow(std::string name, size_t bytes, MPI_Comm node_comm, MPI_Comm group_comm,
            const NodeGeometry& geo);
  ~RmaWindow();
  RmaWindow(const RmaWindow&) = delete;
  RmaWindow& operator=(const RmaWindow&) = delete;

  size_t bytes() const { return bytes_; }
  char* base() const { return local_bases_[geo_l0_]; }
  // Base of node peer l's region, addressable by load/store from this process.
  char* local_base(int l) const { return local_bases_[l]; }
  MPI_Win rma() const { return rma_; }
  // Whether [p, p + n) lies inside this rank's region; *offset = p - base().
  bool Contains(const void* p, size_t n, size_t* offset) const;

  // One-sided put of n bytes at `src` into member `target_position`'s region at byte
  // `offset` (split into messages of at most 1 GiB). Completes at the target after Flush.
  void Put(const void* src, size_t n, int target_position, size_t offset) const;
  void Flush(int target_position) const;
  // Memory barrier between this process's loads/stores and RMA/peer accesses of the window
  // (MPI_Win_sync on both windows).
  void Sync() const;

 private:
  std::string name_;
  size_t bytes_ = 0;
  int geo_l0_ = 0;
  MPI_Win shm_ = MPI_WIN_NULL;
  MPI_Win rma_ = MPI_WIN_NULL;
  std::vector<char*> local_bases_;  // by node-local index
  int uncaught_at_construction_ = std::uncaught_exceptions();
};

}  // namespace sshsdp
