// DirectCommunicator: registration, the validate-and-rendezvous step, the inter-node-first
// all-gather, the reduce-on-arrival reduce-scatter and their flag protocol (see the header).
#include "sshsdp/comm/direct_communicator.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/watchdog.h"

namespace sshsdp {

namespace {

constexpr size_t kFlagStride = 64;  // one cache line per flag: no false sharing
constexpr size_t kBlock = 1024;     // elements per reduction block (stays in L1)
constexpr double kStallSeconds = 300;

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free,
              "intra-node flags need lock-free 64-bit atomics on shared memory");

enum Kind : int64_t { kAllGather = 1, kReduceScatter = 2 };
enum Field : int {
  kKind = 0,
  kSeq,
  kCount,
  kDtype,
  kWindow,
  kOffset,
  kPartials,
  kSrSeed,
  kSrStep,
  kSrStream,
  kError,
  kNumFields
};
const char* FieldName(int f) {
  static const char* names[] = {"collective",        "call number",   "count",    "dtype",
                                "registered window", "window offset", "partials", "SR seed",
                                "SR step",           "SR stream",     "error"};
  return names[f];
}

inline float Load(const float* p, size_t i) { return p[i]; }
inline float Load(const bf16* p, size_t i) { return Bf16ToFloat(p[i]); }
inline void Store(float* p, size_t i, float v) { p[i] = v; }
inline void Store(bf16* p, size_t i, float v) { p[i] = FloatToBf16(v); }

// dst[i] = Σ_{j<m} srcs[j][i], in the order of j, in fp32.
template <class T>
void SumSlices(const T* const* srcs, int m, float* dst, size_t n) {
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    float* d = dst + b;
    const T* s0 = srcs[0] + b;
    for (size_t i = 0; i < len; ++i) d[i] = Load(s0, i);
    for (int j = 1; j < m; ++j) {
      const T* s = srcs[j] + b;
      for (size_t i = 0; i < len; ++i) d[i] += Load(s, i);
    }
  }
}

// The destination's final reduction, one pass over out: total = Σ_k P_k in node order, where
// P_{k0} = Σ_l local[l] (this node's slices, fp32, never rounded) and P_k = remote[k] (the
// arrived node partials); out = total, or out += total.
template <class T, class P, class O>
void FinalReduce(const T* const* local, int L, const P* const* remote, int K, int k0, O* out,
                 size_t n, bool accumulate) {
  float node[kBlock], total[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    const T* s0 = local[0] + b;
    for (size_t i = 0; i < len; ++i) node[i] = Load(s0, i);
    for (int l = 1; l < L; ++l) {
      const T* s = local[l] + b;
      for (size_t i = 0; i < len; ++i) node[i] += Load(s, i);
    }
    const float* sum = node;
    if (K > 1) {
      for (int k = 0; k < K; ++k) {
        if (k == k0) {
          if (k == 0) {
            for (size_t i = 0; i < len; ++i) total[i] = node[i];
          } else {
            for (size_t i = 0; i < len; ++i) total[i] += node[i];
          }
        } else {
          const P* r = remote[k] + b;
          if (k == 0) {
            for (size_t i = 0; i < len; ++i) total[i] = Load(r, i);
          } else {
            for (size_t i = 0; i < len; ++i) total[i] += Load(r, i);
          }
        }
      }
      sum = total;
    }
    O* o = out + b;
    if (accumulate) {
      for (size_t i = 0; i < len; ++i) Store(o, i, Load(o, i) + sum[i]);
    } else {
      for (size_t i = 0; i < len; ++i) Store(o, i, sum[i]);
    }
  }
}

template <class T, class P>
void FinalReduceTo(const T* const* local, int L, const P* const* remote, int K, int k0, void* out,
                   DType out_dtype, size_t n, bool accumulate) {
  if (out_dtype == DType::kF32) {
    FinalReduce(local, L, remote, K, k0, static_cast<float*>(out), n, accumulate);
  } else {
    FinalReduce(local, L, remote, K, k0, static_cast<bf16*>(out), n, accumulate);
  }
}

template <class T>
void FinalReduceFrom(const T* const* local, int L, const void* const* remote, DType partial_dtype,
                     int K, int k0, void* out, DType out_dtype, size_t n, bool accumulate) {
  std::vector<const float*> rf(K, nullptr);
  std::vector<const bf16*> rb(K, nullptr);
  for (int k = 0; k < K; ++k) {
    rf[k] = static_cast<const float*>(remote[k]);
    rb[k] = static_cast<const bf16*>(remote[k]);
  }
  if (partial_dtype == DType::kF32) {
    FinalReduceTo(local, L, rf.data(), K, k0, out, out_dtype, n, accumulate);
  } else {
    FinalReduceTo(local, L, rb.data(), K, k0, out, out_dtype, n, accumulate);
  }
}

// Polling that lets the other ranks (and this rank's compute thread) run: sched_yield first,
// then short sleeps, so 8 ranks on 2 cores do not starve each other.
class Backoff {
 public:
  explicit Backoff(std::string what) : what_(std::move(what)) {}
  void Pause() {
    ++polls_;
    if (polls_ < 512) {
      sched_yield();
      return;
    }
    timespec ts{0, polls_ < 8192 ? 2000 : 20000};
    nanosleep(&ts, nullptr);
    if ((polls_ & 1023) == 0) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      SSHSDP_CHECK(waited < kStallSeconds, CommError,
                   "{}: no progress for {:.0f} s; a peer died or issued a different sequence of "
                   "collectives on this communicator",
                   what_, waited);
    }
  }

 private:
  std::string what_;
  uint64_t polls_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Serialization guard: one call at a time per communicator (the RS workspace and the flags
// have one owner); a concurrent call is refused instead of corrupting them.
class BusyGuard {
 public:
  BusyGuard(std::atomic<bool>& busy, const std::string& where) : busy_(busy) {
    SSHSDP_CHECK(!busy_.exchange(true), CommError,
                 "{}: called while another call on the same communicator is running; the "
                 "workspace and flags of a DirectCommunicator serve one call at a time — give "
                 "each thread its own communicator (Duplicate())",
                 where);
  }
  ~BusyGuard() { busy_.store(false); }

 private:
  std::atomic<bool>& busy_;
};

std::unique_ptr<MpiCommunicator> AsMpi(std::unique_ptr<Communicator> c, const std::string& who) {
  auto* m = dynamic_cast<MpiCommunicator*>(c.get());
  SSHSDP_CHECK(m != nullptr, CommError, "{}: the direct path runs on MpiCommunicator groups", who);
  c.release();
  return std::unique_ptr<MpiCommunicator>(m);
}

}  // namespace

struct DirectCommunicator::Descriptor {
  int64_t v[kNumFields] = {};
};

struct DirectCommunicator::Registered {
  int id = 0;
  std::unique_ptr<DataNode> root;
  std::unique_ptr<RmaWindow> window;
  // Where the root is bound now (updated by its bind callback on whichever thread binds).
  std::shared_ptr<std::atomic<void*>> bound = std::make_shared<std::atomic<void*>>(nullptr);
};

NodeGeometry DirectCommunicator::CheckGeometry(const std::vector<int>& world_ranks, int my_position,
                                               int ranks_per_node, const std::string& who) {
  return NodeGeometry::Of(world_ranks, my_position, ranks_per_node, who);
}

std::unique_ptr<DirectCommunicator> DirectCommunicator::Create(
    std::unique_ptr<MpiCommunicator> group) {
  SSHSDP_CHECK(group != nullptr, CommError, "DirectCommunicator::Create: null group");
  std::vector<int> world_ranks(group->size());
  for (int i = 0; i < group->size(); ++i) world_ranks[i] = group->world_rank(i);
  NodeGeometry geo =
      CheckGeometry(world_ranks, group->rank(), group->ranks_per_node(), group->name());
  return std::unique_ptr<DirectCommunicator>(new DirectCommunicator(std::move(group), geo));
}

DirectCommunicator::DirectCommunicator(std::unique_ptr<MpiCommunicator> group, NodeGeometry geo)
    : inner_(std::move(group)), geo_(std::move(geo)) {
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
  for (auto& r : registered_) r->window.reset();
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
  reg->window = std::make_unique<RmaWindow>(root->name(), root->bytes(), node_comm_,
                                            geo_.K > 1 ? inner_->handle() : MPI_COMM_NULL, geo_);
  std::shared_ptr<std::atomic<void*>> bound = reg->bound;
  root->OnBind([bound](void* p) { bound->store(p); });
  root->AttachExternal(reg->window->base(), reg->window->bytes());
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
  for (const auto& r : registered_) b += r->window->bytes();
  return b;
}

int DirectCommunicator::Resolve(const void* p, size_t n, const char* what, Resolved* out,
                                std::string* error) const {
  for (const auto& r : registered_) {
    size_t off = 0;
    if (!r->window->Contains(p, n, &off)) continue;
    void* now = r->bound->load();
    if (now != r->window->base()) {
      *error = fmt::format(
          "{} lies in the window of registered root '{}', but that root is now {} (window base "
          "{}): a detected binding change — a registered root must stay bound to its window "
          "while the communicator uses it",
          what, r->root->name(), now ? fmt::format("bound at {}", now) : std::string("released"),
          static_cast<void*>(r->window->base()));
      return 1;
    }
    out->reg = r.get();
    out->offset = off;
    return 0;
  }
  std::string known;
  for (const auto& r : registered_) {
    const auto b = reinterpret_cast<uintptr_t>(r->window->base());
    const auto u = reinterpret_cast<uintptr_t>(p);
    void* now = r->bound->load();
    if (now && now != r->window->base()) {
      const auto nb = reinterpret_cast<uintptr_t>(now);
      if (u >= nb && u < nb + r->root->bytes()) {
        *error = fmt::format(
            "{} ({} bytes at {}) belongs to registered root '{}', whose binding changed from "
            "its window at {} to {}: a detected binding change — registered bases must stay "
            "stable",
            what, n, p, r->root->name(), static_cast<void*>(r->window->base()), now);
        return 1;
      }
    }
    if (u >= b && u < b + r->window->bytes()) {
      *error = fmt::format(
          "{} ({} bytes at offset {}) extends past the end of registered window '{}' ({} bytes)",
          what, n, u - b, r->root->name(), r->window->bytes());
      return 1;
    }
    known += fmt::format("{}'{}' [{}, +{})", known.empty() ? "" : ", ", r->root->name(),
                         static_cast<void*>(r->window->base()), r->window->bytes());
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

uint64_t* DirectCommunicator::InterFlag(int k) const {
  return reinterpret_cast<uint64_t*>(control_->base() + kFlagStride * k);
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
// All-gather.

void DirectCommunicator::AllGatherInPlace(void* buf, size_t count, DType dtype) {
  const size_t shard = count * DTypeSize(dtype);
  const char* own = buf ? static_cast<char*>(buf) + static_cast<size_t>(rank()) * shard : nullptr;
  AllGather(own, buf, count, dtype);
}

void DirectCommunicator::AllGather(const void* send, void* recv, size_t count, DType dtype) {
  const std::string where = fmt::format("AllGather on {}", name());
  BusyGuard guard(busy_, where);
  const int n = size(), p = rank();
  const size_t e = DTypeSize(dtype);
  SSHSDP_CHECK(count <= std::numeric_limits<size_t>::max() / (static_cast<size_t>(n) * e),
               CommError, "{}: count {} overflows the address space", where, count);
  const size_t shard = count * e, total = shard * n;
  const uint64_t s = ++seq_;
  Descriptor d;
  d.v[kKind] = kAllGather;
  d.v[kSeq] = static_cast<int64_t>(s);
  d.v[kCount] = static_cast<int64_t>(count);
  d.v[kDtype] = static_cast<int64_t>(dtype);
  d.v[kWindow] = -1;
  std::string err;
  Resolved r;
  char* out = static_cast<char*>(recv);
  const bool in_place = out && send == out + static_cast<size_t>(p) * shard;
  if (count > 0) {
    if (send == nullptr || recv == nullptr) {
      err = fmt::format("send or recv is null with count {}", count);
    } else if (!in_place && Overlaps(send, shard, recv, total)) {
      err = "send overlaps recv; pass send = recv + rank()*count (in place) or disjoint buffers";
    } else if (Resolve(recv, total, "recv", &r, &err) == 0) {
      d.v[kWindow] = r.reg->id;
      d.v[kOffset] = static_cast<int64_t>(r.offset);
    }
  }
  counters_.calls++;
  Rendezvous(d, where, err);
  if (count == 0) return;
  if (!in_place) {
    std::memcpy(out + static_cast<size_t>(p) * shard, send, shard);
    counters_.local_copy_bytes += shard;
  }
  if (n == 1) return;
  DoAllGather(static_cast<const char*>(send), out, r, count, e, in_place, s);
}

void DirectCommunicator::DoAllGather(const char* own, char* recv, const Resolved& r, size_t count,
                                     size_t e, bool /*in_place*/, uint64_t s) {
  const NodeGeometry& g = geo_;
  const RmaWindow& w = *r.reg->window;
  const size_t shard = count * e;
  const int p0 = rank();
  auto at_offset = [&](int position) { return r.offset + static_cast<size_t>(position) * shard; };
  // 1. Inter-node first: this rank's shard into each counterpart on the other nodes.
  for (int k = 0; k < g.K; ++k) {
    if (k == g.k0) continue;
    const int t = g.at[k][g.l0];
    w.Put(own, shard, t, at_offset(p0));
    CountTo(t, shard);
  }
  // 2. While those fly: this rank's shard into every node peer's buffer (shared window).
  for (int l = 0; l < g.L; ++l) {
    if (l == g.l0) continue;
    std::memcpy(w.local_base(l) + at_offset(p0), own, shard);
    CountTo(g.at[g.k0][l], shard);
  }
  // 3. Remote completion, then the arrival flag (flag seen => data complete).
  for (int k = 0; k < g.K; ++k) {
    if (k == g.k0) continue;
    const int t = g.at[k][g.l0];
    w.Flush(t);
    SignalArrival(t, s);
  }
  // 4. Intra-node broadcast of the counterparts' shards, each as soon as it has arrived.
  if (g.K > 1) {
    std::vector<int> pending;
    for (int k = 0; k < g.K; ++k)
      if (k != g.k0) pending.push_back(k);
    Backoff backoff(fmt::format("AllGather on {} (op {}): waiting for other nodes", name(), s));
    while (!pending.empty()) {
      bool progressed = false;
      for (size_t i = 0; i < pending.size();) {
        const int k = pending[i];
        if (!ArrivalSeen(k, s)) {
          ++i;
          continue;
        }
        w.Sync();
        const int src = g.at[k][g.l0];
        for (int l = 0; l < g.L; ++l) {
          if (l == g.l0) continue;
          std::memcpy(w.local_base(l) + at_offset(src), recv + static_cast<size_t>(src) * shard,
                      shard);
          CountTo(g.at[g.k0][l], shard);
        }
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        progressed = true;
      }
      if (!progressed) backoff.Pause();
    }
  }
  // 5. Pushes into node peers are complete; wait until theirs into this buffer are.
  w.Sync();
  SignalDone(s);
  WaitDone(s, "AllGather");
  w.Sync();
}

// ---------------------------------------------------------------------------------------
// Reduce-scatter.

void DirectCommunicator::ReduceScatter(const void* send, DType send_dtype, void* recv,
                                       DType recv_dtype, size_t count, bool accumulate) {
  ReduceScatterPartials(send, send_dtype, recv, recv_dtype, count, accumulate, {});
}

void DirectCommunicator::ReduceScatterPartials(const void* send, DType send_dtype, void* recv,
                                               DType recv_dtype, size_t count, bool accumulate,
                                               const ReduceScatterOptions& o) {
  const std::string where = fmt::format("ReduceScatter on {}", name());
  BusyGuard guard(busy_, where);
  const int n = size();
  const uint64_t s = ++seq_;
  Descriptor d;
  d.v[kKind] = kReduceScatter;
  d.v[kSeq] = static_cast<int64_t>(s);
  d.v[kCount] = static_cast<int64_t>(count);
  d.v[kDtype] = static_cast<int64_t>(send_dtype);
  d.v[kWindow] = -1;
  d.v[kPartials] = static_cast<int64_t>(o.partial_dtype);
  if (o.partial_dtype == DType::kBF16) {
    d.v[kSrSeed] = static_cast<int64_t>(o.sr_key.seed);
    d.v[kSrStep] = static_cast<int64_t>(o.sr_key.step);
    d.v[kSrStream] = static_cast<int64_t>(o.sr_key.stream);
  }
  auto reducible = [](DType t) { return t == DType::kF32 || t == DType::kBF16; };
  std::string err;
  Resolved r;
  const size_t es = DTypeSize(send_dtype);
  if (!reducible(send_dtype) || !reducible(recv_dtype)) {
    err = fmt::format("send dtype {} / recv dtype {}: reduce fp32 or bf16 buffers",
                      DTypeName(send_dtype), DTypeName(recv_dtype));
  } else if (!reducible(o.partial_dtype)) {
    err = fmt::format("partial dtype {}: partials are fp32 or bf16 (stochastic rounding)",
                      DTypeName(o.partial_dtype));
  } else if (count > std::numeric_limits<size_t>::max() / (static_cast<size_t>(n) * 4)) {
    err = fmt::format("count {} overflows the address space", count);
  } else if (count > 0) {
    const size_t send_bytes = count * es * n, recv_bytes = count * DTypeSize(recv_dtype);
    if (send == nullptr || recv == nullptr) {
      err = fmt::format("send or recv is null with count {}", count);
    } else if (Overlaps(send, send_bytes, recv, recv_bytes)) {
      err = fmt::format(
          "send ({} bytes) and recv ({} bytes) overlap; node peers read every slice of send "
          "until the call ends, so recv must be a separate buffer",
          send_bytes, recv_bytes);
    } else if (Resolve(send, send_bytes, "send (G′)", &r, &err) == 0) {
      d.v[kWindow] = r.reg->id;
      d.v[kOffset] = static_cast<int64_t>(r.offset);
    }
  }
  counters_.calls++;
  Rendezvous(d, where, err);
  if (count == 0) return;
  const size_t pe = DTypeSize(o.partial_dtype);
  if (geo_.K > 1 && count * pe > workspace_slot_) GrowWorkspace(count * pe);
  DoReduceScatter(r, static_cast<const char*>(send), send_dtype, recv, recv_dtype, count,
                  accumulate, o, s);
}

void DirectCommunicator::DoReduceScatter(const Resolved& r, const char* send, DType send_dtype,
                                         void* recv, DType recv_dtype, size_t count,
                                         bool accumulate, const ReduceScatterOptions& o,
                                         uint64_t s) {
  const NodeGeometry& g = geo_;
  const RmaWindow& w = *r.reg->window;
  const size_t es = DTypeSize(send_dtype);
  const size_t pe = DTypeSize(o.partial_dtype);
  const bool sr = o.partial_dtype == DType::kBF16;
  const size_t slice_bytes = count * es;
  const int p0 = rank();
  // Slice j of node member l's G′, read in place from its registered region.
  auto slice = [&](int l, int j) -> const char* {
    if (l == g.l0) return send + static_cast<size_t>(j) * slice_bytes;
    return w.local_base(l) + r.offset + static_cast<size_t>(j) * slice_bytes;
  };
  // Workspace: inbound partials of the other nodes, then outbound partials to them.
  auto slot_index = [](int k, int self) { return k < self ? k : k - 1; };
  const size_t slot = workspace_slot_;
  auto inbound = [&](int k) { return workspace_->base() + slot * slot_index(k, g.k0); };
  auto outbound = [&](int k) {
    return workspace_->base() + slot * (static_cast<size_t>(g.K - 1) + slot_index(k, g.k0));
  };

  // 1. Node partials for this rank's counterparts, computed from the node's G′ (complete since
  //    the rendezvous) and put into the destination's inbound slot for this node.
  std::vector<const char*> srcs(g.L);
  // Intra-node bytes are counted where they move: each load of a node peer's slice from its
  // shared window (this rank's own slice is local).
  auto gather_sources = [&](int j) {
    for (int l = 0; l < g.L; ++l) {
      srcs[l] = slice(l, j);
      if (l != g.l0) counters_.intra_node_bytes += slice_bytes;
    }
  };
  auto partial = [&](int dest, char* out) {
    gather_sources(dest);
    const uint64_t first = static_cast<uint64_t>(g.k0) * g.n * count + dest * count;
    if (send_dtype == DType::kF32) {
      auto* f = reinterpret_cast<const float* const*>(srcs.data());
      if (!sr) {
        SumSlices(f, g.L, reinterpret_cast<float*>(out), count);
      } else {
        StochasticRoundSumBf16(f, g.L, reinterpret_cast<bf16*>(out), count, o.sr_key, first);
      }
    } else {
      auto* b = reinterpret_cast<const bf16* const*>(srcs.data());
      if (!sr) {
        SumSlices(b, g.L, reinterpret_cast<float*>(out), count);
      } else {
        StochasticRoundSumBf16(b, g.L, reinterpret_cast<bf16*>(out), count, o.sr_key, first);
      }
    }
  };
  for (int k = 0; k < g.K; ++k) {
    if (k == g.k0) continue;
    const int dest = g.at[k][g.l0];
    char* out = outbound(k);
    partial(dest, out);
    workspace_->Put(out, count * pe, dest, slot * slot_index(g.k0, k));
    CountTo(dest, count * pe);
  }
  for (int k = 0; k < g.K; ++k) {
    if (k == g.k0) continue;
    const int dest = g.at[k][g.l0];
    workspace_->Flush(dest);
    SignalArrival(dest, s);
  }

  // 2. Final reduction once every remote partial has arrived: one pass into recv.
  WaitArrivals(s, "ReduceScatter");
  if (workspace_) workspace_->Sync();
  std::vector<const void*> remote(g.K, nullptr);
  for (int k = 0; k < g.K; ++k)
    if (k != g.k0) remote[k] = inbound(k);
  gather_sources(p0);
  if (send_dtype == DType::kF32) {
    FinalReduceFrom(reinterpret_cast<const float* const*>(srcs.data()), g.L, remote.data(),
                    o.partial_dtype, g.K, g.k0, recv, recv_dtype, count, accumulate);
  } else {
    FinalReduceFrom(reinterpret_cast<const bf16* const*>(srcs.data()), g.L, remote.data(),
                    o.partial_dtype, g.K, g.k0, recv, recv_dtype, count, accumulate);
  }

  // 3. Done reading the node peers' G′; wait until they are done reading this rank's.
  SignalDone(s);
  WaitDone(s, "ReduceScatter");
}

// ---------------------------------------------------------------------------------------
// Delegated calls.

void DirectCommunicator::AllReduce(void* buf, size_t count, DType dtype) {
  BusyGuard guard(busy_, "AllReduce on " + name());
  const CommCounters before = inner_->counters();
  inner_->AllReduce(buf, count, dtype);
  counters_ += Delta(inner_->counters(), before);
}

void DirectCommunicator::Exchange(const std::vector<P2POp>& sends,
                                  const std::vector<P2POp>& recvs) {
  BusyGuard guard(busy_, "Exchange on " + name());
  const CommCounters before = inner_->counters();
  inner_->Exchange(sends, recvs);
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
  return Create(AsMpi(inner_->Split(color, key), name()));
}

std::unique_ptr<Communicator> DirectCommunicator::Duplicate() {
  BusyGuard guard(busy_, "Duplicate on " + name());
  return Create(AsMpi(inner_->Duplicate(), name()));
}

// ---------------------------------------------------------------------------------------
// RegisteredSlots.

RegisteredSlots::RegisteredSlots(DirectCommunicator& comm, const std::string& name,
                                 size_t slot_bytes, int slots)
    : name_(name), slot_bytes_((slot_bytes + 63) / 64 * 64) {
  SSHSDP_CHECK(slots >= 1, CommError, "registered slots '{}': need at least one slot, got {}", name,
               slots);
  auto root = std::make_unique<DataNode>(name);
  for (int i = 0; i < slots; ++i) {
    root->AddChild("slot" + std::to_string(i), DType::kF32, {static_cast<int64_t>(slot_bytes_ / 4)},
                   DataNode::kAuto, 64);
  }
  root->Finalize();
  root_ = &comm.Register(std::move(root));
  for (const auto& c : root_->children()) ptrs_.push_back(c->data());
  used_.assign(ptrs_.size(), false);
}

void* RegisteredSlots::Acquire() {
  for (size_t i = 0; i < ptrs_.size(); ++i) {
    if (used_[i]) continue;
    used_[i] = true;
    return ptrs_[i];
  }
  throw CommError(fmt::format(
      "registered slots '{}': all {} slots of {} bytes are in use; more buffers are live at "
      "once than the schedule declared — register more slots",
      name_, ptrs_.size(), slot_bytes_));
}

void RegisteredSlots::Release(void* p) {
  for (size_t i = 0; i < ptrs_.size(); ++i) {
    if (ptrs_[i] != p) continue;
    SSHSDP_CHECK(used_[i], CommError, "registered slots '{}': slot {} released twice", name_, i);
    used_[i] = false;
    return;
  }
  throw CommError(fmt::format("registered slots '{}': {} is not one of its slots", name_, p));
}

int RegisteredSlots::in_use() const {
  return static_cast<int>(std::count(used_.begin(), used_.end(), true));
}

}  // namespace sshsdp
