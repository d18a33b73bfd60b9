// This process's resident memory, from /proc/self/status, for the progress line and the bench;
// and a start-up check that a model can fit the node at all.
//
//   ResetPeakRss();            // VmHWM := VmRSS (clear_refs "5")
//   ... build, warm up ...
//   double grew = PeakRssMiB() - CurrentRssMiB();
#pragma once

#include <string>

namespace sshsdp {

double PeakRssMiB();     // VmHWM: the peak since start or since the last ResetPeakRss
double CurrentRssMiB();  // VmRSS
void ResetPeakRss();

// ConfigError before anything is allocated when a run cannot fit this node: every rank keeps
// at least 12 bytes per parameter ÷ W (fp32 main weights, gradients and one optimizer moment,
// however sharded), so local_ranks × 12 · params ÷ world_size above the node's physical
// memory fails — with the sizes and what to change — instead of the OOM killer ending the
// job (or a neighbour) with no message.
void CheckModelFitsNode(double params, int world_size, int local_ranks);

// The same for a microbatch's activations: bytes_per_rank (a lower bound the caller computes)
// times local_ranks above the node's memory is a ConfigError naming `batch` and what to lower,
// before the model allocates them (instead of std::bad_alloc after the start-up).
void CheckActivationsFitNode(double bytes_per_rank, int local_ranks, const std::string& batch);

}  // namespace sshsdp
