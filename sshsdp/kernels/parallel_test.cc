// ParallelFor: every index in exactly one chunk, chunks contiguous and in order of thread,
// several threads used when the work allows, the caller's thread alone when it does not; the
// default thread count of a rank without OMP_NUM_THREADS.
#include "sshsdp/kernels/parallel.h"

#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace sshsdp::kernels {
namespace {

struct Threads {
  explicit Threads(int n) : before(KernelThreads()) { SetKernelThreads(n); }
  ~Threads() { SetKernelThreads(before); }
  int before;
};

TEST(ParallelFor, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    Threads t(threads);
    for (int64_t n : {0, 1, 2, 7, 1000, 4099}) {
      for (int64_t grain : {1, 3, 64, 10000}) {
        std::vector<int> hits(static_cast<size_t>(n), 0);
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        ParallelFor(n, grain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) ++hits[i];
          std::lock_guard<std::mutex> lock(mu);
          chunks.emplace_back(b, e);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << threads << " " << n << " " << i;
        const int64_t most = n / grain;
        EXPECT_LE(static_cast<int64_t>(chunks.size()),
                  std::max<int64_t>(1, std::min<int64_t>(threads, most)))
            << "threads " << threads << " n " << n << " grain " << grain;
        EXPECT_EQ(chunks.empty(), n == 0);
      }
    }
  }
}

TEST(ParallelFor, UsesSeveralThreadsWhenWorkAllows) {
  Threads t(3);
  std::mutex mu;
  std::set<std::thread::id> ids;
  ParallelFor(3000, 10, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 3u);
}

TEST(ParallelFor, SmallWorkStaysOnTheCallersThread) {
  Threads t(3);
  std::thread::id seen;
  int calls = 0;
  ParallelFor(50, 40, [&](int64_t b, int64_t e) {
    seen = std::this_thread::get_id();
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 50);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, std::this_thread::get_id());
}

// Without OMP_NUM_THREADS: every allowed CPU where the node's ranks are bound to disjoint CPU
// sets, else an equal share of the CPUs their masks cover (never 0, never above what is
// allowed) — a cpuset's CPUs, not the host's.
TEST(DefaultKernelThreads, SharesTheNodesCpusAmongRanksThatShareThem) {
  EXPECT_EQ(DefaultKernelThreads(2, 2, 1, true), 2);     // one process: every CPU
  EXPECT_EQ(DefaultKernelThreads(2, 2, 4, false), 1);    // 4 unbound ranks on 2 CPUs
  EXPECT_EQ(DefaultKernelThreads(16, 16, 2, false), 8);  // 2 unbound ranks on 16 CPUs
  EXPECT_EQ(DefaultKernelThreads(16, 16, 3, false), 5);
  EXPECT_EQ(DefaultKernelThreads(8, 8, 8, false), 1);     // 8 ranks in an 8-CPU cpuset
  EXPECT_EQ(DefaultKernelThreads(1, 2, 2, true), 1);      // bound, one core each
  EXPECT_EQ(DefaultKernelThreads(4, 16, 4, true), 4);     // bound, --map-by slot:PE=4
  EXPECT_EQ(DefaultKernelThreads(16, 32, 3, false), 10);  // 3 ranks bound per socket, 2 sockets
  EXPECT_EQ(DefaultKernelThreads(0, 0, 0, false), 1);
}

}  // namespace
}  // namespace sshsdp::kernels
