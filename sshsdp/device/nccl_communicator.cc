// NcclCommunicator over NCCL (nccl_communicator.h): the seam's checks on the host, NCCL's
// collectives on one communication stream per communicator, and the fp32 widening and
// finishing on the backend's stream; every call waits for both before it returns.
#include "sshsdp/device/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "sshsdp/comm/ring_bytes.h"
#include "sshsdp/comm/watchdog.h"

namespace sshsdp {
namespace {

void CudaOk(cudaError_t e, const std::string& where, const char* call) {
  if (e != cudaSuccess)
    throw DeviceError(fmt::format("{}: {} failed: {} ({})", where, call, cudaGetErrorName(e),
                                  cudaGetErrorString(e)));
}
void NcclOk(ncclResult_t r, const std::string& where, const char* call) {
  if (r != ncclSuccess)
    throw CommError(fmt::format("{}: {} failed: {} (NCCL {})", where, call, ncclGetErrorString(r),
                                NcclVersion()));
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
  NcclComm(std::unique_ptr<Communicator> boot, Backend* backend, int ranks_per_node, int ordinal,
           ncclComm_t comm)
      : boot_(std::move(boot)),
        backend_(backend),
        rpn_(ranks_per_node),
        ordinal_(ordinal),
        comm_(comm),
        wide_(backend),
        sum_(backend),
        acc_(backend) {
    CudaOk(cudaSetDevice(ordinal_), name(), "cudaSetDevice");
    CudaOk(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), name(),
           "cudaStreamCreateWithFlags");
  }
  ~NcclComm() override {
    cudaSetDevice(ordinal_);
    if (stream_) cudaStreamDestroy(stream_);
    if (ncclCommDestroy(comm_) != ncclSuccess)
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
    CheckReducible(send_dtype, "send", where);
    CheckReducible(recv_dtype, "recv", where);
    CheckCount(count, n, where);
    const size_t send_bytes = count * n * DTypeSize(send_dtype);
    const size_t recv_bytes = count * DTypeSize(recv_dtype);
    SSHSDP_CHECK(!Overlaps(send, send_bytes, recv, recv_bytes), CommError,
                 "{}: send ({} bytes) and recv ({} bytes) overlap; recv must be a separate "
                 "buffer",
                 where, send_bytes, recv_bytes);
    CheckDevice(send, send_bytes, "send", where);
    CheckDevice(recv, recv_bytes, "recv", where);
    counters_.calls++;
    if (count == 0) return;
    CountSend(RingReduceScatterSendBytes(n, count, 4));
    const float* in = Widened(send, send_dtype, count * n);
    const bool direct = recv_dtype == DType::kF32 && !accumulate;
    float* total = direct ? static_cast<float*>(recv) : sum_.Get(count);
    NcclOk(ncclReduceScatter(in, total, count, ncclFloat32, ncclSum, comm_, stream_), where,
           "ncclReduceScatter");
    WaitStream("reduce-scatter");
    if (!direct) Finish(total, recv, recv_dtype, count, accumulate);
  }

  void AllReduce(void* buf, size_t count, DType dtype) override {
    const std::string where = fmt::format("AllReduce on {}", name());
    UseDevice(where);
    CheckReducible(dtype, "buffer", where);
    CheckCount(count, 1, where);
    CheckDevice(buf, count * DTypeSize(dtype), "buf", where);
    counters_.calls++;
    if (count == 0) return;
    CountSend(RingAllReduceSendBytes(size(), rank(), count, 4, 4));
    float* data = dtype == DType::kF32 ? static_cast<float*>(buf) : wide_.Get(count);
    if (dtype == DType::kBF16) {
      backend_->CastBf16ToF32(static_cast<const bf16*>(buf), data, static_cast<int64_t>(count));
      backend_->Synchronize();
    }
    NcclOk(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), where,
           "ncclAllReduce");
    WaitStream("all-reduce");
    if (dtype == DType::kBF16) {
      backend_->CastF32ToBf16(data, static_cast<bf16*>(buf), static_cast<int64_t>(count));
      backend_->Synchronize();
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
    CheckCount(count, n, where);
    const size_t shard = count * e, total = shard * n;
    char* own = static_cast<char*>(recv) + static_cast<size_t>(rank()) * shard;
    const bool in_place = send == own;
    SSHSDP_CHECK(in_place || !Overlaps(send, shard, recv, total), CommError,
                 "{}: send overlaps recv; pass send = recv + rank()*count (in place) or disjoint "
                 "buffers",
                 where);
    CheckDevice(send, shard, "send", where);
    CheckDevice(recv, total, "recv", where);
    counters_.calls++;
    if (count == 0) return;
    if (!in_place) counters_.local_copy_bytes += shard;
    CountSend(RingAllGatherSendBytes(n, count, e));
    NcclOk(ncclAllGather(send, recv, shard, ncclUint8, comm_, stream_), where, "ncclAllGather");
    WaitStream("all-gather");
  }

  // The fp32 view of a reduction input: itself, or widened into scratch.
  const float* Widened(const void* p, DType dtype, size_t count) {
    if (dtype == DType::kF32) return static_cast<const float*>(p);
    float* w = wide_.Get(count);
    backend_->CastBf16ToF32(static_cast<const bf16*>(p), w, static_cast<int64_t>(count));
    backend_->Synchronize();
    return w;
  }

  // recv = total, recv += total (fp32) or recv = bf16(float(recv) + total) (bf16).
  void Finish(const float* total, void* recv, DType recv_dtype, size_t count, bool accumulate) {
    const auto c = static_cast<int64_t>(count);
    if (recv_dtype == DType::kF32) {
      auto* out = static_cast<float*>(recv);
      if (accumulate) {
        backend_->Add(out, total, out, c);
      } else {
        CudaOk(cudaMemcpy(out, total, count * 4, cudaMemcpyDeviceToDevice), name(), "cudaMemcpy");
      }
    } else {
      auto* out = static_cast<bf16*>(recv);
      if (accumulate) {
        float* a = acc_.Get(count);
        backend_->CastBf16ToF32(out, a, c);
        backend_->Add(a, total, a, c);
        backend_->CastF32ToBf16(a, out, c);
      } else {
        backend_->CastF32ToBf16(total, out, c);
      }
    }
    backend_->Synchronize();
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

  static void CheckReducible(DType t, const char* what, const std::string& where) {
    SSHSDP_CHECK(t == DType::kF32 || t == DType::kBF16, CommError,
                 "{}: {} dtype {} is not supported; reduce fp32 or bf16 buffers", where, what,
                 DTypeName(t));
  }
  static void CheckCount(size_t count, int n, const std::string& where) {
    SSHSDP_CHECK(count <= std::numeric_limits<size_t>::max() / (static_cast<size_t>(n) * 4),
                 CommError, "{}: count {} overflows the address space", where, count);
  }
  // Device (or managed) memory of this communicator's device, or CommError naming `what`.
  void CheckDevice(const void* p, size_t bytes, const char* what, const std::string& where) const {
    if (bytes == 0) return;
    SSHSDP_CHECK(p != nullptr, CommError, "{}: {} is null with {} bytes", where, what, bytes);
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) cudaGetLastError();  // clear the sticky-free error of a host pointer
    const bool device =
        e == cudaSuccess && (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged);
    SSHSDP_CHECK(device, CommError,
                 "{}: {} ({} bytes at {}) is host memory; NcclCommunicator moves device buffers "
                 "(Backend::Alloc of the cuda backend)",
                 where, what, bytes, p);
    SSHSDP_CHECK(a.type == cudaMemoryTypeManaged || a.device == ordinal_, CommError,
                 "{}: {} lives on cuda:{}, this communicator runs on cuda:{}", where, what,
                 a.device, ordinal_);
  }

  std::unique_ptr<Communicator> boot_;
  Backend* backend_;
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
  auto check = [&](const std::vector<P2POp>& ops, const char* list) {
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      SSHSDP_CHECK(op.peer >= 0 && op.peer < n, CommError,
                   "{}: {}[{}].peer = {} is outside the group of {}", where, list, i, op.peer, n);
      SSHSDP_CHECK(op.tag >= 0, CommError, "{}: {}[{}].tag = {} is negative", where, list, i,
                   op.tag);
      CheckDevice(op.data, op.bytes, list, where);
    }
  };
  check(sends, "sends");
  check(recvs, "recvs");
  counters_.calls++;
  // Each pair's messages in (tag, posting) order on both sides.
  auto sorted = [](const std::vector<P2POp>& ops) {
    std::vector<P2POp> s = ops;
    std::stable_sort(s.begin(), s.end(), [](const P2POp& a, const P2POp& b) {
      return a.peer != b.peer ? a.peer < b.peer : a.tag < b.tag;
    });
    return s;
  };
  const std::vector<P2POp> s = sorted(sends), r = sorted(recvs);
  // Sizes first, over the bootstrap, with every peer this rank exchanges with: each receive
  // must match its send exactly (a mismatch would hang NCCL).
  std::vector<std::vector<uint64_t>> to(n), from(n), theirs(n);
  std::vector<bool> involved(n, false);
  for (const P2POp& op : s) {
    to[op.peer].push_back(op.bytes);
    involved[op.peer] = true;
  }
  for (const P2POp& op : r) {
    from[op.peer].push_back(op.bytes);
    involved[op.peer] = true;
  }
  std::vector<uint64_t> counts_to(n), counts_from(n);
  std::vector<P2POp> cs, cr;
  for (int p = 0; p < n; ++p) {
    counts_to[p] = to[p].size();
    if (!involved[p] || p == rank()) continue;
    cs.push_back({p, &counts_to[p], 8, 0});
    cr.push_back({p, &counts_from[p], 8, 0});
  }
  boot_->Exchange(cs, cr);
  std::vector<P2POp> ms, mr;
  for (int p = 0; p < n; ++p) {
    if (p == rank()) {
      theirs[p] = to[p];
      continue;
    }
    if (!involved[p]) continue;
    theirs[p].resize(counts_from[p]);
    if (!to[p].empty()) ms.push_back({p, to[p].data(), to[p].size() * 8, 1});
    if (!theirs[p].empty()) mr.push_back({p, theirs[p].data(), theirs[p].size() * 8, 1});
  }
  boot_->Exchange(ms, mr);
  for (int p = 0; p < n; ++p) {
    SSHSDP_CHECK(theirs[p] == from[p], CommError,
                 "{}: position {} sends this rank {} message(s) and {} receive(s) are posted "
                 "for it, or their sizes differ: every receive needs a send of the same size "
                 "and tag",
                 where, p, theirs[p].size(), from[p].size());
  }
  NcclOk(ncclGroupStart(), where, "ncclGroupStart");
  for (const P2POp& op : r)
    if (op.bytes > 0)
      NcclOk(ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_), where, "ncclRecv");
  for (const P2POp& op : s) {
    if (op.bytes > 0)
      NcclOk(ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_), where, "ncclSend");
  }
  NcclOk(ncclGroupEnd(), where, "ncclGroupEnd");
  for (const P2POp& op : sends) CountTo(op.peer, op.bytes);
  WaitStream("point-to-point exchange");
}

}  // namespace

bool NcclCompiled() { return true; }

std::string NcclVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
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
  const std::string where = fmt::format("NcclCommunicator on {}", group);
  CudaOk(cudaSetDevice(ordinal), where, "cudaSetDevice");
  MemberInfo mine{};
  cudaDeviceProp prop{};
  CudaOk(cudaGetDeviceProperties(&prop, ordinal), where, "cudaGetDeviceProperties");
  std::memcpy(mine.uuid, prop.uuid.bytes, sizeof(mine.uuid));
  gethostname(mine.host, sizeof(mine.host) - 1);
  mine.ordinal = ordinal;
  int version = 0;
  NcclOk(ncclGetVersion(&version), where, "ncclGetVersion");
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
  if (bootstrap->rank() == 0) NcclOk(ncclGetUniqueId(&id), where, "ncclGetUniqueId");
  std::vector<ncclUniqueId> ids(n);
  bootstrap->AllGather(&id, ids.data(), sizeof(ncclUniqueId), DType::kUE8M0);
  ncclComm_t comm = nullptr;
  {
    WaitScope watched("NCCL communicator init", group);
    NcclOk(ncclCommInitRank(&comm, n, ids[0], bootstrap->rank()), where, "ncclCommInitRank");
  }
  return std::make_unique<NcclComm>(std::move(bootstrap), backend, ranks_per_node, ordinal, comm);
}

}  // namespace sshsdp
