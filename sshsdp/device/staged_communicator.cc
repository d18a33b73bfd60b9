// StagedCommunicator (staged_communicator.h): device buffers over a host-memory communicator,
// through one host buffer — copy out what the call reads, run the inner call, copy back what
// it wrote. Offsets inside the host buffer are 64-byte aligned so any dtype's elements are.
#include "sshsdp/device/staged_communicator.h"

#include <utility>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

constexpr size_t Aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> inner, Backend* device)
    : inner_(std::move(inner)), device_(device) {
  SSHSDP_CHECK(inner_ != nullptr && device_ != nullptr, CommError,
               "StagedCommunicator needs an inner communicator and a backend");
  SSHSDP_CHECK(!device_->host_memory(), CommError,
               "StagedCommunicator over {}: backend {} has host memory, which {} moves itself "
               "(no staging needed)",
               inner_->name(), device_->name(), inner_->name());
  copies_ = device_->NewStream();
}

StagedCommunicator::~StagedCommunicator() { copies_->FreeHost(host_); }

void StagedCommunicator::Reserve(size_t bytes) {
  if (bytes <= host_bytes_) return;
  char* grown = static_cast<char*>(copies_->AllocHost(bytes));  // nothing kept across calls
  copies_->FreeHost(host_);
  host_ = grown;
  host_bytes_ = bytes;
}

char* StagedCommunicator::Host(size_t bytes) {
  Reserve(bytes);
  return host_;
}

void StagedCommunicator::ToHost(void* host, const void* dev, size_t bytes) {
  if (bytes == 0) return;
  copies_->CopyOut(host, dev, bytes);
  staged_bytes_ += bytes;
}

void StagedCommunicator::ToDevice(void* dev, const void* host, size_t bytes) {
  if (bytes == 0) return;
  copies_->CopyIn(dev, host, bytes);
  staged_bytes_ += bytes;
}

template <typename F>
void StagedCommunicator::Counted(F&& call) {
  const CommCounters before = inner_->counters();
  call();
  counters_ += Delta(inner_->counters(), before);
}

void StagedCommunicator::AllGatherInPlace(void* buf, size_t count, DType dtype) {
  const size_t e = DTypeSize(dtype), shard = count * e, total = shard * size();
  char* h = Host(total);
  char* dev = static_cast<char*>(buf);
  const size_t mine = static_cast<size_t>(rank()) * shard;
  ToHost(h + mine, dev + mine, shard);
  Counted([&] { inner_->AllGatherInPlace(count ? h : buf, count, dtype); });
  ToDevice(dev, h, mine);  // the other members' shards: before and after this rank's
  ToDevice(dev + mine + shard, h + mine + shard, total - mine - shard);
}

void StagedCommunicator::AllGather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t shard = count * DTypeSize(dtype), total = shard * size();
  // The in-place form MPI accepts: send is this rank's slot of recv.
  if (count && send == static_cast<const char*>(recv) + static_cast<size_t>(rank()) * shard)
    return AllGatherInPlace(recv, count, dtype);
  SSHSDP_CHECK(!Overlaps(send, shard, recv, total), CommError,
               "{}: AllGather's send and recv overlap in device memory", name());
  char* h = Host(Aligned(shard) + total);
  ToHost(h, send, shard);
  Counted([&] {
    inner_->AllGather(count ? h : send, count ? h + Aligned(shard) : recv, count, dtype);
  });
  ToDevice(recv, h + Aligned(shard), total);
}

void StagedCommunicator::ReduceScatterPartials(const void* send, DType send_dtype, void* recv,
                                               DType recv_dtype, size_t count, bool accumulate,
                                               const ReduceScatterOptions& options) {
  const size_t send_bytes = count * size() * DTypeSize(send_dtype);
  const size_t recv_bytes = count * DTypeSize(recv_dtype);
  SSHSDP_CHECK(!Overlaps(send, send_bytes, recv, recv_bytes), CommError,
               "{}: ReduceScatter's send and recv overlap in device memory", name());
  char* h = Host(Aligned(send_bytes) + recv_bytes);
  char* h_recv = h + Aligned(send_bytes);
  ToHost(h, send, send_bytes);
  if (accumulate) ToHost(h_recv, recv, recv_bytes);
  Counted([&] {
    inner_->ReduceScatterPartials(count ? h : send, send_dtype, count ? h_recv : recv, recv_dtype,
                                  count, accumulate, options);
  });
  ToDevice(recv, h_recv, recv_bytes);
}

void StagedCommunicator::ReduceScatter(const void* send, DType send_dtype, void* recv,
                                       DType recv_dtype, size_t count, bool accumulate) {
  ReduceScatterPartials(send, send_dtype, recv, recv_dtype, count, accumulate, {});
}

void StagedCommunicator::AllReduce(void* buf, size_t count, DType dtype) {
  const size_t bytes = count * DTypeSize(dtype);
  char* h = Host(bytes);
  ToHost(h, buf, bytes);
  Counted([&] { inner_->AllReduce(count ? h : buf, count, dtype); });
  ToDevice(buf, h, bytes);
}

void StagedCommunicator::Exchange(const std::vector<P2POp>& sends,
                                  const std::vector<P2POp>& recvs) {
  size_t total = 0;
  for (const P2POp& op : sends) total += Aligned(op.bytes);
  for (const P2POp& op : recvs) total += Aligned(op.bytes);
  char* h = Host(total);
  std::vector<P2POp> hs = sends, hr = recvs;
  size_t at = 0;
  for (P2POp& op : hs) {
    if (op.bytes == 0) {
      op.data = nullptr;  // nothing to read: no device pointer reaches the inner communicator
      continue;
    }
    ToHost(h + at, op.data, op.bytes);
    op.data = h + at;
    at += Aligned(op.bytes);
  }
  for (P2POp& op : hr) {
    if (op.bytes == 0) {
      op.data = nullptr;
      continue;
    }
    op.data = h + at;
    at += Aligned(op.bytes);
  }
  Counted([&] { inner_->Exchange(hs, hr); });
  for (size_t i = 0; i < recvs.size(); ++i) ToDevice(recvs[i].data, hr[i].data, recvs[i].bytes);
}

void StagedCommunicator::Barrier() {
  Counted([&] { inner_->Barrier(); });
}

std::unique_ptr<Communicator> StagedCommunicator::Split(int color, int key) {
  return std::make_unique<StagedCommunicator>(inner_->Split(color, key), device_);
}

std::unique_ptr<Communicator> StagedCommunicator::Duplicate() {
  return std::make_unique<StagedCommunicator>(inner_->Duplicate(), device_);
}

}  // namespace sshsdp
