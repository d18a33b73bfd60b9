// `sshsdp export-hf`: a Llama-family checkpoint or weights file as a Hugging Face model
// directory (config.json + safetensors) that transformers' from_pretrained loads, in one
// process (no mpirun).
//
//   sshsdp export-hf --ckpt out/ckpt --out my-qwen3        # the latest checkpoint's weights
//   sshsdp export-hf --weights final.safetensors --out my-qwen3
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace sshsdp {

struct ExportHfOptions {
  std::string ckpt;
  std::string weights;
  std::string out;
  int64_t shard_mb = 5000;  // a safetensors file per this many MB, with an index past one
};

void AddExportHfOptions(CLI::App& app, ExportHfOptions& o);
// Returns the exit code: 0, or 1 after printing the error.
int RunExportHf(const ExportHfOptions& o);

}  // namespace sshsdp
