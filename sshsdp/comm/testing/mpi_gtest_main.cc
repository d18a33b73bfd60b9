// main() of every multi-rank GoogleTest binary (sshsdp_mpi_test): all ranks run the same
// tests in the same order, and the job fails on every rank if any rank fails.
//
// Why it is shaped like this:
// * Only rank 0 keeps GoogleTest's default printer (one readable report), but every rank
//   prints its own failures prefixed with "[rank R]", so a failure seen only by rank 5
//   is not lost.
// * After the run, a MAX all-reduce of the failure flag makes every rank return non-zero
//   if any rank failed (mpirun may report only one rank's exit code).
// * A rank must never leave the others hanging in a collective. With more than one rank:
//   an exception escaping a test is not caught by GoogleTest (catch_exceptions = false) but
//   reaches RunMpiMain, which prints it with the rank and aborts the job; a fatal assertion
//   (ASSERT_*) prints the failure and aborts the job too, since the failing rank would skip
//   the rest of the test's collectives while its peers wait for them.
//
// Usage (CMake): sshsdp_mpi_test(NAME x SOURCES x_test.cc LIBS ... RANKS 1 2 4)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "sshsdp/comm/mpi_runtime.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  RankFailurePrinter(int rank, int size) : rank_(rank), size_(size) {}

  void OnTestStart(const ::testing::TestInfo& info) override {
    current_ = std::string(info.test_suite_name()) + "." + info.name();
  }

  // Called with GoogleTest's internal lock held: must not call back into UnitTest (e.g.
  // current_test_info()), hence the name recorded in OnTestStart.
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    const std::string& where = current_;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: Failure\n%s\n", rank_, where.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stderr);
    if (r.fatally_failed() && size_ > 1) {
      sshsdp::AbortJob("fatal assertion failed in " + where +
                       " (aborting: the other ranks would wait for this one's collectives)");
    }
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
      std::fflush(stderr);
    }
  }

 private:
  int rank_, size_;
  std::string current_ = "(outside a test)";
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return sshsdp::RunMpiMain(argc, argv, [] {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) GTEST_FLAG_SET(catch_exceptions, false);
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (rank != 0) delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank, size));
    int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    sshsdp::CheckMpi(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
                     "mpi_gtest_main: MPI_Allreduce of the failure flag");
    if (failed && rank == 0) std::fprintf(stderr, "FAILED on at least one rank\n");
    return failed;
  });
}
