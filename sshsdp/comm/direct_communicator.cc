// DirectCommunicator: construction, registration, the validate-and-rendezvous step, the flag
// protocol, byte counting and the delegated calls — the plumbing both collectives share; they
// live in direct_all_gather.cc and direct_reduce_scatter.cc (see direct_communicator.h).
#include "sshsdp/comm/direct_communicator.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/direct_internal.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/watchdog.h"

namespace sshsdp {

using namespace direct_internal;

namespace {

constexpr size_t kFlagStride = 64;  // one cache line per flag: no false sharing

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free,
              "intra-node flags need lock-free 64-bit atomics on shared memory");

const char* FieldName(int f) {
  static const char* names[] = {"collective",        "call number",   "count",    "dtype",
                                "registered window", "window offset", "partials", "SR seed",
                                "SR step",           "SR stream",     "error"};
  return names[f];
}

std::unique_ptr<MpiCommunicator> AsMpi(std::unique_ptr<Communicator> c, const std::string& who) {
  auto* m = dynamic_cast<MpiCommunicator*>(c.get());
  SSHSDP_CHECK(m != nullptr, CommError, "{}: the direct path runs on MpiCommunicator groups", who);
  c.release();
  return std::unique_ptr<MpiCommunicator>(m);
}

}  // namespace

NodeGeometry DirectCommunicator::CheckGeometry(const std::vector<int>& world_ranks, int my_position,
                                               int ranks_per_node, const std::string& who) {
  return NodeGeometry::Of(world_ranks, my_position, ranks_per_node, who);
}

std::unique_ptr<DirectCommunicator> DirectCommunicator::Create(
    std::unique_ptr<MpiCommunicator> group, DirectDeviceMemory* device) {
  SSHSDP_CHECK(group != nullptr, CommError, "DirectCommunicator::Create: null group");
  std::vector<int> world_ranks(group->size());
  for (int i = 0; i < group->size(); ++i) world_ranks[i] = group->world_rank(i);
  NodeGeometry geo =
      CheckGeometry(world_ranks, group->rank(), group->ranks_per_node(), group->name());
  SSHSDP_CHECK(device == nullptr || geo.K == 1, CommError,
               "{}: device buffers ({}) on the direct path need every member on one node, but "
               "the group spans {} nodes of {} ranks; across nodes use the NCCL communicator",
               group->name(), device ? device->name() : "", geo.K, geo.ranks_per_node);
  return std::unique_ptr<DirectCommunicator>(new DirectCommunicator(std::move(group), geo, device));
}

DirectCommunicator::DirectCommunicator(std::unique_ptr<MpiCommunicator> group, NodeGeometry geo,
                                       DirectDeviceMemory* device)
    : inner_(std::move(group)), geo_(std::move(geo)), device_(device) {
  const std::string who = name();
  CheckMpi(MPI_Comm_split(inner_->handle(), geo_.k0, geo_.l0, &node_comm_),
           who + ": MPI_Comm_split by node");
  // A (simulated) node must lie inside one shared-memory domain.
  MPI_Comm shared = MPI_COMM_NULL;
  CheckMpi(MPI_Comm_split_type(node_comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared),
           who + ": MPI_Comm_split_type");
  int shared_size = 0;
  MPI_Comm_size(shared, &shared_size);
  MPI_Comm_free(&shared);
  int ok = shared_size == geo_.L ? 1 : 0, all_ok = 0;
  CheckMpi(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, inner_->handle()),
           who + ": MPI_Allreduce");
  SSHSDP_CHECK(all_ok, CommError,
               "{}: with ranks_per_node={} the {} members of a node do not all share memory (this "
               "rank's node: {} of {}); the direct path needs every (simulated) node inside one "
               "machine — lower ranks_per_node or use comm_path=collective",
               who, geo_.ranks_per_node, geo_.L, shared_size, geo_.L);
  control_ =
      std::make_unique<RmaWindow>(inner_->name() + ".control", kFlagStride * (geo_.K + geo_.L),
                                  node_comm_, geo_.K > 1 ? inner_->handle() : MPI_COMM_NULL, geo_);
}

DirectCommunicator::~DirectCommunicator() {
  for (auto& r : registered_) {
    try {
      if (r->root->bound()) r->root->Release();
    } catch (...) {
    }
  }
  // Window frees are collective: every member destroys in the same order.
  workspace_.reset();
  for (auto& r : registered_) {
    r->window.reset();
    if (!r->device.empty()) {
      device_->CloseRegions(r->device, geo_.l0, [this] { MPI_Barrier(node_comm_); });
    }
  }
  control_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (node_comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&node_comm_);
}

DataNode& DirectCommunicator::Register(std::unique_ptr<DataNode> root) {
  const std::string where = "Register on " + name();
  SSHSDP_CHECK(root != nullptr, CommError, "{}: null data tree", where);
  SSHSDP_CHECK(root->is_root() && root->finalized() && !root->bound(), CommError,
               "{}: '{}' must be a finalized, unbound data-tree root (the window provides its "
               "memory)",
               where, root->name());
  // Symmetric: every member registers the same size here (and so the same windows in order).
  const int n = size();
  uint64_t mine = root->bytes();
  std::vector<uint64_t> all(n);
  CheckMpi(MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, inner_->handle()),
           where + ": MPI_Allgather");
  for (int q = 0; q < n; ++q) {
    SSHSDP_CHECK(all[q] == all[0], CommError,
                 "{}: registered allocations must be symmetric, but position 0 (world rank {}) "
                 "registers {} bytes as window #{} and position {} (world rank {}) {} bytes",
                 where, world_rank(0), all[0], registered_.size(), q, world_rank(q), all[q]);
  }
  auto reg = std::make_unique<Registered>();
  reg->id = static_cast<int>(registered_.size());
  reg->l0 = geo_.l0;
  if (device_) {
    reg->bytes = (root->bytes() + 63) / 64 * 64;
    MPI_Comm node = node_comm_;
    reg->device = device_->OpenRegions(
        reg->bytes, geo_.l0, geo_.L,
        [this, node, where](const void* mine, void* all, size_t bytes) {
          WaitScope watched("direct-path registration (device memory handles)", name());
          CheckMpi(MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all,
                                 static_cast<int>(bytes), MPI_BYTE, node),
                   where + ": MPI_Allgather of device memory handles");
        });
  } else {
    reg->window = std::make_unique<RmaWindow>(root->name(), root->bytes(), node_comm_,
                                              geo_.K > 1 ? inner_->handle() : MPI_COMM_NULL, geo_);
    reg->bytes = reg->window->bytes();
  }
  std::shared_ptr<std::atomic<void*>> bound = reg->bound;
  root->OnBind([bound](void* p) { bound->store(p); });
  root->AttachExternal(reg->base(), reg->bytes);
  reg->root = std::move(root);
  registered_.push_back(std::move(reg));
  return *registered_.back()->root;
}

void DirectCommunicator::ReserveReduceScatter(size_t max_count, DType partial_dtype) {
  if (geo_.K == 1) return;
  SSHSDP_CHECK(partial_dtype == DType::kF32 || partial_dtype == DType::kBF16, CommError,
               "ReserveReduceScatter on {}: partials are fp32 or bf16, not {}", name(),
               DTypeName(partial_dtype));
  const size_t pe = DTypeSize(partial_dtype);
  SSHSDP_CHECK(max_count <= std::numeric_limits<size_t>::max() / (2 * geo_.K * pe), CommError,
               "ReserveReduceScatter on {}: count {} overflows", name(), max_count);
  int64_t want = static_cast<int64_t>(max_count * pe), lo = 0, hi = 0;
  CheckMpi(MPI_Allreduce(&want, &lo, 1, MPI_INT64_T, MPI_MIN, inner_->handle()),
           "ReserveReduceScatter: MPI_Allreduce");
  CheckMpi(MPI_Allreduce(&want, &hi, 1, MPI_INT64_T, MPI_MAX, inner_->handle()),
           "ReserveReduceScatter: MPI_Allreduce");
  SSHSDP_CHECK(lo == hi, CommError,
               "ReserveReduceScatter on {}: members ask for different workspace sizes ({} to {} "
               "bytes per partial); pass the same max_count everywhere",
               name(), lo, hi);
  if (static_cast<size_t>(want) > workspace_slot_) GrowWorkspace(static_cast<size_t>(want));
}

void DirectCommunicator::GrowWorkspace(size_t slot_bytes) {
  slot_bytes = (slot_bytes + 63) / 64 * 64;
  workspace_.reset();  // collective; no transfer into it is in flight (see the header)
  workspace_ = std::make_unique<RmaWindow>(inner_->name() + ".rs_workspace",
                                           2 * static_cast<size_t>(geo_.K - 1) * slot_bytes,
                                           node_comm_, inner_->handle(), geo_);
  workspace_slot_ = slot_bytes;
}

size_t DirectCommunicator::registered_bytes() const {
  size_t b = control_ ? control_->bytes() : 0;
  if (workspace_) b += workspace_->bytes();
  for (const auto& r : registered_) b += r->bytes;
  return b;
}

int DirectCommunicator::Resolve(const void* p, size_t n, const char* what, Resolved* out,
                                std::string* error) const {
  for (const auto& r : registered_) {
    size_t off = 0;
    if (!r->Contains(p, n, &off)) continue;
    void* now = r->bound->load();
    if (now != r->base()) {
      *error = fmt::format(
          "{} lies in the window of registered root '{}', but that root is now {} (window base "
          "{}): a detected binding change — a registered root must stay bound to its window "
          "while the communicator uses it",
          what, r->root->name(), now ? fmt::format("bound at {}", now) : std::string("released"),
          static_cast<void*>(r->base()));
      return 1;
    }
    out->reg = r.get();
    out->offset = off;
    return 0;
  }
  std::string known;
  for (const auto& r : registered_) {
    const auto b = reinterpret_cast<uintptr_t>(r->base());
    const auto u = reinterpret_cast<uintptr_t>(p);
    void* now = r->bound->load();
    if (now && now != r->base()) {
      const auto nb = reinterpret_cast<uintptr_t>(now);
      if (u >= nb && u < nb + r->root->bytes()) {
        *error = fmt::format(
            "{} ({} bytes at {}) belongs to registered root '{}', whose binding changed from "
            "its window at {} to {}: a detected binding change — registered bases must stay "
            "stable",
            what, n, p, r->root->name(), static_cast<void*>(r->base()), now);
        return 1;
      }
    }
    if (u >= b && u < b + r->bytes) {
      *error = fmt::format(
          "{} ({} bytes at offset {}) extends past the end of registered window '{}' ({} bytes)",
          what, n, u - b, r->root->name(), r->bytes);
      return 1;
    }
    known += fmt::format("{}'{}' [{}, +{})", known.empty() ? "" : ", ", r->root->name(),
                         static_cast<void*>(r->base()), r->bytes);
  }
  *error = fmt::format(
      "{} ({} bytes at {}) is not inside a registered window (registered: {}); make it a view "
      "of a data-tree root registered with Register()",
      what, n, p, known.empty() ? "none" : known);
  return 1;
}

void DirectCommunicator::Rendezvous(Descriptor& mine, const std::string& where,
                                    const std::string& local_error) {
  mine.v[kError] = local_error.empty() ? 0 : 1;
  const int n = size();
  std::vector<int64_t> all(static_cast<size_t>(n) * kNumFields);
  if (n > 1) {
    WaitScope watched("direct-path rendezvous", name());
    CheckMpi(MPI_Allgather(mine.v, kNumFields, MPI_INT64_T, all.data(), kNumFields, MPI_INT64_T,
                           inner_->handle()),
             where + ": MPI_Allgather of call descriptors");
  } else {
    std::copy(mine.v, mine.v + kNumFields, all.begin());
  }
  SSHSDP_CHECK(local_error.empty(), CommError,
               "{}: {} (rejected on every member before any transfer)", where, local_error);
  auto at = [&](int q, int f) { return all[static_cast<size_t>(q) * kNumFields + f]; };
  for (int q = 0; q < n; ++q) {
    SSHSDP_CHECK(at(q, kError) == 0, CommError,
                 "{}: rejected before any transfer: position {} (world rank {}) failed its own "
                 "checks (its error names the reason)",
                 where, q, world_rank(q));
  }
  auto show = [&](int f, int64_t v) -> std::string {
    if (f == kKind)
      return v == kAllGather ? "AllGather" : v == kReduceScatter ? "ReduceScatter" : "?";
    if (f == kDtype) return std::string(DTypeName(static_cast<DType>(v)));
    if (f == kPartials) return std::string(DTypeName(static_cast<DType>(v)));
    if (f == kWindow) {
      return v >= 0 && v < static_cast<int64_t>(registered_.size())
                 ? fmt::format("#{} '{}'", v, registered_[v]->root->name())
                 : fmt::format("#{}", v);
    }
    return fmt::format("{}", v);
  };
  for (int f = 0; f < kError; ++f) {
    for (int q = 1; q < n; ++q) {
      if (at(q, f) == at(0, f)) continue;
      std::string hint = "every member must make the same call";
      if (f == kCount) hint = "the direct path needs equal shards: pass the same count everywhere";
      if (f == kOffset || f == kWindow)
        hint =
            "symmetric allocations need the buffer at the same registered window and offset "
            "on every member (register and carve regions in the same order everywhere)";
      if (f == kSeq || f == kKind)
        hint = "members issued different sequences of collectives on this communicator";
      throw CommError(fmt::format(
          "{}: rejected before any transfer: {} differs — position 0 (world rank {}) has {}, "
          "position {} (world rank {}) has {}; {}",
          where, FieldName(f), world_rank(0), show(f, at(0, f)), q, world_rank(q),
          show(f, at(q, f)), hint));
    }
  }
}

uint64_t* DirectCommunicator::DoneFlag(int owner_l, int from_l) const {
  return reinterpret_cast<uint64_t*>(control_->local_base(owner_l) +
                                     kFlagStride * (geo_.K + from_l));
}

void DirectCommunicator::SignalArrival(int target_position, uint64_t s) {
  const MPI_Aint disp = static_cast<MPI_Aint>(kFlagStride * geo_.k0);
  CheckMpi(MPI_Accumulate(&s, 1, MPI_UINT64_T, target_position, disp, 1, MPI_UINT64_T, MPI_REPLACE,
                          control_->rma()),
           name() + ": MPI_Accumulate of an arrival flag");
  control_->Flush(target_position);
}

bool DirectCommunicator::ArrivalSeen(int k, uint64_t s) {
  uint64_t dummy = 0, got = 0;
  const int me = rank();
  CheckMpi(MPI_Fetch_and_op(&dummy, &got, MPI_UINT64_T, me, static_cast<MPI_Aint>(kFlagStride * k),
                            MPI_NO_OP, control_->rma()),
           name() + ": MPI_Fetch_and_op of an arrival flag");
  control_->Flush(me);
  return got >= s;
}

void DirectCommunicator::SignalDone(uint64_t s) {
  if (geo_.L == 1) return;
  control_->Sync();
  for (int l = 0; l < geo_.L; ++l) {
    if (l == geo_.l0) continue;
    std::atomic_ref<uint64_t>(*DoneFlag(l, geo_.l0)).store(s, std::memory_order_release);
  }
}

void DirectCommunicator::WaitDone(uint64_t s, const char* op) {
  if (geo_.L == 1) return;
  Backoff backoff(fmt::format("{} on {} (op {}): waiting for node peers", op, name(), s));
  WaitScope watched("direct-path completion flags (node peers)", name());
  for (int l = 0; l < geo_.L; ++l) {
    if (l == geo_.l0) continue;
    std::atomic_ref<uint64_t> flag(*DoneFlag(geo_.l0, l));
    while (flag.load(std::memory_order_acquire) < s) backoff.Pause();
  }
  control_->Sync();
}

void DirectCommunicator::WaitArrivals(uint64_t s, const char* op) {
  if (geo_.K == 1) return;
  Backoff backoff(fmt::format("{} on {} (op {}): waiting for other nodes", op, name(), s));
  WaitScope watched("direct-path arrival flags (other nodes)", name());
  for (int k = 0; k < geo_.K; ++k) {
    if (k == geo_.k0) continue;
    while (!ArrivalSeen(k, s)) backoff.Pause();
  }
}

void DirectCommunicator::CountTo(int position, uint64_t bytes) {
  if (inner_->SameNode(position)) {
    counters_.intra_node_bytes += bytes;
  } else {
    counters_.inter_node_bytes += bytes;
  }
}

// ---------------------------------------------------------------------------------------
// Delegated calls.

bool DirectCommunicator::OnDevice(const void* p, size_t bytes) const {
  return device_ != nullptr && bytes > 0 && p != nullptr && device_->IsDeviceMemory(p, bytes);
}

// Device buffers go through host copies around MPI's call (device mode: small transfers —
// norms, update fragments).
void DirectCommunicator::AllReduce(void* buf, size_t count, DType dtype) {
  BusyGuard guard(busy_, "AllReduce on " + name());
  const CommCounters before = inner_->counters();
  const size_t bytes = count * DTypeSize(dtype);
  if (OnDevice(buf, bytes)) {
    std::vector<char> host(bytes);
    device_->ToHost(host.data(), buf, bytes);
    inner_->AllReduce(host.data(), count, dtype);
    device_->FromHost(buf, host.data(), bytes);
  } else {
    inner_->AllReduce(buf, count, dtype);
  }
  counters_ += Delta(inner_->counters(), before);
}

void DirectCommunicator::Exchange(const std::vector<P2POp>& sends,
                                  const std::vector<P2POp>& recvs) {
  BusyGuard guard(busy_, "Exchange on " + name());
  const CommCounters before = inner_->counters();
  std::vector<P2POp> s = sends, r = recvs;
  // Host copies of device buffers (moving a vector keeps its heap block: pointers stay valid).
  std::vector<std::vector<char>> staged;
  std::vector<size_t> staged_recvs;
  for (P2POp& op : s) {
    if (!OnDevice(op.data, op.bytes)) continue;
    staged.emplace_back(op.bytes);
    device_->ToHost(staged.back().data(), op.data, op.bytes);
    op.data = staged.back().data();
  }
  for (size_t i = 0; i < r.size(); ++i) {
    if (!OnDevice(r[i].data, r[i].bytes)) continue;
    staged.emplace_back(r[i].bytes);
    r[i].data = staged.back().data();
    staged_recvs.push_back(i);
  }
  inner_->Exchange(s, r);
  for (size_t i : staged_recvs) device_->FromHost(recvs[i].data, r[i].data, r[i].bytes);
  counters_ += Delta(inner_->counters(), before);
}

void DirectCommunicator::Barrier() {
  BusyGuard guard(busy_, "Barrier on " + name());
  const CommCounters before = inner_->counters();
  inner_->Barrier();
  counters_ += Delta(inner_->counters(), before);
}

std::unique_ptr<Communicator> DirectCommunicator::Split(int color, int key) {
  BusyGuard guard(busy_, "Split on " + name());
  return Create(AsMpi(inner_->Split(color, key), name()), device_);
}

std::unique_ptr<Communicator> DirectCommunicator::Duplicate() {
  BusyGuard guard(busy_, "Duplicate on " + name());
  return Create(AsMpi(inner_->Duplicate(), name()), device_);
}

}  // namespace sshsdp
