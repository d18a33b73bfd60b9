// The main of the AMX kernels' tests (kernels_amx_pairs_test, kernels_amx_gemm_test):
// GoogleTest's, except that it reports skipped — 77, their ctest SKIP_RETURN_CODE — where the
// CPU has no AMX-BF16 or the kernel refuses this process the tile state.
#include <gtest/gtest.h>

#include <cstdio>

#include "sshsdp/kernels/amx_pairs.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!sshsdp::kernels::amx::Available()) {
    std::printf("skipped: this CPU has no AMX-BF16 (or the kernel refused its tile state)\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
