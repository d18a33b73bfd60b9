// NcclCommunicator (nccl_communicator.h) against MpiCommunicator on the same inputs, as real
// processes under mpirun (one GPU per rank): every collective of the seam — all-gather in and
// out of place, reduce-scatter over fp32/bf16 send × fp32/bf16 recv × overwrite/accumulate,
// all-reduce, tagged exchanges, split and duplicate — at counts 0, 1, odd and large, with
// exact integer data, so the results must be equal bit for bit and the counters equal too.
// Also: a host buffer is refused by name.
//
// Exit 77 (ctest: skipped) on every rank when any rank has no usable GPU or this build has no
// NCCL, and when the ranks share one GPU under an NCCL that refuses that (before 2.30) — after
// checking that Create refuses it with a CommError naming the shared GPU.
//
//   mpirun -np 2 build/sshsdp/device/device_nccl_test
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/ring_bytes.h"
#include "sshsdp/comm/watchdog.h"
#include "sshsdp/device/nccl_communicator.h"
#include "sshsdp/device/testing/device_mpi_test.h"

namespace sshsdp {
namespace {

// Logical nodes for the counters' intra/inter split: pairs of ranks (0-1, 2-3, ...) when the
// world has an even size above 2, one rank per node otherwise.
int RanksPerNode(int world_size) { return world_size > 2 && world_size % 2 == 0 ? 2 : 1; }

using testing::Expect;

// Exact small integers in fp32 or bf16 (|v| <= 16, so sums over 8 ranks stay exact in bf16).
std::vector<uint8_t> Values(size_t count, DType dt, int seed) {
  std::vector<uint8_t> out(count * DTypeSize(dt));
  for (size_t i = 0; i < count; ++i) {
    const float v = static_cast<float>(static_cast<int>((i * 7 + seed * 13) % 33) - 16);
    if (dt == DType::kF32) {
      std::memcpy(out.data() + i * 4, &v, 4);
    } else {
      const bf16 b = FloatToBf16(v);
      std::memcpy(out.data() + i * 2, &b, 2);
    }
  }
  return out;
}

// A device copy of host bytes.
class DeviceBytes {
 public:
  DeviceBytes(Backend& b, const std::vector<uint8_t>& host) : b_(b), n_(host.size()) {
    p_ = b_.Alloc(n_ ? n_ : 1);
    if (n_) b_.CopyIn(p_, host.data(), n_);
  }
  ~DeviceBytes() { b_.Free(p_); }
  void* get() const { return p_; }
  std::vector<uint8_t> Host() const {
    std::vector<uint8_t> h(n_);
    if (n_) b_.CopyOut(h.data(), p_, n_);
    return h;
  }

 private:
  Backend& b_;
  size_t n_;
  void* p_ = nullptr;
};

void Compare(const std::vector<uint8_t>& mpi, const DeviceBytes& dev, const std::string& what) {
  Expect(dev.Host() == mpi, what + ": NCCL result differs from MPI's");
}

// What NCCL's counters exceed MPI's by: a bf16 all-reduce is reduced as fp32 throughout
// (nccl_communicator.h), where MPI's ring all-gathers bf16 — 2 more bytes per element it sends.
uint64_t Bf16AllReduceExtra(int n, int p, size_t count) {
  return RingAllReduceSendBytes(n, p, count, 4, 4) - RingAllReduceSendBytes(n, p, count, 4, 2);
}

void Collectives(Communicator& mpi, Communicator& nccl, Backend& gpu, const std::string& tag,
                 int ranks_per_node) {
  const int n = mpi.size(), p = mpi.rank();
  uint64_t extra = 0;  // NCCL's bytes beyond MPI's (bf16 all-reduce)
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const size_t e = DTypeSize(dt);
      const std::string at = fmt::format("{} count {} {}", tag, count, DTypeName(dt));
      // All-gather, in place and out of place.
      {
        std::vector<uint8_t> buf(n * count * e, 0), own = Values(count, dt, p);
        std::copy(own.begin(), own.end(), buf.begin() + static_cast<ptrdiff_t>(p * count * e));
        DeviceBytes d(gpu, buf);
        mpi.AllGatherInPlace(buf.data(), count, dt);
        nccl.AllGatherInPlace(d.get(), count, dt);
        Compare(buf, d, at + " AllGatherInPlace");
        std::vector<uint8_t> out(n * count * e, 0xAB);
        DeviceBytes ds(gpu, own), dr(gpu, out);
        mpi.AllGather(own.data(), out.data(), count, dt);
        nccl.AllGather(ds.get(), dr.get(), count, dt);
        Compare(out, dr, at + " AllGather");
      }
      // Reduce-scatter into fp32 and bf16, overwriting and accumulating.
      for (DType rdt : {DType::kF32, DType::kBF16}) {
        for (bool acc : {false, true}) {
          std::vector<uint8_t> send = Values(n * count, dt, p + 1);
          std::vector<uint8_t> recv = Values(count, rdt, 5);
          DeviceBytes ds(gpu, send), dr(gpu, recv);
          mpi.ReduceScatter(send.data(), dt, recv.data(), rdt, count, acc);
          nccl.ReduceScatter(ds.get(), dt, dr.get(), rdt, count, acc);
          Compare(recv, dr,
                  fmt::format("{} ReduceScatter to {} accumulate={}", at, DTypeName(rdt), acc));
        }
      }
      // All-reduce.
      {
        std::vector<uint8_t> buf = Values(count, dt, p + 2);
        DeviceBytes d(gpu, buf);
        mpi.AllReduce(buf.data(), count, dt);
        nccl.AllReduce(d.get(), count, dt);
        if (dt == DType::kBF16 && count > 0) extra += Bf16AllReduceExtra(n, p, count);
        Compare(buf, d, at + " AllReduce");
      }
    }
    // Exchange around the ring: two tagged messages to the successor, posted in reverse tag
    // order on the receiving side.
    {
      const int next = (p + 1) % n, prev = (p + n - 1) % n;
      std::vector<uint8_t> a = Values(count, DType::kF32, p), b = Values(count + 3, DType::kF32, p);
      std::vector<uint8_t> ra(a.size()), rb(b.size());
      DeviceBytes da(gpu, a), db(gpu, b), dra(gpu, ra), drb(gpu, rb);
      mpi.Exchange({{next, a.data(), a.size(), 7}, {next, b.data(), b.size(), 3}},
                   {{prev, rb.data(), rb.size(), 3}, {prev, ra.data(), ra.size(), 7}});
      nccl.Exchange({{next, da.get(), a.size(), 7}, {next, db.get(), b.size(), 3}},
                    {{prev, drb.get(), rb.size(), 3}, {prev, dra.get(), ra.size(), 7}});
      Compare(ra, dra, fmt::format("{} count {} Exchange tag 7", tag, count));
      Compare(rb, drb, fmt::format("{} count {} Exchange tag 3", tag, count));
    }
  }
  mpi.Barrier();
  nccl.Barrier();
  CommCounters a = mpi.counters();
  const CommCounters& b = nccl.counters();
  // The all-reduce sends to the successor: its extra bytes are on that link's side.
  const int next = (p + 1) % n;
  if (mpi.world_rank(next) / ranks_per_node == mpi.world_rank(p) / ranks_per_node) {
    a.intra_node_bytes += extra;
  } else {
    a.inter_node_bytes += extra;
  }
  Expect(a.intra_node_bytes == b.intra_node_bytes && a.inter_node_bytes == b.inter_node_bytes &&
             a.calls == b.calls && a.local_copy_bytes == b.local_copy_bytes,
         fmt::format("{}: counters MPI intra {} inter {} calls {} local {} vs NCCL {} {} {} {}",
                     tag, a.intra_node_bytes, a.inter_node_bytes, a.calls, a.local_copy_bytes,
                     b.intra_node_bytes, b.inter_node_bytes, b.calls, b.local_copy_bytes));
}

void HostBufferRefused(Communicator& nccl) {
  std::vector<float> host(4 * nccl.size());
  try {
    nccl.AllGatherInPlace(host.data(), 4, DType::kF32);
    Expect(false, "a host buffer was accepted by AllGatherInPlace");
  } catch (const CommError& e) {
    Expect(std::string(e.what()).find("host memory") != std::string::npos,
           std::string("host buffer refused with an unclear message: ") + e.what());
  }
}

int Run(int argc, char** argv) {
  MpiRuntime runtime(&argc, &argv);
  SetCommTimeout(120);  // a rank that hangs ends the job well inside ctest's timeout
  const int rpn = RanksPerNode(WorldSize());
  auto world = MpiCommunicator::World(rpn);
  const int rank = world->rank();
  // Skip unless every rank has NCCL and a GPU.
  if (!NcclCompiled()) {  // the same build on every rank
    if (rank == 0) std::printf("skipped: this build has no NCCL (needs CUDA and nccl.h)\n");
    return 77;
  }
  if (!testing::EveryRankHasGpu(*world)) return 77;
  const int ordinal = testing::LocalGpuOrdinal(rank);
  std::unique_ptr<Backend> gpu = MakeBackend(fmt::format("cuda:{}", ordinal));
  std::unique_ptr<NcclCommunicator> nccl;
  try {
    nccl = NcclCommunicator::Create(world->Duplicate(), gpu.get(), rpn);
  } catch (const CommError& e) {
    const bool shared = std::string(e.what()).find("share") != std::string::npos;
    if (rank == 0) std::printf("%s\n", e.what());
    if (!shared) return 1;
    if (rank == 0)
      std::printf(
          "skipped: the ranks share a GPU and NCCL %s refuses that (checked: the "
          "refusal names them); run one rank per GPU\n",
          NcclVersion().c_str());
    return 77;
  }
  if (rank == 0)
    std::printf("NCCL %s, %d ranks, rank 0 on %s\n", NcclVersion().c_str(), world->size(),
                gpu->name().c_str());
  auto mpi = world->Duplicate();
  Collectives(*mpi, *nccl, *gpu, "world", rpn);
  auto mpi_split = mpi->Split(rank % 2, rank);
  auto nccl_split = nccl->Split(rank % 2, rank);
  Collectives(*mpi_split, *nccl_split, *gpu, "split", rpn);
  auto nccl_dup = nccl->Duplicate();
  auto mpi_dup = mpi->Duplicate();
  Collectives(*mpi_dup, *nccl_dup, *gpu, "duplicate", rpn);
  HostBufferRefused(*nccl);
  return testing::FinishChecks(*world);
}

}  // namespace
}  // namespace sshsdp

int main(int argc, char** argv) {
  return sshsdp::testing::RunMain("device_nccl_test", sshsdp::Run, argc, argv);
}
