// The models `sshsdp train`, `generate` and `ckpt` build: a preset with the command line's
// overrides, and the architecture a checkpoint or weights file records (its model JSON), in
// both directions, so a checkpoint can be loaded or sampled from without repeating the flags.
//
//   GptConfig gc = MakeGptConfig(options, /*vocab=*/data->vocab());
//   std::unique_ptr<Model> m = MakeModel(options, gc);
//   nlohmann::json j = IsMoePreset(options.model) ? MoeModelJson(MakeMoeConfig(options, gc))
//                                                 : GptModelJson(gc);
//   std::unique_ptr<Model> same = ModelFromJson(j);   // the same architecture
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/cli/train.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/llama.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

bool IsMoePreset(const std::string& name);
// Whether the run trains a Llama-family model (models/llama.h): a qwen3-* / llama-* preset,
// --model-config or --init-from-hf.
bool IsLlamaFamily(const TrainOptions& o);
// Its configuration: the HF config.json of --init-from-hf or --model-config (its vocabulary),
// or the preset with `data_vocab` tokens and --layers/--d-model/--heads applied (refused with a
// config.json, whose weights fix the shape). ConfigError naming the problem.
LlamaConfig MakeLlamaConfig(const TrainOptions& o, int data_vocab);
// What the run's header calls the model: the preset, or the config.json / HF directory.
std::string ModelName(const TrainOptions& o);
// The model JSON of a Llama-family run (LlamaModelJson; "expert_group" with MXFP8 experts).
nlohmann::json LlamaRunJson(const TrainOptions& o, int vocab);
// The GptConfig summary of a Llama-family model (width, depth, query heads, vocabulary, the
// default sequence length: its positions, at most 1,024) that headers and estimates read.
GptConfig LlamaSummary(const LlamaConfig& c);
// The vocabulary the model fixes (a config.json's), or 0 when the data decides (presets).
int ModelVocab(const TrainOptions& o);
// The preset's trunk with --layers/--d-model/--heads/--seq-len applied and `vocab` tokens
// (padded to the GEMM multiple, gpt.h). ConfigError for bad sizes. For the Llama family, a
// summary the run's header and memory estimates read (width, depth, query heads, vocabulary,
// the default sequence length: the config's positions, at most 1,024).
GptConfig MakeGptConfig(const TrainOptions& o, int vocab);

// GptConfig::bf16_attention of an --attention-dtype value ("auto" -> true, "fp32" -> false);
// ConfigError naming the values otherwise.
bool Bf16Attention(const std::string& attention_dtype);

// Whether the model of `model` (a preset) with `weight_dtype` runs bf16 attention on the host
// engine: --attention-dtype auto and bf16 QKV weights (bf16 weights; mxfp8 keeps the MoE
// presets' attention weights bf16 and quantizes the dense GPT's QKV).
bool RunsBf16Attention(const std::string& model, const std::string& weight_dtype,
                       const std::string& attention_dtype);
// The MoE configuration of an MoE preset: its trunk, then the MoE flags. ConfigError for MoE
// flags on a dense preset.
MoeConfig MakeMoeConfig(const TrainOptions& o, const GptConfig& trunk);
// The dense GPT or the MoE GPT a preset names.
std::unique_ptr<Model> MakeModel(const TrainOptions& o, const GptConfig& trunk);
// The dense GPT trunk a preset names (an MoE preset's trunk for moe-*); ConfigError naming
// the presets if unknown.
GptConfig PresetTrunk(const std::string& model);
// Gpt over `trunk`, or MoeGpt with `moe`'s MoE settings over `trunk` (validated).
std::unique_ptr<Model> MakeModel(const GptConfig& trunk, const MoeConfig* moe);
// "GPT" or the MoE summary of the progress header.
std::string ModelDescription(const TrainOptions& o, const GptConfig& trunk);

// The trained weights of a checkpoint (its latest under a root; every file verified first) or
// of a weights file (train --save-weights, ckpt export): the fp32 main weights by update
// name, the model description, where they came from, and the tokenizer.json a run started
// from a Hugging Face directory recorded ("" if none). Exactly one of ckpt and weights is
// given (ConfigError naming `command` otherwise); ConfigError for a file without a model
// description, IoError for a damaged one.
struct TrainedWeights {
  nlohmann::json model;
  std::map<std::string, SafeTensor> tensors;
  std::string source;
  std::string tokenizer;
};
TrainedWeights ReadTrainedWeights(const std::string& ckpt, const std::string& weights,
                                  const char* command);

// Architecture keys of a GPT / MoE GPT: a checkpoint loads only into an equal config.
nlohmann::json GptModelJson(const GptConfig& c);
nlohmann::json MoeModelJson(const MoeConfig& c);
// The model a model JSON describes (its inverse). ConfigError naming the key that is missing
// or wrong.
std::unique_ptr<Model> ModelFromJson(const nlohmann::json& j);

}  // namespace sshsdp
