// The --trace FILE of `sshsdp train` / `sshsdp bench`: which steps are traced (--trace-steps
// A:B) and the file itself — every rank's spans (base/trace.h) gathered to rank 0 and written
// as one Chrome trace (Perfetto, chrome://tracing; scripts/plot_trace.py renders a PNG).
//
//   const TraceWindow w = ParseTraceSteps("2:4");          // ConfigError when malformed
//   Tracer tracer;  cfg.tracer = &tracer;                  // the engine records into it
//   StartTrace(tracer, *world);                             // barrier: aligned clocks
//   tracer.Enable(w.Contains(step));                        // per step
//   WriteTraceFile(tracer, *world, "trace.json", {"rank 0", "rank 1"});  // collective
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sshsdp/base/trace.h"
#include "sshsdp/comm/communicator.h"

namespace sshsdp {

// Steps first..last (1-based, inclusive) are traced.
struct TraceWindow {
  int64_t first = 1, last = 8;
  bool Contains(int64_t step) const { return step >= first && step <= last; }
};
// "A:B" with 1 <= A <= B, or "A" (one step); ConfigError naming the flag otherwise.
TraceWindow ParseTraceSteps(const std::string& spec);

// Aligns the ranks' clocks: a barrier, then time zero on every rank; rows are world ranks.
// Collective.
void StartTrace(Tracer& tracer, Communicator& world);

// Gathers every rank's events; rank 0 writes them to `path` (a temporary, then renamed, so
// a reader never sees half a file), with `rows[pid]` naming the process rows. IoError on rank
// 0 when the file cannot be written. Collective.
void WriteTraceFile(const Tracer& tracer, Communicator& world, const std::string& path,
                    const std::vector<std::string>& rows);

}  // namespace sshsdp
