// sshsdp: command-line entry point. `sshsdp train` trains a reference model on real MPI
// ranks (launch it with mpirun); `sshsdp ckpt` inspects and exports checkpoints in one
// process; `sshsdp bench` compares framework presets in one job; `sshsdp --help` lists the
// commands.
#include <CLI/CLI.hpp>

#include "sshsdp/cli/bench.h"
#include "sshsdp/cli/ckpt_cli.h"
#include "sshsdp/cli/train.h"

int main(int argc, char** argv) {
  CLI::App app{
      "sshsdp: sharded data-parallel training with runtime/update parameter decoupling.\n"
      "Launch multi-rank runs with mpirun, e.g.\n"
      "  mpirun -np 4 sshsdp train --model tiny --sw 2 --sg 2 --so 4 --steps 100"};
  app.require_subcommand(1);
  // A later flag overrides an earlier one (scripts/run.sh passes defaults the user may override).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sshsdp::TrainOptions train;
  CLI::App* t = app.add_subcommand("train", "train a reference model (run under mpirun)");
  sshsdp::AddTrainOptions(*t, train);
  sshsdp::CkptOptions ckpt;
  CLI::App* c = app.add_subcommand(
      "ckpt", "inspect, verify and export sharded checkpoints (one process, no mpirun)");
  sshsdp::AddCkptCommands(*c, ckpt);
  sshsdp::BenchOptions bench;
  CLI::App* b = app.add_subcommand(
      "bench", "compare framework presets (fsdp2, megatron-fsdp, vescale-fsdp, sshsdp) in one job");
  sshsdp::AddBenchOptions(*b, bench);
  CLI11_PARSE(app, argc, argv);
  if (b->parsed()) return sshsdp::RunBench(argc, argv, bench);
  if (t->parsed()) {
    train.layout_given =
        t->count("--sw") + t->count("--sg") + t->count("--so") + t->count("--ranks-per-node") > 0;
    return sshsdp::RunTrain(argc, argv, train);
  }
  if (c->parsed()) return sshsdp::RunCkpt(ckpt);
  return 0;
}
