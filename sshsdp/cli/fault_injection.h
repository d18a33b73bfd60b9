// Test-only fault injection for `sshsdp train --fault RANK:STEP[:sleep]`: a wrapper around the
// run's batch function, so the production batch function holds no test code. The wrapper is
// only installed when --fault is given, and only on the named rank.
//
//   const FaultSpec f = ParseFault(o.fault);                  // ConfigError when malformed
//   BatchFn batch = WithFault(f, rank, &current_step, std::move(batch));
#pragma once

#include <cstdint>
#include <string>

#include "sshsdp/engine/engine.h"

namespace sshsdp {

struct FaultSpec {
  int rank = -1;       // -1: no fault
  int64_t step = -1;   // 1-based step whose first microbatch fails
  bool sleep = false;  // a 3 s longer step instead of a failure (signal tests)
  std::string spec;    // as given, for the message
};

// "" -> no fault; "RANK:STEP" or "RANK:STEP:sleep". Throws ConfigError otherwise.
FaultSpec ParseFault(const std::string& spec);

// `batch` itself where the fault is not this rank's; else a function that, in the first
// microbatch of step f.step (read from *step, 0-based, when the batch is asked for), throws
// CommError naming the rank and step (or sleeps 3 s), then calls `batch`.
BatchFn WithFault(const FaultSpec& f, int rank, const int64_t* step, BatchFn batch);

}  // namespace sshsdp
