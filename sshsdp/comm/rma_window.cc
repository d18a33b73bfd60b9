// NodeGeometry (balanced node split of a group) and RmaWindow (shared-memory window within
// the node + RMA window across nodes on the same memory).
#include "sshsdp/comm/rma_window.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_runtime.h"

namespace sshsdp {

namespace {

constexpr size_t kAlign = 64;
constexpr size_t kMaxPutBytes = size_t{1} << 30;  // MPI counts are ints

char* AlignUp(void* p) {
  auto u = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<char*>((u + kAlign - 1) / kAlign * kAlign);
}

std::string Positions(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? "," : "", v[i]);
  return s;
}

std::string& OscBackingDir() {
  static std::string dir;
  return dir;
}

constexpr const char* kOscDirPrefix = "sshsdp-osc.";

}  // namespace

void PrepareRmaBeforeMpiInit() {
  if (std::getenv("OMPI_MCA_osc_rdma_backing_directory") != nullptr) return;
  const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  // Sweep the (empty) directories of this user's processes that no longer exist.
  if (DIR* d = opendir(base)) {
    const size_t plen = std::strlen(kOscDirPrefix);
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, kOscDirPrefix, plen) != 0) continue;
      const long pid = std::strtol(e->d_name + plen, nullptr, 10);
      const std::string path = fmt::format("{}/{}", base, e->d_name);
      struct stat st {};
      if (pid <= 0 || stat(path.c_str(), &st) != 0 || st.st_uid != getuid()) continue;
      if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) rmdir(path.c_str());
    }
    closedir(d);
  }
  const std::string dir = fmt::format("{}/{}{}", base, kOscDirPrefix, getpid());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return;  // keep MPI's default
  setenv("OMPI_MCA_osc_rdma_backing_directory", dir.c_str(), 1);
  OscBackingDir() = dir;
}

void CleanupRmaAfterMpiFinalize() {
  if (OscBackingDir().empty()) return;
  rmdir(OscBackingDir().c_str());
  OscBackingDir().clear();
}

NodeGeometry NodeGeometry::Of(const std::vector<int>& world_ranks, int my_position,
                              int ranks_per_node, const std::string& who) {
  SSHSDP_CHECK(ranks_per_node > 0, LayoutError, "{}: ranks_per_node must be positive, got {}", who,
               ranks_per_node);
  SSHSDP_CHECK(!world_ranks.empty() && my_position >= 0 &&
                   my_position < static_cast<int>(world_ranks.size()),
               LayoutError, "{}: position {} is outside the group of {}", who, my_position,
               world_ranks.size());
  std::map<int, std::vector<int>> by_node;  // world node id -> positions, ascending
  for (size_t p = 0; p < world_ranks.size(); ++p)
    by_node[world_ranks[p] / ranks_per_node].push_back(static_cast<int>(p));
  const auto& first = *by_node.begin();
  for (const auto& [node, members] : by_node) {
    SSHSDP_CHECK(members.size() == first.second.size(), LayoutError,
                 "{}: the direct-transfer path needs the group's members spread evenly over the "
                 "nodes it touches (balanced, node-major), but with ranks_per_node={} node {} "
                 "holds {} of them (positions {}) and node {} holds {} (positions {}); choose "
                 "ranks_per_node and degrees so that every node holds the same number of this "
                 "group's {} members, or use comm_path=collective",
                 who, ranks_per_node, first.first, first.second.size(), Positions(first.second),
                 node, members.size(), Positions(members), world_ranks.size());
  }
  NodeGeometry g;
  g.n = static_cast<int>(world_ranks.size());
  g.K = static_cast<int>(by_node.size());
  g.L = static_cast<int>(first.second.size());
  g.ranks_per_node = ranks_per_node;
  g.node_of.assign(g.n, 0);
  g.local_of.assign(g.n, 0);
  int k = 0;
  for (const auto& [node, members] : by_node) {
    g.node_id.push_back(node);
    g.at.push_back(members);
    for (int l = 0; l < g.L; ++l) {
      g.node_of[members[l]] = k;
      g.local_of[members[l]] = l;
    }
    ++k;
  }
  g.k0 = g.node_of[my_position];
  g.l0 = g.local_of[my_position];
  return g;
}

RmaWindow::RmaWindow(std::string name, size_t bytes, MPI_Comm node_comm, MPI_Comm group_comm,
                     const NodeGeometry& geo)
    : name_(std::move(name)), bytes_(bytes), geo_l0_(geo.l0) {
  const std::string what = "registering window '" + name_ + "'";
  // Room to align the region to 64 bytes (the segment itself is only 8-byte aligned).
  const size_t alloc = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign + kAlign;
  MPI_Info info;
  CheckMpi(MPI_Info_create(&info), what + ": MPI_Info_create");
  // Each rank's segment on its own pages: first touch by the owner keeps it local.
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  void* raw = nullptr;
  int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(alloc), 1, info, node_comm, &raw, &shm_);
  if (rc != MPI_SUCCESS) MPI_Info_free(&info);
  CheckMpi(rc, what + ": MPI_Win_allocate_shared");
  MPI_Win_set_errhandler(shm_, MPI_ERRORS_RETURN);
  CheckMpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, shm_), what + ": MPI_Win_lock_all (shared)");
  int node_size = 0;
  MPI_Comm_size(node_comm, &node_size);
  local_bases_.resize(node_size);
  for (int l = 0; l < node_size; ++l) {
    MPI_Aint size = 0;
    int disp = 0;
    void* p = nullptr;
    CheckMpi(MPI_Win_shared_query(shm_, l, &size, &disp, &p), what + ": MPI_Win_shared_query");
    // Shared segments are page-aligned in every process, so aligning the peer's address here
    // lands on the same byte the peer aligned its own base to.
    local_bases_[l] = AlignUp(p);
  }
  std::memset(base(), 0, std::max<size_t>(bytes, 1));
  if (group_comm != MPI_COMM_NULL) {
    rc = MPI_Win_create(base(), static_cast<MPI_Aint>(bytes), 1, info, group_comm, &rma_);
    MPI_Info_free(&info);
    CheckMpi(rc, what + ": MPI_Win_create");
    MPI_Win_set_errhandler(rma_, MPI_ERRORS_RETURN);
    CheckMpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, rma_), what + ": MPI_Win_lock_all");
  } else {
    MPI_Info_free(&info);
  }
}

RmaWindow::~RmaWindow() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // MPI_Win_free waits for every member; during exception unwinding on this rank the others
  // are in their next rendezvous and never arrive. Leave the windows to the job's abort.
  if (std::uncaught_exceptions() > uncaught_at_construction_) return;
  if (rma_ != MPI_WIN_NULL) {
    MPI_Win_unlock_all(rma_);
    MPI_Win_free(&rma_);
  }
  if (shm_ != MPI_WIN_NULL) {
    MPI_Win_unlock_all(shm_);
    MPI_Win_free(&shm_);
  }
}

bool RmaWindow::Contains(const void* p, size_t n, size_t* offset) const {
  const auto b = reinterpret_cast<uintptr_t>(base());
  const auto u = reinterpret_cast<uintptr_t>(p);
  if (u < b || u - b > bytes_ || n > bytes_ - (u - b)) return false;
  if (offset) *offset = u - b;
  return true;
}

void RmaWindow::Put(const void* src, size_t n, int target_position, size_t offset) const {
  const auto* s = static_cast<const char*>(src);
  for (size_t off = 0; off < n; off += kMaxPutBytes) {
    const int len = static_cast<int>(std::min(kMaxPutBytes, n - off));
    CheckMpi(MPI_Put(s + off, len, MPI_BYTE, target_position, static_cast<MPI_Aint>(offset + off),
                     len, MPI_BYTE, rma_),
             fmt::format("MPI_Put of {} bytes into window '{}' of position {} at offset {}", len,
                         name_, target_position, offset + off));
  }
}

void RmaWindow::Flush(int target_position) const {
  CheckMpi(MPI_Win_flush(target_position, rma_),
           fmt::format("MPI_Win_flush of window '{}' to position {}", name_, target_position));
}

void RmaWindow::Sync() const {
  CheckMpi(MPI_Win_sync(shm_), "MPI_Win_sync (shared window '" + name_ + "')");
  if (rma_ != MPI_WIN_NULL) CheckMpi(MPI_Win_sync(rma_), "MPI_Win_sync (window '" + name_ + "')");
}

}  // namespace sshsdp
