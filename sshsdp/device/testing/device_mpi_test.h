// What the device layer's multi-rank test programs share (device_nccl_test,
// device_direct_test): failure counting across ranks, the all-ranks-agree GPU skip (ctest's
// 77), this rank's GPU (also for the engine's GoogleTest GPU cases), and main()'s error report.
// Plain programs rather than GoogleTest, so every rank can exit 77 together.
//
//   int Run(int argc, char** argv) {
//     MpiRuntime runtime(&argc, &argv);
//     auto world = MpiCommunicator::World(n);
//     if (!testing::EveryRankHasGpu(*world)) return 77;
//     testing::Expect(a == b, "a equals b");
//     return testing::FinishChecks(*world);
//   }
//   int main(int argc, char** argv) { return testing::RunMain("my_test", Run, argc, argv); }
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "sshsdp/backend/backend.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/comm/mpi_runtime.h"

namespace sshsdp::testing {

inline int& Failures() {
  static int failures = 0;  // this process's failed checks
  return failures;
}

inline void Expect(bool ok, const std::string& what) {
  if (ok) return;
  ++Failures();
  std::fprintf(stderr, "FAILED (rank %d): %s\n", WorldRankOrMinusOne(), what.c_str());
}

// True when every rank of `world` has a usable GPU in a CUDA build; otherwise rank 0 prints
// "skipped: <why>" and every rank gets false (collective over world).
inline bool EveryRankHasGpu(Communicator& world) {
  std::string reason;
  if (!CudaCompiled()) {
    reason = "this build has no CUDA backend";
  } else if (CudaDeviceCount() == 0) {
    try {  // the reason: no driver, a driver too old for this runtime, no device
      MakeCudaBackend(0);
      reason = "no GPU";
    } catch (const Error& e) {
      reason = e.what();
    }
  }
  float missing = reason.empty() ? 0.0f : 1.0f;
  world.AllReduce(&missing, 1, DType::kF32);
  if (missing > 0 && world.rank() == 0)
    std::printf("skipped: %s\n", reason.empty() ? "another rank has no GPU" : reason.c_str());
  return missing == 0;
}

// This rank's GPU: its node-local rank (Open MPI's) modulo the GPUs of the machine.
inline int LocalGpuOrdinal(int rank) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int count = CudaDeviceCount();
  return count > 0 ? (local ? std::atoi(local) : rank) % count : 0;
}

// The GoogleTest engine tests' GPU cases (ctest's *_cuda entries and scripts/gpu_check.sh set
// SSHSDP_TEST_BACKEND=cuda): this rank's GPU backend, or nullptr with *skip saying why there is
// none to run on (the test then reports GTEST_SKIP() << *skip).
inline std::unique_ptr<Backend> TestGpuOrSkip(std::string* skip) {
  const char* want = std::getenv("SSHSDP_TEST_BACKEND");
  if (want == nullptr || std::string(want) != "cuda") {
    *skip = "SSHSDP_TEST_BACKEND=cuda runs it (scripts/gpu_check.sh)";
    return nullptr;
  }
  if (!CudaCompiled() || CudaDeviceCount() == 0) {
    *skip = "no usable GPU (or no CUDA in this build)";
    return nullptr;
  }
  return MakeBackend("cuda:" + std::to_string(LocalGpuOrdinal(WorldRankOrMinusOne())));
}

// Failed checks summed over world; rank 0 prints the verdict. The process's exit code.
inline int FinishChecks(Communicator& world) {
  float failed = static_cast<float>(Failures());
  world.AllReduce(&failed, 1, DType::kF32);
  if (world.rank() == 0)
    std::printf("%s: %g failed checks over all ranks\n", failed > 0 ? "FAIL" : "OK", failed);
  return failed > 0 ? 1 : 0;
}

inline int RunMain(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace sshsdp::testing
