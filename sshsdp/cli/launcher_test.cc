// Launch checks against environments of torchrun, srun with and without PMIx, and mpirun.
#include "sshsdp/cli/launcher.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

GetEnv Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string ErrorOf(int world, const GetEnv& env) {
  try {
    CheckLauncher(world, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Launcher, TorchrunSingletonsAreRefusedWithTheMpirunCommand) {
  const GetEnv torchrun =
      Env({{"TORCHELASTIC_RUN_ID", "x"}, {"LOCAL_RANK", "1"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}});
  const std::string e = ErrorOf(1, torchrun);
  EXPECT_NE(e.find("torchrun (WORLD_SIZE=2, RANK=1)"), std::string::npos) << e;
  EXPECT_NE(e.find("mpirun -np 2 sshsdp train"), std::string::npos) << e;
  EXPECT_EQ(ErrorOf(2, torchrun), "");  // a real 2-rank world (mpirun under torchrun's env)
  EXPECT_EQ(ErrorOf(1, Env({{"TORCHELASTIC_RUN_ID", "x"}, {"WORLD_SIZE", "1"}})), "");
}

TEST(Launcher, SrunWithoutMpiPluginIsRefused) {
  const GetEnv srun = Env({{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "3"}});
  const std::string e = ErrorOf(1, srun);
  EXPECT_NE(e.find("SLURM_NTASKS=4 (SLURM_PROCID=3)"), std::string::npos) << e;
  EXPECT_NE(e.find("srun --mpi=pmix -n 4"), std::string::npos) << e;
  EXPECT_EQ(ErrorOf(4, srun), "");  // srun --mpi=pmix: one world of 4
  // sbatch's batch shell (no step) running mpirun -np 1: no srun step, nothing to refuse.
  EXPECT_EQ(ErrorOf(1, Env({{"SLURM_NTASKS", "4"}})), "");
}

TEST(Launcher, DisagreeingLargerWorldIsANote) {
  EXPECT_EQ(CheckLauncher(3, Env({})), "");
  const std::string note = CheckLauncher(3, Env({{"LOCAL_RANK", "0"}, {"WORLD_SIZE", "8"}}));
  EXPECT_NE(note.find("WORLD_SIZE=8"), std::string::npos) << note;
}

}  // namespace
}  // namespace sshsdp
