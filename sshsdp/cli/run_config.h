// How a `sshsdp train` run is configured beyond its flags: the options it records in a
// checkpoint (a TOML text of every option not at its default, what --config reads), the
// options a --resume restores from that record, and the checks of output paths.
//
//   std::string recorded = RecordedConfig(*train_cmd);      // stored in the checkpoint
//   std::vector<std::string> args = RestoredArgs(*train_cmd, saved_toml);
//   // parse again with args before the user's: what the user gave wins (TakeLast)
//
// Precedence, lowest first: defaults, the checkpoint's record (--resume), the --config file,
// the command line. (CLI11 2.1 reads config files for the top-level app only, so --config is
// turned into arguments here as well.)
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

namespace sshsdp {

// The options of `train` as a --config file: every option with a value (given, or with a
// default), in TOML.
std::string RecordedConfig(const CLI::App& train);

// The options a resumed run takes from the checkpoint's record: those `train` was not given
// (on the command line or in --config), as "--name=value" arguments, except the ones that
// belong to this launch, not to the run: --resume, --config, --dump-config, --init-weights,
// the fault injections, and the layout (--sw/--sg/--so/--ranks-per-node: a resume without
// them continues at the saved layout when it fits the world, see train.cc). A run that
// recorded a --ckpt-dir gets the directory holding `resumed_checkpoint` (the resolved step
// directory) instead, so a resumed copy never writes into the original's directory.
std::vector<std::string> RestoredArgs(const CLI::App& train, const std::string& recorded_toml,
                                      const std::string& resumed_checkpoint);

// The options of a --config TOML file as "--name=value" arguments (keys at the top level or
// under [train]). ConfigError naming the file and key for an unreadable file or a key that
// is no option of `train`.
std::vector<std::string> ConfigFileArgs(const CLI::App& train, const std::string& path);

// Option checks for values whose default means "unset" (a NaN, -1 or 0 in the options
// struct), so a given value cannot silently become the default: a finite number >= lo, and
// an integer >= lo. CLI11 prints "--name: <message>".
CLI::Validator FiniteAtLeast(double lo);
CLI::Validator IntegerAtLeast(long long lo);

// ConfigError unless `path` (if given) can be created or replaced: its directory exists and is
// writable, and it is not itself a directory.
// With renamed_into_place (written as PATH.tmp, then renamed: --save-weights, --trace) PATH
// must not be a device, FIFO or socket, and PATH.tmp must be creatable now.
void CheckWritableOutput(const char* flag, const std::string& path, bool renamed_into_place = true);

// ConfigError when an output file (flag, path) is one of the input files (an existing file
// reached by either path: --metrics naming the --data file truncated the token file under
// the running job) or two outputs name the same file. Empty paths are skipped.
using NamedPath = std::pair<const char*, std::string>;
void CheckOutputsDistinct(const std::vector<NamedPath>& outputs,
                          const std::vector<NamedPath>& inputs);

// ConfigError when an output file is, or lies inside, a checkpoint tree the command reads or
// writes (flag, root or step directory: --ckpt-dir, --resume, `ckpt export`'s checkpoint):
// replacing a rank file, the manifest or the `latest` record would leave a checkpoint that no
// longer verifies. Paths are compared resolved (symlinks, `..`); a step directory's root (its
// parent) is part of the tree. Empty paths are skipped.
// Outputs are also refused in any directory that holds a checkpoint's manifest.json or
// `latest` record (another checkpoint than the command's).
void CheckOutputsOutsideCheckpoints(const std::vector<NamedPath>& outputs,
                                    const std::vector<NamedPath>& trees);

// ConfigError when an output file lies inside an input directory (flag, dir: a Hugging Face
// model directory of --init-from-hf), resolved. Empty or missing directories are skipped.
void CheckOutputsOutsideInputDirs(const std::vector<NamedPath>& outputs,
                                  const std::vector<NamedPath>& dirs);

}  // namespace sshsdp
