// `sshsdp export-hf` (export_hf.h): the model description and fp32 main weights of a
// checkpoint (verified first) or a weights file, through the state-dict adapter of hf/.
#include "sshsdp/cli/export_hf.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/cli/run_config.h"
#include "sshsdp/hf/hf_config.h"
#include "sshsdp/hf/hf_weights.h"

namespace sshsdp {

void AddExportHfOptions(CLI::App& app, ExportHfOptions& o) {
  app.add_option("--ckpt", o.ckpt, "checkpoint root (its latest checkpoint) or step directory");
  app.add_option("--weights", o.weights,
                 "a weights file of train --save-weights or ckpt export (instead of --ckpt)");
  app.add_option("--out", o.out, "the Hugging Face model directory to write")->required();
  app.add_option("--shard-mb", o.shard_mb,
                 "largest safetensors file in MB (more go to shards with an index)")
      ->capture_default_str();
}

int RunExportHf(const ExportHfOptions& o) {
  try {
    SSHSDP_CHECK(o.ckpt.empty() != o.weights.empty(), ConfigError,
                 "export-hf takes one input: --ckpt DIR or --weights FILE");  // before any read
    SSHSDP_CHECK(o.shard_mb >= 1, ConfigError, "--shard-mb must be >= 1, got {}", o.shard_mb);
    // Nothing of the input may be replaced: the output directory lies outside the checkpoint
    // tree, and its model.safetensors is not the weights file.
    CheckOutputsOutsideCheckpoints({{"--out", o.out + "/model.safetensors"}}, {{"--ckpt", o.ckpt}});
    std::error_code ec;
    SSHSDP_CHECK(o.weights.empty() ||
                     !std::filesystem::equivalent(o.out + "/model.safetensors", o.weights, ec),
                 ConfigError, "--out {} would overwrite --weights {}: name another directory",
                 o.out, o.weights);
    SSHSDP_CHECK(!std::filesystem::exists(o.out) || std::filesystem::is_directory(o.out),
                 ConfigError, "--out {} is a file; export-hf writes a directory", o.out);
    const TrainedWeights in = ReadTrainedWeights(o.ckpt, o.weights, "export-hf");
    const nlohmann::json& model = in.model;
    const std::map<std::string, SafeTensor>& tensors = in.tensors;
    SSHSDP_CHECK(model.value("type", std::string()) == "llama-family", ConfigError,
                 "{}: holds a {} model; export-hf writes the Llama family (qwen3-*, llama-*, "
                 "--model-config, --init-from-hf), whose architecture transformers has",
                 o.ckpt.empty() ? o.weights : o.ckpt, model.value("type", std::string("gpt")));
    const LlamaConfig c = LlamaFromModelJson(model);
    WriteHfCheckpoint(o.out, c, tensors, o.shard_mb << 20);
    fmt::print("wrote {} ({} update parameters as transformers' {})\n", o.out, tensors.size(),
               HfConfigJson(c)["architectures"][0].get<std::string>());
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "sshsdp export-hf: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace sshsdp
