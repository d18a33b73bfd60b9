// Multi-rank tests of MpiRuntime's guarantees (run through mpi_gtest_main, which creates the
// runtime): thread level MPI_THREAD_MULTIPLE, MPI_ERRORS_RETURN on the world, and MPI error
// codes turned into CommError carrying MPI_Error_string.
#include "sshsdp/comm/mpi_runtime.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

TEST(MpiRuntime, ProvidesThreadMultiple) {
  int level = -1;
  ASSERT_EQ(MPI_Query_thread(&level), MPI_SUCCESS);
  EXPECT_EQ(level, MPI_THREAD_MULTIPLE);
  EXPECT_STREQ(MpiThreadLevelName(MPI_THREAD_MULTIPLE), "MPI_THREAD_MULTIPLE");
  EXPECT_STREQ(MpiThreadLevelName(MPI_THREAD_FUNNELED), "MPI_THREAD_FUNNELED");
}

TEST(MpiRuntime, ConstructingAgainChecksTheExistingLevel) {
  int argc = 0;
  char** argv = nullptr;
  MpiRuntime again(&argc, &argv);  // MPI already initialised: checks, does not finalise
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(again.world_size(), size);
  EXPECT_EQ(again.world_rank(), WorldRankOrMinusOne());
  EXPECT_EQ(again.thread_level(), MPI_THREAD_MULTIPLE);
}

TEST(MpiRuntime, WorldReturnsErrors) {
  MPI_Errhandler h;
  ASSERT_EQ(MPI_Comm_get_errhandler(MPI_COMM_WORLD, &h), MPI_SUCCESS);
  EXPECT_TRUE(h == MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&h);
}

TEST(MpiRuntime, CheckMpiTurnsErrorCodesIntoCommError) {
  EXPECT_NO_THROW(CheckMpi(MPI_SUCCESS, "anything"));
  int size = 0, x = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int rc = MPI_Send(&x, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD);  // no such rank
  ASSERT_NE(rc, MPI_SUCCESS);
  int cls = 0;
  MPI_Error_class(rc, &cls);
  EXPECT_EQ(cls, MPI_ERR_RANK);
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  try {
    CheckMpi(rc, "MPI_Send to a rank past the end");
    FAIL() << "CheckMpi did not throw";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("MPI_Send to a rank past the end: "), 0u) << what;
    EXPECT_NE(what.find(text), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace sshsdp
