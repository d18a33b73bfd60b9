// Single-process tests of CommThread: FIFO order on a separate thread, exceptions rethrown
// by Wait and by Drain (never lost), Ready, draining destructor, and the destructor's
// unwinding path that must not block an abort behind a task that cannot finish.
#include "sshsdp/comm/comm_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

using namespace std::chrono_literals;

TEST(CommThread, RunsTasksInFifoOrderOnItsOwnThread) {
  std::vector<int> order;
  std::vector<std::thread::id> ids;
  {
    CommThread t("fifo");
    for (int i = 0; i < 200; ++i) {
      t.Submit([&, i] {
        order.push_back(i);
        ids.push_back(std::this_thread::get_id());
      });
    }
    t.Drain();
    EXPECT_EQ(t.pending(), 0u);
  }
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  for (auto id : ids) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, ids[0]);
  }
}

TEST(CommThread, WaitRethrowsAndLaterTasksStillRun) {
  CommThread t;
  CommHandle bad = t.Submit([] { throw CommError("boom from the comm thread"); });
  std::atomic<bool> later{false};
  CommHandle good = t.Submit([&] { later = true; });
  try {
    bad.Wait();
    FAIL() << "Wait did not rethrow";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "boom from the comm thread");
  }
  EXPECT_THROW(bad.Wait(), CommError);  // every Wait rethrows
  good.Wait();
  EXPECT_TRUE(later);
  EXPECT_NO_THROW(t.Drain());  // the failure was observed by Wait
}

TEST(CommThread, DrainRethrowsAFailureNobodyWaitedFor) {
  CommThread t;
  t.Submit([] { throw std::runtime_error("fire and forget failed"); });
  t.Submit([] {});
  EXPECT_THROW(t.Drain(), std::runtime_error);
  EXPECT_NO_THROW(t.Drain());  // reported once
}

TEST(CommThread, ReadyFollowsCompletion) {
  EXPECT_TRUE(CommHandle().Ready());
  CommHandle().Wait();  // an empty handle never blocks
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  CommThread t;
  CommHandle h = t.Submit([open] { open.wait(); });
  CommHandle next = t.Submit([] {});
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(h.Ready());
  EXPECT_FALSE(next.Ready());  // FIFO: queued behind the blocked task
  EXPECT_EQ(t.pending(), 2u);
  gate.set_value();
  next.Wait();
  EXPECT_TRUE(h.Ready());
  EXPECT_TRUE(next.Ready());
}

TEST(CommThread, DestructorDrainsTheQueue) {
  std::atomic<int> done{0};
  {
    CommThread t;
    for (int i = 0; i < 20; ++i) {
      t.Submit([&] {
        std::this_thread::sleep_for(1ms);
        ++done;
      });
    }
  }
  EXPECT_EQ(done.load(), 20);
}

TEST(CommThread, RejectsEmptyTask) {
  CommThread t("named");
  try {
    t.Submit(nullptr);
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("CommThread 'named': Submit of an empty task"),
              std::string::npos);
  }
}

// While an exception unwinds (on its way to RunMpiMain's MPI_Abort), the destructor drops
// queued tasks and abandons a running one after the grace period instead of hanging.
TEST(CommThread, DestructorDuringUnwindingDoesNotBlock) {
  auto gate = std::make_shared<std::promise<void>>();
  std::shared_future<void> open = gate->get_future().share();
  auto started = std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool> queued_ran{false};
  CommHandle running, queued;
  auto t0 = std::chrono::steady_clock::now();
  try {
    CommThread t("unwind");
    t.set_unwind_grace(100ms);
    running = t.Submit([open, started] {
      *started = true;
      open.wait();  // stands for a collective whose peers never arrive
    });
    queued = t.Submit([&] { queued_ran = true; });
    while (!*started) std::this_thread::sleep_for(1ms);
    throw std::runtime_error("main thread failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_FALSE(queued_ran);
  ASSERT_TRUE(queued.Ready());
  try {
    queued.Wait();
    FAIL() << "a dropped task must report why it did not run";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("destroyed during exception unwinding"),
              std::string::npos);
  }
  EXPECT_FALSE(running.Ready());
  gate->set_value();  // the abandoned worker finishes on its own
  running.Wait();
}

}  // namespace
}  // namespace sshsdp
