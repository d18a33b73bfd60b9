// DirectCommunicator all-gather: inter-node first — puts into the counterparts on the other
// nodes, then the intra-node broadcast through the shared window (see direct_communicator.h).
#include "sshsdp/comm/direct_communicator.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/direct_internal.h"

namespace sshsdp {

using namespace direct_internal;

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
      if (device_ && !in_place && !device_->IsDeviceMemory(send, shard))
        err = fmt::format(
            "send ({} bytes at {}) is not memory of {}, where the registered "
            "buffers live",
            shard, send, device_->name());
    }
  }
  counters_.calls++;
  Rendezvous(d, where, err);
  if (count == 0) return;
  if (!in_place) {
    if (device_) {
      device_->Copy(out + static_cast<size_t>(p) * shard, send, shard);
    } else {
      std::memcpy(out + static_cast<size_t>(p) * shard, send, shard);
    }
    counters_.local_copy_bytes += shard;
  }
  if (n == 1) {
    if (device_) device_->Complete();
    return;
  }
  DoAllGather(static_cast<const char*>(send), out, r, count, e, in_place, s);
}

void DirectCommunicator::DoAllGather(const char* own, char* recv, const Resolved& r, size_t count,
                                     size_t e, bool /*in_place*/, uint64_t s) {
  const NodeGeometry& g = geo_;
  const Registered& reg = *r.reg;  // host: reg.window; device: one node (K = 1), no RMA
  const size_t shard = count * e;
  const int p0 = rank();
  auto at_offset = [&](int position) { return r.offset + static_cast<size_t>(position) * shard; };
  // 1. Inter-node first: this rank's shard into each counterpart on the other nodes.
  for (int k = 0; k < g.K; ++k) {
    if (k == g.k0) continue;
    const int t = g.at[k][g.l0];
    reg.window->Put(own, shard, t, at_offset(p0));
    CountTo(t, shard);
  }
  // 2. While those fly: this rank's shard into every node peer's buffer (shared window, or a
  //    device copy into the peer's mapped region).
  for (int l = 0; l < g.L; ++l) {
    if (l == g.l0) continue;
    if (device_) {
      device_->Copy(reg.peer(l) + at_offset(p0), own, shard);
    } else {
      std::memcpy(reg.peer(l) + at_offset(p0), own, shard);
    }
    CountTo(g.at[g.k0][l], shard);
  }
  // 3. Remote completion, then the arrival flag (flag seen => data complete).
  for (int k = 0; k < g.K; ++k) {
    if (k == g.k0) continue;
    const int t = g.at[k][g.l0];
    reg.window->Flush(t);
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
        reg.window->Sync();
        const int src = g.at[k][g.l0];
        for (int l = 0; l < g.L; ++l) {
          if (l == g.l0) continue;
          std::memcpy(reg.peer(l) + at_offset(src), recv + static_cast<size_t>(src) * shard, shard);
          CountTo(g.at[g.k0][l], shard);
        }
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        progressed = true;
      }
      if (!progressed) backoff.Pause();
    }
  }
  // 5. Pushes into node peers are complete; wait until theirs into this buffer are.
  if (device_) {
    device_->Complete();
  } else {
    reg.window->Sync();
  }
  SignalDone(s);
  WaitDone(s, "AllGather");
  if (!device_) reg.window->Sync();
}

}  // namespace sshsdp
