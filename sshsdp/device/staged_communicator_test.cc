// StagedCommunicator against MpiCommunicator: every collective on device buffers (a backend
// whose memory faults when the host touches it, testing/guarded_backend.h — MPI handed a device
// pointer would die) gives the bits MPI gives on host copies of the same exact data, counts the
// same bytes, and stages exactly the bytes the call reads and writes. World size 1–4 ×
// counts 0, 1, 7, 4,099 × fp32 / bf16, in place at a ZeRO offset and out of place.
#include "sshsdp/device/staged_communicator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "sshsdp/backend/testing/guarded_backend.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/testing/mpi_test_util.h"

namespace sshsdp {
namespace {

using testing::mpi::Small;
using testing::mpi::WorldRank;
using testing::mpi::WorldSize;

constexpr size_t kCounts[] = {0, 1, 7, 4099};
constexpr DType kDtypes[] = {DType::kF32, DType::kBF16};

// count elements of dtype holding Small(rank, i + offset): exact in bf16 and in their sums.
std::vector<char> Data(size_t count, DType dt, int rank, size_t offset = 0) {
  std::vector<char> out(count * DTypeSize(dt));
  for (size_t i = 0; i < count; ++i) {
    const float v = Small(rank, i + offset);
    if (dt == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const bf16 h = FloatToBf16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// A buffer in the guarded backend's memory, with host copies in and out.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend& b, const std::vector<char>& host) : b_(b), bytes_(host.size()) {
    p_ = b_.Alloc(bytes_);
    b_.CopyIn(p_, host.data(), bytes_);
  }
  ~DeviceBuffer() { b_.Free(p_); }
  void* get() const { return p_; }
  std::vector<char> Host() const {
    std::vector<char> out(bytes_);
    b_.CopyOut(out.data(), p_, bytes_);
    return out;
  }

 private:
  Backend& b_;
  size_t bytes_;
  void* p_ = nullptr;
};

class StagedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mpi_ = MpiCommunicator::World(1);
    staged_ = std::make_unique<StagedCommunicator>(mpi_->Duplicate(), &device_);
  }
  // Runs `host_call` on MPI and `staged_call` on the staged communicator (inputs already in
  // place on both sides), then expects equal counters and `staged` bytes moved over PCIe.
  void Compare(const std::function<void()>& host_call, const std::function<void()>& staged_call,
               uint64_t staged) {
    const CommCounters m0 = mpi_->counters(), s0 = staged_->counters();
    const uint64_t b0 = staged_->staged_bytes();
    host_call();
    staged_call();
    const CommCounters m = Delta(mpi_->counters(), m0), s = Delta(staged_->counters(), s0);
    EXPECT_EQ(s.intra_node_bytes, m.intra_node_bytes);
    EXPECT_EQ(s.inter_node_bytes, m.inter_node_bytes);
    EXPECT_EQ(s.calls, m.calls);
    EXPECT_EQ(s.local_copy_bytes, m.local_copy_bytes);
    EXPECT_EQ(staged_->staged_bytes() - b0, staged);
  }

  testing::GuardedBackend device_;
  std::unique_ptr<Communicator> mpi_;
  std::unique_ptr<StagedCommunicator> staged_;
};

TEST_F(StagedTest, AllGatherInPlaceAtTheZeroOffsetAndOutOfPlace) {
  const int n = WorldSize(), r = WorldRank();
  for (DType dt : kDtypes)
    for (size_t c : kCounts) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dt) << " count " << c);
      const size_t e = DTypeSize(dt);
      // In place: this rank's shard at r·c, garbage (NaN-free 0x55 bytes) elsewhere.
      std::vector<char> buf(n * c * e, 0x55);
      const std::vector<char> mine = Data(c, dt, r);
      if (c) std::memcpy(buf.data() + r * c * e, mine.data(), c * e);
      DeviceBuffer dev(device_, buf);
      Compare([&] { mpi_->AllGatherInPlace(buf.data(), c, dt); },
              [&] { staged_->AllGatherInPlace(dev.get(), c, dt); }, n * c * e);
      EXPECT_EQ(dev.Host(), buf);
      // Out of place.
      std::vector<char> recv(n * c * e, 0x11);
      DeviceBuffer dsend(device_, mine), drecv(device_, recv);
      Compare([&] { mpi_->AllGather(mine.data(), recv.data(), c, dt); },
              [&] { staged_->AllGather(dsend.get(), drecv.get(), c, dt); }, (n + 1) * c * e);
      EXPECT_EQ(drecv.Host(), recv);
    }
}

TEST_F(StagedTest, ReduceScatterOverwriteAndAccumulate) {
  const int n = WorldSize(), r = WorldRank();
  for (DType sdt : kDtypes)
    for (DType rdt : kDtypes)
      for (bool acc : {false, true})
        for (size_t c : kCounts) {
          SCOPED_TRACE(::testing::Message() << DTypeName(sdt) << "→" << DTypeName(rdt)
                                            << (acc ? " accumulate" : "") << " count " << c);
          const std::vector<char> send = Data(n * c, sdt, r);
          std::vector<char> recv = Data(c, rdt, r + 5, 3);
          DeviceBuffer dsend(device_, send), drecv(device_, recv);
          const uint64_t staged = n * c * DTypeSize(sdt) + (acc ? 2 : 1) * c * DTypeSize(rdt);
          Compare([&] { mpi_->ReduceScatter(send.data(), sdt, recv.data(), rdt, c, acc); },
                  [&] { staged_->ReduceScatter(dsend.get(), sdt, drecv.get(), rdt, c, acc); },
                  staged);
          EXPECT_EQ(drecv.Host(), recv);
        }
}

TEST_F(StagedTest, AllReduceAndExchange) {
  const int n = WorldSize(), r = WorldRank();
  for (DType dt : kDtypes)
    for (size_t c : kCounts) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dt) << " count " << c);
      std::vector<char> buf = Data(c, dt, r);
      DeviceBuffer dev(device_, buf);
      Compare([&] { mpi_->AllReduce(buf.data(), c, dt); },
              [&] { staged_->AllReduce(dev.get(), c, dt); }, 2 * c * DTypeSize(dt));
      EXPECT_EQ(dev.Host(), buf);
    }
  // A ring: c + p bytes to the successor (two messages, tags 1 and 2), from the predecessor.
  for (size_t c : kCounts) {
    SCOPED_TRACE(::testing::Message() << "exchange count " << c);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    const std::vector<char> a = Data(c + r, DType::kF32, r), b = Data(3, DType::kBF16, r, c);
    std::vector<char> ra((c + prev) * 4, 0), rb(6, 0);
    DeviceBuffer da(device_, a), db(device_, b), dra(device_, ra), drb(device_, rb);
    auto ops = [&](void* sa, void* sb, void* xa, void* xb) {
      return std::pair{std::vector<P2POp>{{next, sa, a.size(), 1}, {next, sb, b.size(), 2}},
                       std::vector<P2POp>{{prev, xa, ra.size(), 1}, {prev, xb, rb.size(), 2}}};
    };
    auto host = ops(const_cast<char*>(a.data()), const_cast<char*>(b.data()), ra.data(), rb.data());
    auto dev = ops(da.get(), db.get(), dra.get(), drb.get());
    Compare([&] { mpi_->Exchange(host.first, host.second); },
            [&] { staged_->Exchange(dev.first, dev.second); },
            a.size() + b.size() + ra.size() + rb.size());
    EXPECT_EQ(dra.Host(), ra);
    EXPECT_EQ(drb.Host(), rb);
  }
}

TEST_F(StagedTest, SplitsStayStagedAndRefusals) {
  const int n = WorldSize(), r = WorldRank();
  std::unique_ptr<Communicator> half = staged_->Split(r % 2, r);
  ASSERT_NE(dynamic_cast<StagedCommunicator*>(half.get()), nullptr);
  EXPECT_EQ(half->size(), (n + 1 - r % 2) / 2);
  std::vector<char> buf = Data(5, DType::kF32, r);
  DeviceBuffer dev(device_, buf);
  half->AllReduce(dev.get(), 5, DType::kF32);  // MPI on the device pointer would fault
  std::vector<float> got(5);
  std::memcpy(got.data(), dev.Host().data(), 20);
  for (size_t i = 0; i < 5; ++i) {
    float want = 0;
    for (int q = r % 2; q < n; q += 2) want += Small(q, i);
    EXPECT_EQ(got[i], want) << i;
  }
  EXPECT_NE(dynamic_cast<StagedCommunicator*>(staged_->Duplicate().get()), nullptr);
  // Overlapping device buffers, and a backend with host memory (nothing to stage).
  DeviceBuffer big(device_, std::vector<char>(64 * n + 64));
  char* p = static_cast<char*>(big.get());
  EXPECT_THROW(staged_->ReduceScatter(p, DType::kF32, p + 4, DType::kF32, 4, false), CommError);
  EXPECT_THROW(staged_->AllGather(p + 4, p, 4, DType::kF32), CommError);
  // The in-place form (send = this rank's slot of recv) is an in-place all-gather, as on MPI.
  std::vector<char> slots(n * 16, 0x55), mine = Data(4, DType::kF32, r);
  std::memcpy(slots.data() + r * 16, mine.data(), 16);
  DeviceBuffer dslots(device_, slots);
  char* ds = static_cast<char*>(dslots.get());
  staged_->AllGather(ds + r * 16, ds, 4, DType::kF32);
  mpi_->AllGather(slots.data() + r * 16, slots.data(), 4, DType::kF32);
  EXPECT_EQ(dslots.Host(), slots);
  std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  try {
    StagedCommunicator s(mpi_->Duplicate(), cpu.get());
    ADD_FAILURE() << "a host-memory backend was accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("no staging needed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sshsdp
