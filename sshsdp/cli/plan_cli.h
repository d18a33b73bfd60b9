// `sshsdp plan`: what a training run will allocate and move on every rank, before launching
// it — one process, no MPI, no model weights or activations allocated (engine/plan.h).
//
// It takes `sshsdp train`'s options (the same command line or --config file; options that
// change neither memory nor traffic, like --steps or --lr, are accepted and ignored) plus the
// world size, and prints per rank the memory by category and its peak, per step the bytes of
// every collective split intra / inter node, the structured-update plan (Muon units, split
// units and their execution ranks, Newton–Schulz FLOPs per rank and their balance, point-to-
// point bytes) and the ZeRO-1 owner map of every buffer; --json prints all of it as JSON.
//
//   sshsdp plan -n 4 --model small --sw 2 --microbatches 2 --optimizer muon
//   sshsdp plan -n 16 --ranks-per-node 8 --so 8 --model base --json > plan.json
#pragma once

#include <CLI/CLI.hpp>

#include "sshsdp/cli/train.h"

namespace sshsdp {

struct PlanOptions {
  TrainOptions train;  // the run to plan
  int world_size = 0;  // ranks (-n); 0: refused
  bool json = false;
  int max_rank_columns = 8;  // text output: a column per rank up to this many, else min / max
};

void AddPlanOptions(CLI::App& app, PlanOptions& o);
// Prints the plan to stdout; returns the exit code (1 with the error on stderr for a
// configuration that cannot run).
int RunPlanCommand(const PlanOptions& o);

}  // namespace sshsdp
