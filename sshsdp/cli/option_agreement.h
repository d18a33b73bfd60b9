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

namespace sshsdp {

// Collective over MPI_COMM_WORLD. `options` is this rank's effective options as text (one
// option per line, e.g. RecordedConfig). ConfigError on every rank when they differ, naming
// the ranks whose options are not rank 0's and the first differing line of the lowest one.
void AgreeOnOptions(const std::string& options, std::string_view program);

// The first line where a and b differ, as "'x' vs 'y'" ("(none)" for a missing line); empty
// when equal.
std::string FirstDifferingLine(const std::string& a, const std::string& b);

}  // namespace sshsdp
