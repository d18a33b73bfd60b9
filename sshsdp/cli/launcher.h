// Launch checks: sshsdp's ranks are MPI processes (mpirun, or srun with PMIx). A launcher
// that starts several processes without one MPI world — torchrun, or srun without an MPI
// plugin — makes every process a one-rank world that trains alone as "rank 0". Its
// environment says so, and the job stops with the command that works instead.
//
//   CheckLauncher(WorldSize(), ::getenv);   // ConfigError under torchrun -np 2 ...
#pragma once

#include <functional>
#include <string>

namespace sshsdp {

using GetEnv = std::function<const char*(const char*)>;

// ConfigError when the launcher's environment promises more processes than the MPI world
// has: torchrun's WORLD_SIZE (with TORCHELASTIC_RUN_ID or LOCAL_RANK), or Slurm's
// SLURM_NTASKS inside an srun step (SLURM_STEP_ID) when the MPI world is a singleton. The
// message names the variables and the command to use. Returns a note (empty: none) when a
// launcher variable disagrees with a larger MPI world, which can be a stale export.
std::string CheckLauncher(int mpi_world_size, const GetEnv& getenv);

}  // namespace sshsdp
