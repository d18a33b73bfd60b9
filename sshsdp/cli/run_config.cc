// Recorded and restored run options (run_config.h).
#include "sshsdp/cli/run_config.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string_view>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"

namespace sshsdp {

std::string RecordedConfig(const CLI::App& train) { return train.config_to_str(true, false); }

namespace {

// "--name=value" arguments of TOML items (top level or [train]); `unknown` is called for a key
// that names no option of `train` and returns whether to skip it.
std::vector<std::string> ItemArgs(const CLI::App& train, const std::vector<CLI::ConfigItem>& items,
                                  const std::function<bool(const CLI::ConfigItem&)>& keep,
                                  const std::function<void(const std::string&)>& unknown) {
  std::vector<std::string> args;
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // section markers
    if (!(item.parents.empty() || (item.parents.size() == 1 && item.parents[0] == "train"))) {
      unknown(item.fullname());
      continue;
    }
    const CLI::Option* opt = nullptr;
    try {
      opt = train.get_option("--" + item.name);
    } catch (const CLI::OptionNotFound&) {
      unknown(item.name);
      continue;
    }
    if (!opt->get_configurable() || !keep(item)) continue;
    if (std::all_of(item.inputs.begin(), item.inputs.end(),
                    [](const std::string& v) { return v.empty(); }))
      continue;  // no value (an option whose default is "unset")
    for (const std::string& v : item.inputs) args.push_back("--" + item.name + "=" + v);
  }
  return args;
}

}  // namespace

// The file parsed as TOML first (toml++): a syntax error is named with its line and column,
// and only keys at the top level or under [train] holding values or arrays are allowed — CLI11's
// lenient reader below would take `model = "tiny` as the preset name '"tiny'.
void CheckTomlSyntax(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    throw ConfigError(fmt::format("--config {}:{}:{}: not valid TOML: {}", path, at.line, at.column,
                                  e.description()));
  }
  for (const auto& [key, value] : t) {
    const bool section = key.str() == "train" && value.is_table();
    SSHSDP_CHECK(section || value.is_value() || value.is_array(), ConfigError,
                 "--config {}: '{}' is a table; options go at the top level or under [train]", path,
                 key.str());
    if (!section) continue;
    for (const auto& [k, v] : *value.as_table())
      SSHSDP_CHECK(v.is_value() || v.is_array(), ConfigError,
                   "--config {}: [train] '{}' is a table; options take values", path, k.str());
  }
}

std::vector<std::string> ConfigFileArgs(const CLI::App& train, const std::string& path) {
  std::vector<CLI::ConfigItem> items;
  CheckTomlSyntax(path);
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    throw ConfigError(fmt::format("--config {}: not a readable TOML file: {}", path, e.what()));
  }
  // Stricter than CLI11's reader: a key given twice (also once at the top and once under
  // [train]) would silently keep the last; an array for a one-value option would take its last
  // element; keys that steer the command line itself mean nothing in a file.
  std::set<std::string> seen;
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // section markers
    SSHSDP_CHECK(item.name != "config" && item.name != "dump-config" && item.name != "help",
                 ConfigError,
                 "--config {}: '{}' cannot be set in a config file (give it on the "
                 "command line)",
                 path, item.name);
    SSHSDP_CHECK(seen.insert(item.name).second, ConfigError,
                 "--config {}: '{}' is set twice (at the top and under [train] count as one "
                 "key); keep one",
                 path, item.name);
    const CLI::Option* opt = train.get_option_no_throw("--" + item.name);
    SSHSDP_CHECK(opt == nullptr || item.inputs.size() <= 1 || opt->get_items_expected_max() > 1,
                 ConfigError,
                 "--config {}: '{}' takes one value, got {} ([{}]: an array, or the key "
                 "set twice)",
                 path, item.name, item.inputs.size(), fmt::join(item.inputs, ", "));
  }
  return ItemArgs(
      train, items, [](const CLI::ConfigItem&) { return true; },
      [&](const std::string& key) {
        throw ConfigError(fmt::format(
            "--config {}: '{}' is not an option of sshsdp train (see sshsdp train --help; "
            "--dump-config writes a valid file)",
            path, key));
      });
}

std::vector<std::string> RestoredArgs(const CLI::App& train, const std::string& recorded_toml,
                                      const std::string& resumed_checkpoint) {
  static const std::set<std::string> kLaunchOnly = {
      "resume",      "config", "dump-config", "init-weights",   "fault", "ckpt-fault",
      "sw",          "sg",     "so",          "ranks-per-node", "help",  "trace",
      "trace-steps",  // a trace is per launch
      "backend",      // where it runs, and how its collectives move, too
      "comm-path",
      "mx-gemm",        // the dtype that backend dequantizes MXFP8 weights to
      "scale-layout"};  // a kernel layout of that backend (older records hold cublas_swizzle)
  std::istringstream in(recorded_toml);
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_config(in);
  } catch (const CLI::Error& e) {
    throw ConfigError(
        fmt::format("the checkpoint's recorded options are not readable: {}", e.what()));
  }
  std::vector<std::string> args = ItemArgs(
      train, items,
      [&](const CLI::ConfigItem& item) {
        // Given now (command line or --config): the user's value wins. The checkpoint
        // directory is where the resumed checkpoint lies (below), not the recorded one.
        return !kLaunchOnly.count(item.name) && item.name != "ckpt-dir" &&
               train.get_option("--" + item.name)->count() == 0;
      },
      [](const std::string&) {});  // an option this version no longer has
  // Records of older versions hold values that meant "unset" or wrapped, which the options now
  // refuse: they restore as what the run used (a negative seed as its 64-bit wrap; a negative
  // or NaN --lr-min and a NaN --aux-loss-weight as unset, the default).
  std::vector<std::string> kept;
  for (std::string& a : args) {
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq), value = a.substr(eq + 1);
    if ((name == "--seed" || name == "--sr-seed") && value.find('-') != std::string::npos) {
      a = name + "=" +
          std::to_string(static_cast<unsigned long long>(std::strtoll(value.c_str(), nullptr, 0)));
    } else if ((name == "--lr-min" || name == "--aux-loss-weight") &&
               !(std::strtod(value.c_str(), nullptr) >= 0.0)) {
      continue;
    }
    kept.push_back(a);
  }
  args = std::move(kept);
  // A run that saved checkpoints saves them next to the one it resumes from: resuming a copy
  // (or a checkpoint moved elsewhere) must not write into — and prune — the original's
  // directory.
  const bool saved = std::any_of(items.begin(), items.end(), [](const CLI::ConfigItem& item) {
    return item.name == "ckpt-dir" && !item.inputs.empty() && !item.inputs.front().empty();
  });
  if (saved && train.get_option("--ckpt-dir")->count() == 0) {
    // Absolute and with links resolved: `--resume .` inside a step directory, or a link to
    // one, still names the directory that holds it.
    std::error_code ec;
    std::filesystem::path dir =
        std::filesystem::weakly_canonical(std::filesystem::absolute(resumed_checkpoint, ec), ec);
    if (!dir.has_filename()) dir = dir.parent_path();  // a trailing '/'
    args.push_back("--ckpt-dir=" + dir.parent_path().string());
  }
  return args;
}

CLI::Validator FiniteAtLeast(double lo) {
  return CLI::Validator(
      [lo](std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0' || !std::isfinite(x) || x < lo)
          return fmt::format("must be a finite number >= {}, got '{}'", lo, v);
        return "";
      },
      fmt::format("NUMBER >= {}", lo));
}

CLI::Validator IntegerAtLeast(long long lo) {
  return CLI::Validator(
      [lo](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const bool negative = v.find('-') != std::string::npos;
        // Without a sign, the whole unsigned 64-bit range (seeds) is a value.
        // Base 0 as CLI11 reads integers: 0x2A and 010 (octal) are the values it stores.
        const bool below = negative ? std::strtoll(v.c_str(), &end, 0) < lo
                                    : std::strtoull(v.c_str(), &end, 0) <
                                          static_cast<unsigned long long>(std::max(lo, 0LL));
        if (end == v.c_str() || *end != '\0' || errno == ERANGE || below)
          return fmt::format("must be an integer >= {}, got '{}'", lo, v);
        return "";
      },
      fmt::format("INT >= {}", lo));
}

void CheckWritableOutput(const char* flag, const std::string& path, bool renamed_into_place) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  SSHSDP_CHECK(!fs::is_directory(p, ec), ConfigError, "{} {}: is a directory; name a file", flag,
               path);
  SSHSDP_CHECK(fs::is_directory(dir, ec), ConfigError,
               "{} {}: directory '{}' does not exist (create it first)", flag, path, dir.string());
  SSHSDP_CHECK(access(dir.c_str(), W_OK) == 0, ConfigError,
               "{} {}: directory '{}' is not writable: {}", flag, path, dir.string(),
               std::strerror(errno));
  if (!renamed_into_place) return;
  // The file is written as PATH.tmp and renamed over PATH: a device or FIFO there would be
  // replaced by a regular file (as root, /dev/full).
  const fs::file_status st = fs::symlink_status(p, ec);
  SSHSDP_CHECK(!fs::exists(st) || fs::is_regular_file(st) || fs::is_symlink(st), ConfigError,
               "{} {}: exists and is not a regular file (a device, FIFO or socket); name a file",
               flag, path);
  // Creating PATH.tmp must work now (some file systems — /proc, /sys — refuse new files).
  const std::string probe = path + ".tmp";
  const bool existed = fs::exists(probe, ec);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  SSHSDP_CHECK(fd >= 0, ConfigError, "{} {}: cannot create {}: {}", flag, path, probe,
               std::strerror(errno));
  ::close(fd);
  if (!existed) ::unlink(probe.c_str());
}

namespace {

namespace fs = std::filesystem;

// Whether `p` is `root` or lies below it, both resolved.
bool Within(const fs::path& p, const fs::path& root) {
  auto [r, q] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
  return r == root.end() || (std::next(r) == root.end() && r->empty());  // "root/" ends in ""
}

// The places writing `path` touches: its name in its resolved directory (what a rename into
// place replaces: a symlink there, say a Hugging Face snapshot's link to its blob, is itself
// in the directory) and the file it resolves to (what an append writes through a link).
std::vector<fs::path> WrittenPlaces(const std::string& path) {
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  return {fs::weakly_canonical(abs.parent_path(), ec) / abs.filename(),
          fs::weakly_canonical(abs, ec)};
}

// ConfigError naming the output and `why` when writing `path` touches `root` or below.
void CheckOutside(const char* flag, const std::string& path, const fs::path& root,
                  const std::string& why) {
  for (const fs::path& p : WrittenPlaces(path))
    SSHSDP_CHECK(!Within(p, root), ConfigError, "{} {} lies inside {}; name a file outside it",
                 flag, path, why);
}

// What of a checkpoint `dir` holds: "a checkpoint's manifest.json" (a step directory: a
// manifest of sshsdp's format), "a checkpoint root's `latest` record" (with step_*
// directories beside it), or "".
std::string CheckpointIn(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / kManifestFile, ec)) {
    std::ifstream in(dir / kManifestFile);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("format", std::string()) == "sshsdp-checkpoint")
      return fmt::format("a checkpoint's {}", kManifestFile);
  }
  if (!fs::is_regular_file(dir / kLatestFile, ec)) return "";
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec) && e.path().filename().string().starts_with("step_"))
      return fmt::format("a checkpoint root's `{}` record", kLatestFile);
  return "";
}

}  // namespace

void CheckOutputsOutsideCheckpoints(const std::vector<NamedPath>& outputs,
                                    const std::vector<NamedPath>& trees) {
  std::error_code ec;
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    for (const auto& [tree_flag, tree] : trees) {
      if (tree.empty()) continue;
      fs::path root = fs::weakly_canonical(fs::absolute(tree, ec), ec);
      // A step directory (step_<N>) belongs to its root, where `latest` lives.
      if (root.filename().string().starts_with("step_")) root = root.parent_path();
      CheckOutside(flag, path, root,
                   fmt::format("{} {} (checkpoint tree {}): writing it would replace a file the "
                               "checkpoint needs (a rank file, the manifest, `latest`)",
                               tree_flag, tree, root.string()));
    }
    // Any other checkpoint: a step directory (it holds a manifest) or a root (`latest`).
    for (const fs::path& p : WrittenPlaces(path)) {
      const std::string held = CheckpointIn(p.parent_path());
      SSHSDP_CHECK(held.empty(), ConfigError,
                   "{} {} lies in {}, which holds {}: writing there could replace a file a "
                   "checkpoint needs; name a file outside it",
                   flag, path, p.parent_path().string(), held);
    }
  }
}

void CheckOutputsOutsideInputDirs(const std::vector<NamedPath>& outputs,
                                  const std::vector<NamedPath>& dirs) {
  std::error_code ec;
  for (const auto& [dir_flag, dir] : dirs) {
    if (dir.empty() || !fs::is_directory(dir, ec)) continue;
    const fs::path root = fs::weakly_canonical(fs::absolute(dir, ec), ec);
    for (const auto& [flag, path] : outputs)
      if (!path.empty())
        CheckOutside(flag, path, root,
                     fmt::format("{} {}, a directory the run reads (its config.json, weights "
                                 "and tokenizer)",
                                 dir_flag, dir));
  }
}

void CheckOutputsDistinct(const std::vector<NamedPath>& outputs,
                          const std::vector<NamedPath>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [flag, path] = outputs[i];
    if (path.empty()) continue;
    for (const auto& [in_flag, in_path] : inputs) {
      if (in_path.empty() || !fs::exists(path, ec) || !fs::exists(in_path, ec)) continue;
      // Weights read whole at start-up and replaced by a rename at the end: updating a file
      // in place this way is safe.
      if (std::string_view(flag) == "--save-weights" &&
          std::string_view(in_flag) == "--init-weights")
        continue;
      SSHSDP_CHECK(!fs::equivalent(path, in_path, ec), ConfigError,
                   "{} {} is the file {} {} reads: the run would overwrite its own input (name "
                   "another file)",
                   flag, path, in_flag, in_path);
    }
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      const auto& [other_flag, other] = outputs[j];
      if (other.empty()) continue;
      SSHSDP_CHECK(fs::weakly_canonical(path, ec) != fs::weakly_canonical(other, ec), ConfigError,
                   "{} {} and {} {} name the same file: each output needs its own", flag, path,
                   other_flag, other);
    }
  }
}

}  // namespace sshsdp
