// Launch checks (launcher.h).
#include "sshsdp/cli/launcher.h"

#include <cstdlib>
#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {

namespace {

// The integer value of an environment variable; -1 when unset or not a number.
long EnvInt(const GetEnv& getenv, const char* name) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return *end == '\0' ? x : -1;
}

}  // namespace

std::string CheckLauncher(int mpi_world_size, const GetEnv& getenv) {
  const bool torchrun = getenv("TORCHELASTIC_RUN_ID") != nullptr || getenv("LOCAL_RANK") != nullptr;
  const long torch_world = torchrun ? EnvInt(getenv, "WORLD_SIZE") : -1;
  const bool srun_step = getenv("SLURM_STEP_ID") != nullptr;
  const long slurm_tasks = srun_step ? EnvInt(getenv, "SLURM_NTASKS") : -1;
  if (mpi_world_size == 1 && torch_world > 1) {
    throw ConfigError(fmt::format(
        "launched by torchrun (WORLD_SIZE={}, RANK={}) but this process is a one-rank MPI "
        "world: every copy would train alone as rank 0. sshsdp's ranks are MPI processes; "
        "launch with: mpirun -np {} sshsdp train ...",
        torch_world, getenv("RANK") ? getenv("RANK") : "?", torch_world));
  }
  if (mpi_world_size == 1 && slurm_tasks > 1) {
    throw ConfigError(fmt::format(
        "launched by srun with SLURM_NTASKS={} (SLURM_PROCID={}) but this process is a one-rank "
        "MPI world: srun started the tasks without an MPI plugin, so every task would train "
        "alone as rank 0. Launch with: srun --mpi=pmix -n {} sshsdp train ... (or mpirun -np "
        "{} inside the allocation)",
        slurm_tasks, getenv("SLURM_PROCID") ? getenv("SLURM_PROCID") : "?", slurm_tasks,
        slurm_tasks));
  }
  if (torch_world > 0 && torch_world != mpi_world_size)
    return fmt::format("WORLD_SIZE={} (torchrun's) differs from the MPI world of {}; using MPI's",
                       torch_world, mpi_world_size);
  if (slurm_tasks > 0 && slurm_tasks != mpi_world_size)
    return fmt::format("SLURM_NTASKS={} differs from the MPI world of {}; using MPI's", slurm_tasks,
                       mpi_world_size);
  return "";
}

}  // namespace sshsdp
