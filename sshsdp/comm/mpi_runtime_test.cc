// Multi-rank tests of MpiRuntime's guarantees (run through mpi_gtest_main, which creates the
// runtime): thread level MPI_THREAD_MULTIPLE, MPI_ERRORS_RETURN on the world, and MPI error
// codes turned into CommError carrying MPI_Error_string.
#include "sshsdp/comm/mpi_runtime.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
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

// The value OpenMPI itself holds for mpi_yield_when_idle (MPI_T control variable).
int YieldWhenIdle() {
  int provided = 0;
  EXPECT_EQ(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided), MPI_SUCCESS);
  int index = -1;
  int value = 0;  // zeroed: OpenMPI reads this variable out as a one-byte bool
  if (MPI_T_cvar_get_index("mpi_yield_when_idle", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      EXPECT_EQ(count, 1);
      EXPECT_EQ(MPI_T_cvar_read(handle, &value), MPI_SUCCESS);
      value = value != 0;
      MPI_T_cvar_handle_free(&handle);
    } else {
      ADD_FAILURE() << "MPI_T_cvar_handle_alloc(mpi_yield_when_idle) failed";
    }
  } else {
    ADD_FAILURE() << "this MPI has no mpi_yield_when_idle control variable";
  }
  MPI_T_finalize();
  return value;
}

// Idle MPI waits yield the core (MpiRuntime sets it before MPI_Init) unless the launcher set
// it: the comm_mpi_runtime_yield_* entries launch without it (SSHSDP_EXPECT_YIELD=1) and with
// --mca mpi_yield_when_idle 0 (SSHSDP_EXPECT_YIELD=0); the other entries launch with 1.
TEST(MpiRuntime, IdleWaitsYieldUnlessTheLauncherChose) {
#ifndef OPEN_MPI
  GTEST_SKIP() << "an OpenMPI setting; this MPI is not OpenMPI";
#endif
  const char* want = std::getenv("SSHSDP_EXPECT_YIELD");
  EXPECT_EQ(YieldWhenIdle(), want ? std::atoi(want) : 1);
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
