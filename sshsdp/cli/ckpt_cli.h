// `sshsdp ckpt`: inspect, verify and export sharded checkpoints in one process (no mpirun).
//
//   sshsdp ckpt inspect out/ckpt                 # latest checkpoint: step, layout, model,
//                                                # tensors, files; verifies every checksum
//   sshsdp ckpt inspect out/ckpt/step_00000100   # one checkpoint
//   sshsdp ckpt export out/ckpt final.safetensors [--field main|m|v]
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

struct CkptOptions {
  std::string action;  // "inspect" | "export"
  std::string path;
  std::string out;
  std::string field = "main";
  bool no_verify = false;
};

void AddCkptCommands(CLI::App& ckpt, CkptOptions& o);
// Returns the exit code: 0, or 1 after printing the error (naming the file and problem).
int RunCkpt(const CkptOptions& o);

}  // namespace sshsdp
