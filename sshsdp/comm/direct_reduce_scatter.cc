// DirectCommunicator reduce-scatter: node partials read in place from the node's G′ and put
// to the destinations, the final fp32 reduction on arrival straight into recv; its add loops
// need the dynamic vectorizer cost model (CMakeLists.txt; see direct_communicator.h).
#include "sshsdp/comm/direct_communicator.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/direct_internal.h"
#include "sshsdp/numerics/stochastic_rounding.h"

namespace sshsdp {

using namespace direct_internal;

namespace {

constexpr size_t kBlock = 1024;  // elements per reduction block (stays in L1)

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

}  // namespace

void HostReduceSlices(const void* const* srcs, DType src_dtype, int m, void* out, DType out_dtype,
                      size_t n, bool accumulate) {
  const void* const none[1] = {nullptr};  // no other node: K = 1
  if (src_dtype == DType::kF32) {
    FinalReduceFrom(reinterpret_cast<const float* const*>(srcs), m, none, DType::kF32, 1, 0, out,
                    out_dtype, n, accumulate);
  } else {
    FinalReduceFrom(reinterpret_cast<const bf16* const*>(srcs), m, none, DType::kF32, 1, 0, out,
                    out_dtype, n, accumulate);
  }
}

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
      if (device_ && !device_->IsDeviceMemory(recv, recv_bytes))
        err = fmt::format("recv ({} bytes at {}) is not memory of {}, where the reduction runs",
                          recv_bytes, recv, device_->name());
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
  const Registered& reg = *r.reg;  // host: reg.window; device: one node (K = 1), no partials
  const size_t es = DTypeSize(send_dtype);
  const size_t pe = DTypeSize(o.partial_dtype);
  const bool sr = o.partial_dtype == DType::kBF16;
  const size_t slice_bytes = count * es;
  const int p0 = rank();
  // Slice j of node member l's G′, read in place from its registered region.
  auto slice = [&](int l, int j) -> const char* {
    if (l == g.l0) return send + static_cast<size_t>(j) * slice_bytes;
    return reg.peer(l) + r.offset + static_cast<size_t>(j) * slice_bytes;
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
  if (device_) {
    device_->ReduceSlices(reinterpret_cast<const void* const*>(srcs.data()), send_dtype, g.L, recv,
                          recv_dtype, count, accumulate);
    device_->Complete();
  } else if (send_dtype == DType::kF32) {
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

}  // namespace sshsdp
