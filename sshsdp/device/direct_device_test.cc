// The direct path on device buffers (comm/direct_device.h) against the direct path on host
// buffers, as real processes under mpirun on one node: the same collectives on the same bits —
// all-gather in place at a ZeRO offset and out of place, reduce-scatter over fp32/bf16 G′ ×
// fp32/bf16 recv × overwrite/accumulate, all-reduce and a tagged ring exchange (staged through
// host memory), at counts 0, 1, odd and large, on pseudo-random floats of every sign and many
// binades — must give equal bytes and equal counters. Also: host buffers are refused in device
// mode, and a group spanning several nodes is refused at Create.
//
//   device_direct_test --memory=shm    # POSIX shared memory standing in for a device: the
//                                      # device-mode control flow, on every CI machine
//   device_direct_test --memory=cuda   # CUDA IPC on the GPU(s); several ranks may share one
//                                      # GPU. Exit 77 (skipped) without CUDA or a GPU.
//
//   mpirun -np 3 build/sshsdp/device/device_direct_test --memory=shm
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/comm/direct_communicator.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/testing/shm_device_memory.h"
#include "sshsdp/comm/watchdog.h"
#include "sshsdp/device/cuda_direct_memory.h"
#include "sshsdp/device/testing/device_mpi_test.h"

namespace sshsdp {
namespace {

using testing::Expect;

// Pseudo-random bits of element i of stream `seed`: floats of both signs over ~40 binades
// (no NaN or Inf, so every sum is defined), bf16 as the top half of such a float.
std::vector<uint8_t> Values(size_t count, DType dt, uint32_t seed) {
  std::vector<uint8_t> out(count * DTypeSize(dt));
  for (size_t i = 0; i < count; ++i) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (seed * 40503u + 0x9E3779B9u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const uint32_t exponent = 107 + (h >> 24) % 40;  // 2^-20 .. 2^19
    const uint32_t bits = (h & 0x80000000u) | (exponent << 23) | (h & 0x7FFFFFu);
    if (dt == DType::kF32) {
      std::memcpy(out.data() + i * 4, &bits, 4);
    } else {
      const uint16_t b = static_cast<uint16_t>(bits >> 16);
      std::memcpy(out.data() + i * 2, &b, 2);
    }
  }
  return out;
}

// Device memory for buffers outside registered roots, and copies to and from it.
struct Device {
  DirectDeviceMemory* mem = nullptr;
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> free;
};

class DeviceBytes {
 public:
  DeviceBytes(Device& d, const std::vector<uint8_t>& host) : d_(d), n_(host.size()) {
    p_ = d_.alloc(n_ ? n_ : 1);
    d_.mem->FromHost(p_, host.data(), n_);
  }
  ~DeviceBytes() { d_.free(p_); }
  void* get() const { return p_; }

 private:
  Device& d_;
  size_t n_;
  void* p_ = nullptr;
};

std::vector<uint8_t> ToHost(Device& d, const void* p, size_t n) {
  std::vector<uint8_t> h(n);
  d.mem->ToHost(h.data(), p, n);
  return h;
}

void Same(const std::vector<uint8_t>& host, Device& d, const void* dev, const std::string& what) {
  const std::vector<uint8_t> got = ToHost(d, dev, host.size());
  size_t first = 0;
  while (first < host.size() && host[first] == got[first]) ++first;
  Expect(first == host.size(),
         fmt::format("{}: device result differs from the host direct path at byte {} of {}", what,
                     first, host.size()));
}

// A registered root: 256 bytes of padding, then `bytes` of buffer (collectives run at a
// non-zero offset of the window, as ZeRO shards do).
char* RegisterBuffer(DirectCommunicator& c, const char* name, size_t bytes) {
  auto root = std::make_unique<DataNode>(name);
  root->AddChild("pad", DType::kUE8M0, {256}, DataNode::kAuto, 64);
  root->AddChild("buf", DType::kUE8M0, {static_cast<int64_t>(bytes)}, DataNode::kAuto, 64);
  root->Finalize();
  return c.Register(std::move(root)).FindChild("buf")->data_as<char>();
}

constexpr size_t kCounts[] = {0, 1, 7, 1000, 4099};
constexpr size_t kMaxCount = 4099;

void Collectives(DirectCommunicator& host, DirectCommunicator& dev, Device& d) {
  const int n = host.size(), p = host.rank();
  char* hbuf = RegisterBuffer(host, "host", n * kMaxCount * 4);
  char* dbuf = RegisterBuffer(dev, "device", n * kMaxCount * 4);
  for (size_t count : kCounts) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const size_t e = DTypeSize(dt), shard = count * e;
      const std::string at = fmt::format("count {} {}", count, DTypeName(dt));
      {  // All-gather in place: this rank's shard at its slot, garbage elsewhere.
        std::vector<uint8_t> buf(n * shard, 0xCD);
        const std::vector<uint8_t> own = Values(count, dt, p);
        std::copy(own.begin(), own.end(), buf.begin() + static_cast<ptrdiff_t>(p * shard));
        if (!buf.empty()) std::memcpy(hbuf, buf.data(), buf.size());  // count 0: data() may be null
        d.mem->FromHost(dbuf, buf.data(), buf.size());
        host.AllGatherInPlace(hbuf, count, dt);
        dev.AllGatherInPlace(dbuf, count, dt);
        Same({hbuf, hbuf + n * shard}, d, dbuf, at + " AllGatherInPlace");
        // Out of place, from a buffer outside the window.
        DeviceBytes send(d, own);
        host.AllGather(own.data(), hbuf, count, dt);
        dev.AllGather(send.get(), dbuf, count, dt);
        Same({hbuf, hbuf + n * shard}, d, dbuf, at + " AllGather");
      }
      for (DType rdt : {DType::kF32, DType::kBF16}) {
        for (bool acc : {false, true}) {
          const std::vector<uint8_t> g = Values(n * count, dt, 100 + p);
          if (!g.empty()) std::memcpy(hbuf, g.data(), g.size());
          d.mem->FromHost(dbuf, g.data(), g.size());
          std::vector<uint8_t> recv = Values(count, rdt, 7);
          DeviceBytes drecv(d, recv);
          host.ReduceScatter(hbuf, dt, recv.data(), rdt, count, acc);
          dev.ReduceScatter(dbuf, dt, drecv.get(), rdt, count, acc);
          Same(recv, d, drecv.get(),
               fmt::format("{} ReduceScatter to {} accumulate={}", at, DTypeName(rdt), acc));
        }
      }
      {  // All-reduce of a device buffer (staged through host memory).
        std::vector<uint8_t> buf = Values(count, dt, 200 + p);
        DeviceBytes dbuf_ar(d, buf);
        host.AllReduce(buf.data(), count, dt);
        dev.AllReduce(dbuf_ar.get(), count, dt);
        Same(buf, d, dbuf_ar.get(), at + " AllReduce");
      }
    }
    {  // Ring exchange of two tagged messages (staged through host memory).
      const int next = (p + 1) % n, prev = (p + n - 1) % n;
      const std::vector<uint8_t> a = Values(count, DType::kF32, p),
                                 b = Values(count + 5, DType::kBF16, p);
      std::vector<uint8_t> ra(a.size()), rb(b.size());
      DeviceBytes da(d, a), db(d, b), dra(d, ra), drb(d, rb);
      host.Exchange({{next, const_cast<uint8_t*>(a.data()), a.size(), 7},
                     {next, const_cast<uint8_t*>(b.data()), b.size(), 3}},
                    {{prev, rb.data(), rb.size(), 3}, {prev, ra.data(), ra.size(), 7}});
      dev.Exchange({{next, da.get(), a.size(), 7}, {next, db.get(), b.size(), 3}},
                   {{prev, drb.get(), rb.size(), 3}, {prev, dra.get(), ra.size(), 7}});
      Same(ra, d, dra.get(), fmt::format("count {} Exchange tag 7", count));
      Same(rb, d, drb.get(), fmt::format("count {} Exchange tag 3", count));
    }
  }
  const CommCounters &a = host.counters(), &b = dev.counters();
  Expect(a.intra_node_bytes == b.intra_node_bytes && a.inter_node_bytes == b.inter_node_bytes &&
             a.calls == b.calls && a.local_copy_bytes == b.local_copy_bytes,
         fmt::format("counters host intra {} inter {} calls {} local {} vs device {} {} {} {}",
                     a.intra_node_bytes, a.inter_node_bytes, a.calls, a.local_copy_bytes,
                     b.intra_node_bytes, b.inter_node_bytes, b.calls, b.local_copy_bytes));
  // Device mode refuses a host send buffer, on every member, before any transfer.
  std::vector<uint8_t> own = Values(4, DType::kF32, p);
  try {
    dev.AllGather(own.data(), dbuf, 4, DType::kF32);
    Expect(false, "device mode accepted a host send buffer");
  } catch (const CommError& e) {
    Expect(std::string(e.what()).find("is not memory of") != std::string::npos,
           std::string("host send refused with an unclear message: ") + e.what());
  }
}

int Run(int argc, char** argv) {
  MpiRuntime runtime(&argc, &argv);
  SetCommTimeout(120);  // a rank that hangs ends the job well inside ctest's timeout
  std::string memory = "shm";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--memory=", 9) == 0) memory = argv[i] + 9;
  const int n = WorldSize();
  auto world = MpiCommunicator::World(n);
  const int rank = world->rank();
  Device d;
  std::unique_ptr<testing::ShmDeviceMemory> shm;
  std::unique_ptr<Backend> gpu;
  std::unique_ptr<DirectDeviceMemory> cuda;
  if (memory == "shm") {
    shm = std::make_unique<testing::ShmDeviceMemory>();
    d.mem = shm.get();
    d.alloc = [&](size_t bytes) { return shm->Alloc(bytes); };
    d.free = [](void*) {};  // unmapped with the stand-in
  } else if (memory == "cuda") {
    if (!testing::EveryRankHasGpu(*world)) return 77;
    gpu = MakeBackend(fmt::format("cuda:{}", testing::LocalGpuOrdinal(rank)));
    cuda = MakeCudaDirectMemory(*gpu);
    d.mem = cuda.get();
    d.alloc = [&](size_t bytes) { return gpu->Alloc(bytes); };
    d.free = [&](void* p) { gpu->Free(p); };
  } else {
    std::fprintf(stderr, "device_direct_test: --memory must be shm or cuda, got '%s'\n",
                 memory.c_str());
    return 2;
  }
  if (rank == 0) std::printf("direct path on %s, %d ranks on one node\n", d.mem->name().c_str(), n);
  {
    auto host = DirectCommunicator::Create(MpiCommunicator::World(n));
    auto dev = DirectCommunicator::Create(MpiCommunicator::World(n), d.mem);
    Collectives(*host, *dev, d);
    // Splits and duplicates keep the device (a sub-group registers its own roots).
    auto host_split = host->Split(rank % 2, rank);
    auto dev_split = dev->Split(rank % 2, rank);
    Collectives(dynamic_cast<DirectCommunicator&>(*host_split),
                dynamic_cast<DirectCommunicator&>(*dev_split), d);
  }
  if (n > 1) {  // one rank per node: K = n nodes, refused for device buffers
    try {
      DirectCommunicator::Create(MpiCommunicator::World(1), d.mem);
      Expect(false, "device mode accepted a group spanning several nodes");
    } catch (const CommError& e) {
      Expect(std::string(e.what()).find("one node") != std::string::npos,
             std::string("multi-node device group refused with an unclear message: ") + e.what());
    }
  }
  return testing::FinishChecks(*world);
}

}  // namespace
}  // namespace sshsdp

int main(int argc, char** argv) {
  return sshsdp::testing::RunMain("device_direct_test", sshsdp::Run, argc, argv);
}
