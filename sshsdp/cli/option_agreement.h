// Every rank of a job must run the same command: ranks started with different options (a
// per-node --config, a hand-edited mpirun MPMD line) would build different layouts, models or
// step counts and then hang in, or crash out of, mismatched collectives — or, with another
// --lr, train silently inconsistent shards. AgreeOnOptions compares the ranks' effective
// options once, before any other collective, and refuses by name.
//
//   AgreeOnOptions(o.recorded_config, "sshsdp train");  // first thing after MPI_Init
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sshsdp {

// Collective over MPI_COMM_WORLD. `options` is this rank's effective options as text (one
// option per line, e.g. RecordedConfig). ConfigError on every rank when they differ, naming
// the ranks whose options are not rank 0's and the first differing line of the lowest one.
void AgreeOnOptions(const std::string& options, std::string_view program);

// Which ranks' `text` differs from rank 0's, and how the lowest of them differs.
struct RankDifferences {
  std::vector<int> ranks;         // empty: every rank agrees
  std::string first;              // the lowest such rank's first differing line, "'x' vs 'y'"
  std::string Ranks() const;      // "rank 3" / "ranks 2, 3"
  std::string RanksWere() const;  // "rank 3 was" / "ranks 2, 3 were"
};

// Collective over MPI_COMM_WORLD; the same result on every rank. For options, and for what
// may legitimately differ between ranks but deserves a note (the kernels a CPU kind picks).
RankDifferences DifferencesFromRankZero(const std::string& text);

// The first line where a and b differ, as "'x' vs 'y'" ("(none)" for a missing line); empty
// when equal.
std::string FirstDifferingLine(const std::string& a, const std::string& b);

}  // namespace sshsdp
