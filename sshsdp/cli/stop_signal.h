// Stopping a training run by signal: SIGTERM (what Slurm sends before preemption), SIGINT and
// SIGUSR1 ask the loop to stop after the current step (checkpoint when --ckpt-dir is set, exit
// 128 + signal); a second one ends the process at once. Before training starts there is nothing
// to finish or save, so a signal then (also what MPI_Abort sends when another rank's start-up
// check failed) ends the process at once.
//
//   InstallStopHandlers();
//   SetTraining(true);
//   for (...) { Step(); if (int sig = PendingStopSignal()) { save; return 128 + sig; } }
//
// SIGUSR1 is the one to send to mpirun: OpenMPI forwards it to every rank, where a SIGTERM to
// mpirun is followed by SIGKILL one second later (odls_base_sigkill_timeout), often before the
// checkpoint is written.
#pragma once

namespace sshsdp {

void InstallStopHandlers();

// From now on a first signal asks the loop to stop instead of ending the process.
void SetTraining(bool training);

// The first stop signal received (0: none).
int PendingStopSignal();

}  // namespace sshsdp
