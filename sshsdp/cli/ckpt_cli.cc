// `sshsdp ckpt inspect | export` (see ckpt_cli.h).
#include "sshsdp/cli/ckpt_cli.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/cli/run_config.h"

namespace sshsdp {

void AddCkptCommands(CLI::App& ckpt, CkptOptions& o) {
  ckpt.require_subcommand(1);
  CLI::App* inspect = ckpt.add_subcommand(
      "inspect",
      "print what a checkpoint holds (step, layout, model, tensors, files) and verify every "
      "file's size and CRC-32; exits 1 naming the first bad file");
  inspect->add_option("path", o.path, "checkpoint root (its latest checkpoint) or step directory")
      ->required();
  inspect->add_flag("--no-verify", o.no_verify, "only print, do not read the files");
  inspect->callback([&o] { o.action = "inspect"; });
  CLI::App* exp = ckpt.add_subcommand(
      "export",
      "write one field of a checkpoint (default: fp32 main weights) as consolidated "
      "safetensors, one tensor per update parameter");
  exp->add_option("path", o.path, "checkpoint root (its latest checkpoint) or step directory")
      ->required();
  exp->add_option("out", o.out, "output .safetensors file")->required();
  exp->add_option("--field", o.field, "main | m | v (any field the checkpoint holds)")
      ->capture_default_str();
  exp->callback([&o] { o.action = "export"; });
}

int RunCkpt(const CkptOptions& o) {
  try {
    const std::string dir = ResolveCheckpoint(o.path);
    const Manifest m = ReadManifest(dir);
    if (o.action == "inspect") {
      if (dir != o.path) {
        const auto all = ListCheckpoints(o.path);
        std::vector<std::string> names;
        for (const auto& [step, path] : all)
          names.push_back(std::filesystem::path(path).filename().string());
        fmt::print("{}: {} complete checkpoint(s): {} (showing the latest)\n", o.path, all.size(),
                   fmt::join(names, ", "));
      }
      fmt::print("{}", DescribeCheckpoint(m));
      if (o.no_verify) return 0;
      int bad = 0;
      std::string first;
      for (int i = 0; i < static_cast<int>(m.files.size()); ++i) {
        const std::string e = CheckFileContents(m, i);
        if (!e.empty() && first.empty()) first = e;
        bad += !e.empty();
        fmt::print("  verify {}: {}\n", m.files[i].name, e.empty() ? "ok" : "FAILED: " + e);
      }
      std::fflush(stdout);
      SSHSDP_CHECK(bad == 0, IoError, "{} of {} files failed verification; first: {}", bad,
                   m.files.size(), first);
      fmt::print("checksums: all {} files verified\n", m.files.size());
      return 0;
    }
    // The output may not replace a file of the checkpoint it is read from, nor its tree's.
    CheckOutputsOutsideCheckpoints({{"the output", o.out}}, {{"the checkpoint", o.path}});
    CheckWritableOutput("the output", o.out);  // not a directory; PATH.tmp creatable now
    VerifyCheckpointFiles(m);
    auto tensors = ReadConsolidated(m, o.field);
    WriteSafetensors(o.out, tensors,
                     {{"format", "sshsdp"},
                      {"field", o.field},
                      {"step", std::to_string(m.step)},
                      {"checkpoint", dir},
                      {"model", m.meta.model.dump()}});
    fmt::print("wrote {} ({} tensors of field '{}' at step {})\n", o.out, tensors.size(), o.field,
               m.step);
    return 0;
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "sshsdp ckpt: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace sshsdp
