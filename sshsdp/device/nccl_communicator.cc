// NcclCommunicator over NCCL (nccl_communicator.h): the seam's checks on the host, NCCL's
// collectives on one communication stream per communicator, and the fp32 widening and
// finishing on the backend's stream; every call waits for both before it returns.
#include "sshsdp/device/nccl_communicator.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sshsdp/comm/ring_bytes.h"
#include "sshsdp/comm/watchdog.h"

namespace sshsdp {
namespace {

// NCCL, loaded at run time (dlopen): no binary of the device layer needs libnccl to start —
// only NcclCommunicator::Create does, and it says so when the library is missing. The entry
// points are listed once: X(member, symbol).
#define SSHSDP_NCCL_ENTRY_POINTS(X)     \
  X(GetVersion, ncclGetVersion)         \
  X(GetUniqueId, ncclGetUniqueId)       \
  X(CommInitRank, ncclCommInitRank)     \
  X(CommDestroy, ncclCommDestroy)       \
  X(GetErrorString, ncclGetErrorString) \
  X(AllGather, ncclAllGather)           \
  X(ReduceScatter, ncclReduceScatter)   \
  X(AllReduce, ncclAllReduce)           \
  X(Send, ncclSend)                     \
  X(Recv, ncclRecv)                     \
  X(GroupStart, ncclGroupStart)         \
  X(GroupEnd, ncclGroupEnd)

struct NcclApi {
#define SSHSDP_NCCL_MEMBER(member, symbol) decltype(&symbol) member = nullptr;
  SSHSDP_NCCL_ENTRY_POINTS(SSHSDP_NCCL_MEMBER)
#undef SSHSDP_NCCL_MEMBER
  std::string error;  // why it is not loaded
};

const NcclApi& Nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      a.error = fmt::format(
          "cannot load libnccl.so.2 ({}); install NCCL or put its lib "
          "directory on LD_LIBRARY_PATH",
          dlerror());
      return a;
    }
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && a.error.empty()) a.error = fmt::format("libnccl.so.2 has no {}", name);
    };
#define SSHSDP_NCCL_LOAD(member, symbol) get(a.member, #symbol);
    SSHSDP_NCCL_ENTRY_POINTS(SSHSDP_NCCL_LOAD)
#undef SSHSDP_NCCL_LOAD
    return a;
  }();
  return api;
}

void CudaOk(cudaError_t e, const std::string& where, const char* call) {
  if (e != cudaSuccess)
    throw DeviceError(fmt::format("{}: {} failed: {} ({})", where, call, cudaGetErrorName(e),
                                  cudaGetErrorString(e)));
}
void NcclOk(ncclResult_t r, const std::string& where, const char* call) {
  if (r != ncclSuccess)
    throw CommError(fmt::format("{}: {} failed: {} (NCCL {})", where, call,
                                Nccl().GetErrorString(r), NcclVersion()));
}

// The ordinal of a CUDA backend named "cuda:<n> (...)", or -1.
int OrdinalOf(const Backend& b) {
  const std::string name = b.name();
  if (!name.starts_with("cuda:")) return -1;
  return std::atoi(name.c_str() + 5);
}

// What each member tells the others at Create: its device and host.
struct MemberInfo {
  char uuid[16];
  char host[48];
  int32_t ordinal;
  int32_t version;
};

// A fp32 device scratch, grown on demand (the widened inputs and the fp32 results).
class Scratch {
 public:
  explicit Scratch(Backend* b) : b_(b) {}
  ~Scratch() { b_->Free(p_); }
  float* Get(size_t count) {
    if (count > count_) {
      b_->Free(p_);
      p_ = nullptr;
      count_ = 0;
      p_ = static_cast<float*>(b_->Alloc(count * 4));
      count_ = count;
    }
    return p_;
  }

 private:
  Backend* b_;
  float* p_ = nullptr;
  size_t count_ = 0;
};

class NcclComm final : public NcclCommunicator {
 public:
  // `backend` (the caller's) only names the device and is handed to splits and duplicates;
  // the widening and finishing run on a backend of this communicator's own (own stream, used
  // only by the thread that calls this communicator, as backend.h requires).
  NcclComm(std::unique_ptr<Communicator> boot, Backend* backend, int ranks_per_node, int ordinal,
           ncclComm_t comm)
      : boot_(std::move(boot)),
        backend_(backend),
        own_(MakeBackend(fmt::format("cuda:{}", ordinal))),
        rpn_(ranks_per_node),
        ordinal_(ordinal),
        comm_(comm),
        wide_(own_.get()),
        sum_(own_.get()),
        acc_(own_.get()) {
    CudaOk(cudaSetDevice(ordinal_), name(), "cudaSetDevice");
    CudaOk(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), name(),
           "cudaStreamCreateWithFlags");
  }
  ~NcclComm() override {
    cudaSetDevice(ordinal_);
    if (stream_) cudaStreamDestroy(stream_);
    if (Nccl().CommDestroy(comm_) != ncclSuccess)
      std::fprintf(stderr, "sshsdp: ncclCommDestroy failed on %s\n", name().c_str());
  }

  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }
  int world_rank(int position) const override { return boot_->world_rank(position); }
  std::string name() const override { return "nccl:" + boot_->name(); }

  void AllGatherInPlace(void* buf, size_t count, DType dtype) override {
    const size_t shard = count * DTypeSize(dtype);
    char* own = buf ? static_cast<char*>(buf) + static_cast<size_t>(rank()) * shard : nullptr;
    Gather(own, buf, count, dtype, "AllGatherInPlace");
  }
  void AllGather(const void* send, void* recv, size_t count, DType dtype) override {
    Gather(send, recv, count, dtype, "AllGather");
  }

  void ReduceScatter(const void* send, DType send_dtype, void* recv, DType recv_dtype, size_t count,
                     bool accumulate) override {
    const std::string where = fmt::format("ReduceScatter on {}", name());
    UseDevice(where);
    const int n = size();
    std::string err = Reducible(send_dtype, "send") + Reducible(recv_dtype, "recv");
    if (err.empty()) err = CountProblem(count, n);
    const size_t send_bytes = err.empty() ? count * n * DTypeSize(send_dtype) : 0;
    const size_t recv_bytes = err.empty() ? count * DTypeSize(recv_dtype) : 0;
    if (err.empty() && Overlaps(send, send_bytes, recv, recv_bytes))
      err = fmt::format(
          "send ({} bytes) and recv ({} bytes) overlap; recv must be a separate "
          "buffer",
          send_bytes, recv_bytes);
    if (err.empty()) err = DeviceProblem(send, send_bytes, "send");
    if (err.empty()) err = DeviceProblem(recv, recv_bytes, "recv");
    counters_.calls++;
    Agree(where, err);
    if (count == 0) return;
    CountSend(RingReduceScatterSendBytes(n, count, 4));
    const float* in = Widened(send, send_dtype, count * n);
    const bool direct = recv_dtype == DType::kF32 && !accumulate;
    float* total = direct ? static_cast<float*>(recv) : sum_.Get(count);
    NcclOk(Nccl().ReduceScatter(in, total, count, ncclFloat32, ncclSum, comm_, stream_), where,
           "ncclReduceScatter");
    WaitStream("reduce-scatter");
    if (!direct) Finish(total, recv, recv_dtype, count, accumulate);
  }

  void AllReduce(void* buf, size_t count, DType dtype) override {
    const std::string where = fmt::format("AllReduce on {}", name());
    UseDevice(where);
    std::string err = Reducible(dtype, "buffer");
    if (err.empty()) err = CountProblem(count, 1);
    if (err.empty()) err = DeviceProblem(buf, count * DTypeSize(dtype), "buf");
    counters_.calls++;
    Agree(where, err);
    if (count == 0) return;
    CountSend(RingAllReduceSendBytes(size(), rank(), count, 4, 4));
    float* data = dtype == DType::kF32 ? static_cast<float*>(buf) : wide_.Get(count);
    if (dtype == DType::kBF16) {
      own_->CastBf16ToF32(static_cast<const bf16*>(buf), data, static_cast<int64_t>(count));
      own_->Synchronize();
    }
    NcclOk(Nccl().AllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), where,
           "ncclAllReduce");
    WaitStream("all-reduce");
    if (dtype == DType::kBF16) {
      own_->CastF32ToBf16(data, static_cast<bf16*>(buf), static_cast<int64_t>(count));
      own_->Synchronize();
    }
  }

  void Exchange(const std::vector<P2POp>& sends, const std::vector<P2POp>& recvs) override;

  void Barrier() override {
    counters_.calls++;
    WaitStream("barrier");
    boot_->Barrier();
  }
  std::unique_ptr<Communicator> Split(int color, int key) override {
    return Create(boot_->Split(color, key), backend_, rpn_);
  }
  std::unique_ptr<Communicator> Duplicate() override {
    return Create(boot_->Duplicate(), backend_, rpn_);
  }

 private:
  void Gather(const void* send, void* recv, size_t count, DType dtype, const char* op) {
    const std::string where = fmt::format("{} on {}", op, name());
    UseDevice(where);
    const int n = size();
    const size_t e = DTypeSize(dtype);
    std::string err = CountProblem(count, n);
    const size_t shard = err.empty() ? count * e : 0, total = shard * n;
    const bool in_place =
        recv != nullptr && send == static_cast<char*>(recv) + static_cast<size_t>(rank()) * shard;
    if (err.empty() && !in_place && Overlaps(send, shard, recv, total))
      err = "send overlaps recv; pass send = recv + rank()*count (in place) or disjoint buffers";
    if (err.empty()) err = DeviceProblem(send, shard, "send");
    if (err.empty()) err = DeviceProblem(recv, total, "recv");
    counters_.calls++;
    Agree(where, err);
    if (count == 0) return;
    if (!in_place) counters_.local_copy_bytes += shard;
    CountSend(RingAllGatherSendBytes(n, count, e));
    NcclOk(Nccl().AllGather(send, recv, shard, ncclUint8, comm_, stream_), where, "ncclAllGather");
    WaitStream("all-gather");
  }

  // Every member's checks agree before NCCL is entered (a member that failed its own checks
  // would otherwise leave the others inside NCCL): one small all-reduce over the bootstrap.
  void Agree(const std::string& where, const std::string& local_error) {
    float bad = local_error.empty() ? 0.0f : 1.0f;
    {
      WaitScope watched("NCCL call agreement", name());
      boot_->AllReduce(&bad, 1, DType::kF32);
    }
    SSHSDP_CHECK(local_error.empty(), CommError, "{}: {} (refused on every member before NCCL)",
                 where, local_error);
    SSHSDP_CHECK(bad == 0, CommError,
                 "{}: refused before NCCL: another member's call failed its own checks (its "
                 "error names the reason)",
                 where);
  }

  // The fp32 view of a reduction input: itself, or widened into scratch.
  const float* Widened(const void* p, DType dtype, size_t count) {
    if (dtype == DType::kF32) return static_cast<const float*>(p);
    float* w = wide_.Get(count);
    own_->CastBf16ToF32(static_cast<const bf16*>(p), w, static_cast<int64_t>(count));
    own_->Synchronize();
    return w;
  }

  // recv = total, recv += total (fp32) or recv = bf16(float(recv) + total) (bf16).
  void Finish(const float* total, void* recv, DType recv_dtype, size_t count, bool accumulate) {
    const auto c = static_cast<int64_t>(count);
    if (recv_dtype == DType::kF32) {
      auto* out = static_cast<float*>(recv);
      if (accumulate) {
        own_->Add(out, total, out, c);
      } else {
        CudaOk(cudaMemcpy(out, total, count * 4, cudaMemcpyDeviceToDevice), name(), "cudaMemcpy");
      }
    } else {
      auto* out = static_cast<bf16*>(recv);
      if (accumulate) {
        float* a = acc_.Get(count);
        own_->CastBf16ToF32(out, a, c);
        own_->Add(a, total, a, c);
        own_->CastF32ToBf16(a, out, c);
      } else {
        own_->CastF32ToBf16(total, out, c);
      }
    }
    own_->Synchronize();
  }

  // Any thread may call (the engine's communication thread does): make this communicator's
  // device current on it.
  void UseDevice(const std::string& where) const {
    CudaOk(cudaSetDevice(ordinal_), where, "cudaSetDevice");
  }

  void WaitStream(const char* op) {
    WaitScope watched(op, name());
    CudaOk(cudaStreamSynchronize(stream_), name(), "cudaStreamSynchronize");
  }

  void CountSend(uint64_t bytes) {
    const int next = (rank() + 1) % size();
    CountTo(next, bytes);
  }
  void CountTo(int position, uint64_t bytes) {
    if (world_rank(position) / rpn_ == world_rank(rank()) / rpn_) {
      counters_.intra_node_bytes += bytes;
    } else {
      counters_.inter_node_bytes += bytes;
    }
  }

  static std::string Reducible(DType t, const char* what) {
    if (t == DType::kF32 || t == DType::kBF16) return "";
    return fmt::format("{} dtype {} is not supported; reduce fp32 or bf16 buffers", what,
                       DTypeName(t));
  }
  static std::string CountProblem(size_t count, int n) {
    if (count <= std::numeric_limits<size_t>::max() / (static_cast<size_t>(n) * 4)) return "";
    return fmt::format("count {} overflows the address space", count);
  }
  // "" for device (or managed) memory of this communicator's device, else what is wrong.
  std::string DeviceProblem(const void* p, size_t bytes, const char* what) const {
    if (bytes == 0) return "";
    if (p == nullptr) return fmt::format("{} is null with {} bytes", what, bytes);
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) cudaGetLastError();  // clear the error of an unknown pointer
    const bool device =
        e == cudaSuccess && (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged);
    if (!device)
      return fmt::format(
          "{} ({} bytes at {}) is host memory; NcclCommunicator moves device "
          "buffers (Backend::Alloc of the cuda backend)",
          what, bytes, p);
    if (a.type != cudaMemoryTypeManaged && a.device != ordinal_)
      return fmt::format("{} lives on cuda:{}, this communicator runs on cuda:{}", what, a.device,
                         ordinal_);
    return "";
  }

  std::unique_ptr<Communicator> boot_;
  Backend* backend_;
  std::unique_ptr<Backend> own_;  // before the scratches: they free into it
  int rpn_;
  int ordinal_;
  ncclComm_t comm_;
  cudaStream_t stream_ = nullptr;
  Scratch wide_, sum_, acc_;
};

void NcclComm::Exchange(const std::vector<P2POp>& sends, const std::vector<P2POp>& recvs) {
  const std::string where = fmt::format("Exchange on {}", name());
  UseDevice(where);
  const int n = size();
  std::string err;
  auto check = [&](const std::vector<P2POp>& ops, const char* list) {
    for (size_t i = 0; i < ops.size() && err.empty(); ++i) {
      const P2POp& op = ops[i];
      if (op.peer < 0 || op.peer >= n)
        err = fmt::format("{}[{}].peer = {} is outside the group of {}", list, i, op.peer, n);
      else if (op.tag < 0)
        err = fmt::format("{}[{}].tag = {} is negative", list, i, op.tag);
      else
        err = DeviceProblem(op.data, op.bytes, list);
    }
  };
  check(sends, "sends");
  check(recvs, "recvs");
  if (err.empty()) {  // messages to itself pair up locally, by tag order
    std::vector<std::pair<int, size_t>> to_self, from_self;
    for (const P2POp& op : sends)
      if (op.peer == rank()) to_self.push_back({op.tag, op.bytes});
    for (const P2POp& op : recvs)
      if (op.peer == rank()) from_self.push_back({op.tag, op.bytes});
    auto by_tag = [](const auto& a, const auto& b) { return a.first < b.first; };
    std::stable_sort(to_self.begin(), to_self.end(), by_tag);
    std::stable_sort(from_self.begin(), from_self.end(), by_tag);
    if (to_self != from_self)
      err = fmt::format(
          "the {} message(s) this rank sends itself do not pair up with the {} "
          "receive(s) it posts from itself (same tags and sizes needed)",
          to_self.size(), from_self.size());
  }
  counters_.calls++;
  // A local error: this rank's peers still expect the size exchange below, so it goes on
  // with no messages and the verdict reaches them there.
  const std::vector<P2POp> none;
  // Each pair's messages in (tag, posting) order on both sides.
  auto sorted = [&](const std::vector<P2POp>& ops) {
    std::vector<P2POp> out = err.empty() ? ops : none;
    std::stable_sort(out.begin(), out.end(), [](const P2POp& a, const P2POp& b) {
      return a.peer != b.peer ? a.peer < b.peer : a.tag < b.tag;
    });
    return out;
  };
  const std::vector<P2POp> s = sorted(sends), r = sorted(recvs);
  // Both directions of every pair, over the bootstrap, with every peer this rank exchanges
  // with: [ok, #sends to p, #receives from p, then (tag, bytes) of each send, of each receive].
  // Each side checks that its sends match the other's receives and the other way round, so
  // both reach the same verdict before any NCCL call (a mismatch would hang NCCL).
  std::vector<std::vector<uint64_t>> mine(n), theirs(n);
  std::vector<bool> involved(n, false);  // from the calls as made, errors or not
  for (const auto* ops : {&sends, &recvs})
    for (const P2POp& op : *ops)
      if (op.peer >= 0 && op.peer < n) involved[op.peer] = true;
  for (int p = 0; p < n; ++p) {
    if (!involved[p] || p == rank()) continue;
    std::vector<uint64_t>& m = mine[p];
    size_t ns = 0, nr = 0;
    for (const P2POp& op : s) ns += op.peer == p;
    for (const P2POp& op : r) nr += op.peer == p;
    m = {err.empty() ? 1u : 0u, ns, nr};
    for (const P2POp& op : s)
      if (op.peer == p) m.insert(m.end(), {static_cast<uint64_t>(op.tag), op.bytes});
    for (const P2POp& op : r)
      if (op.peer == p) m.insert(m.end(), {static_cast<uint64_t>(op.tag), op.bytes});
  }
  std::vector<uint64_t> len_mine(n, 0), len_theirs(n, 0);
  std::vector<P2POp> ls, lr;
  for (int p = 0; p < n; ++p) {
    if (mine[p].empty()) continue;
    len_mine[p] = mine[p].size();
    ls.push_back({p, &len_mine[p], 8, 0});
    lr.push_back({p, &len_theirs[p], 8, 0});
  }
  {
    WaitScope watched("NCCL exchange: message sizes", name());
    boot_->Exchange(ls, lr);
  }
  std::vector<P2POp> ms, mr;
  for (int p = 0; p < n; ++p) {
    if (mine[p].empty()) continue;
    theirs[p].resize(len_theirs[p]);
    ms.push_back({p, mine[p].data(), mine[p].size() * 8, 1});
    mr.push_back({p, theirs[p].data(), theirs[p].size() * 8, 1});
  }
  {
    WaitScope watched("NCCL exchange: message sizes", name());
    boot_->Exchange(ms, mr);
  }
  SSHSDP_CHECK(err.empty(), CommError, "{}: {} (refused before NCCL)", where, err);
  for (int p = 0; p < n; ++p) {
    if (mine[p].empty()) continue;
    const std::vector<uint64_t>& m = mine[p];
    const std::vector<uint64_t>& t = theirs[p];
    SSHSDP_CHECK(t.size() >= 3 && t[0] == 1, CommError,
                 "{}: refused before NCCL: position {} failed its own checks", where, p);
    // My sends (m[3 ..]) against its receives, its sends against my receives.
    const size_t ms_n = m[1], mr_n = m[2], ts_n = t[1], tr_n = t[2];
    const bool match =
        ms_n == tr_n && mr_n == ts_n &&
        std::equal(m.begin() + 3, m.begin() + 3 + 2 * ms_n, t.begin() + 3 + 2 * ts_n) &&
        std::equal(m.begin() + 3 + 2 * ms_n, m.end(), t.begin() + 3);
    SSHSDP_CHECK(match, CommError,
                 "{}: the messages between this rank and position {} do not pair up (this rank "
                 "sends {} and posts {} receives, it sends {} and posts {}; every send needs a "
                 "receive with the same tag and size on the other side)",
                 where, p, ms_n, mr_n, ts_n, tr_n);
  }
  NcclOk(Nccl().GroupStart(), where, "ncclGroupStart");
  for (const P2POp& op : r)
    if (op.bytes > 0)
      NcclOk(Nccl().Recv(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_), where, "ncclRecv");
  for (const P2POp& op : s) {
    if (op.bytes > 0)
      NcclOk(Nccl().Send(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_), where, "ncclSend");
  }
  NcclOk(Nccl().GroupEnd(), where, "ncclGroupEnd");
  for (const P2POp& op : sends) CountTo(op.peer, op.bytes);
  WaitStream("point-to-point exchange");
}

}  // namespace

bool NcclCompiled() { return true; }

std::string NcclVersion() {
  int v = 0;
  if (!Nccl().error.empty()) return "not loaded: " + Nccl().error;
  if (Nccl().GetVersion(&v) != ncclSuccess) return "unknown";
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::Create(std::unique_ptr<Communicator> bootstrap,
                                                           Backend* backend, int ranks_per_node) {
  SSHSDP_CHECK(bootstrap != nullptr, ConfigError, "NcclCommunicator: no bootstrap communicator");
  const std::string group = bootstrap->name();
  SSHSDP_CHECK(ranks_per_node > 0, ConfigError,
               "NcclCommunicator on {}: ranks per node must be > 0, got {}", group, ranks_per_node);
  const int ordinal = backend ? OrdinalOf(*backend) : -1;
  SSHSDP_CHECK(ordinal >= 0, DeviceError,
               "NcclCommunicator on {}: needs this rank's cuda backend, got {}", group,
               backend ? backend->name() : "none");
  // Every member learns whether every member can load NCCL before anything else is agreed.
  float missing = Nccl().error.empty() ? 0.0f : 1.0f;
  bootstrap->AllReduce(&missing, 1, DType::kF32);
  SSHSDP_CHECK(
      missing == 0, DeviceError, "NcclCommunicator on {}: {}", group,
      Nccl().error.empty() ? std::string("another member cannot load NCCL") : Nccl().error);
  const std::string where = fmt::format("NcclCommunicator on {}", group);
  CudaOk(cudaSetDevice(ordinal), where, "cudaSetDevice");
  MemberInfo mine{};
  cudaDeviceProp prop{};
  CudaOk(cudaGetDeviceProperties(&prop, ordinal), where, "cudaGetDeviceProperties");
  std::memcpy(mine.uuid, prop.uuid.bytes, sizeof(mine.uuid));
  gethostname(mine.host, sizeof(mine.host) - 1);
  mine.ordinal = ordinal;
  int version = 0;
  NcclOk(Nccl().GetVersion(&version), where, "ncclGetVersion");
  mine.version = version;
  const int n = bootstrap->size();
  std::vector<MemberInfo> all(n);
  // Bytes through the seam: a 1-byte dtype is copied, never interpreted.
  bootstrap->AllGather(&mine, all.data(), sizeof(MemberInfo), DType::kUE8M0);
  std::string shared;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (std::strncmp(all[i].host, all[j].host, sizeof(mine.host)) == 0 &&
          std::memcmp(all[i].uuid, all[j].uuid, sizeof(mine.uuid)) == 0 && shared.empty()) {
        shared = fmt::format("positions {} and {} share cuda:{} on {}", i, j, all[i].ordinal,
                             all[i].host);
      }
    }
  }
  SSHSDP_CHECK(shared.empty() || version >= 23000, CommError,
               "{}: {}; NCCL {} refuses two ranks on one GPU (2.30 allows it). Give every rank "
               "its own GPU (ranks per node <= GPUs per node), or use the direct path (CUDA IPC) "
               "for several processes on one GPU",
               where, shared, NcclVersion());
  for (int i = 0; i < n; ++i)
    SSHSDP_CHECK(all[i].version == version, CommError,
                 "{}: position {} loaded NCCL {} and this rank {}; every rank needs the same "
                 "NCCL",
                 where, i, all[i].version, version);
  ncclUniqueId id{};
  if (bootstrap->rank() == 0) NcclOk(Nccl().GetUniqueId(&id), where, "ncclGetUniqueId");
  std::vector<ncclUniqueId> ids(n);
  bootstrap->AllGather(&id, ids.data(), sizeof(ncclUniqueId), DType::kUE8M0);
  ncclComm_t comm = nullptr;
  {
    WaitScope watched("NCCL communicator init", group);
    NcclOk(Nccl().CommInitRank(&comm, n, ids[0], bootstrap->rank()), where, "ncclCommInitRank");
  }
  return std::make_unique<NcclComm>(std::move(bootstrap), backend, ranks_per_node, ordinal, comm);
}

}  // namespace sshsdp
