// Hugging Face `config.json` for the Llama family (models/llama.h), both ways: the keys
// transformers' LlamaConfig / Qwen3Config define, read into a LlamaConfig and written back so
// that `AutoModelForCausalLM.from_pretrained` builds the same model. What sshsdp does not
// compute — another RoPE type, sliding-window layers, attention or MLP biases, an activation
// other than SiLU, another model_type — is refused naming the key, never approximated.
//
//   LlamaConfig c = ReadHfConfig("Qwen3-0.6B");           // Qwen3-0.6B/config.json
//   nlohmann::json back = HfConfigJson(c);                  // transformers' keys
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "sshsdp/models/llama.h"

namespace sshsdp {

// From a parsed config.json; `source` names it in errors. ConfigError naming the key and the
// fix for an unsupported or malformed value.
LlamaConfig LlamaConfigFromHf(const nlohmann::json& j, const std::string& source);
// dir/config.json, or the file itself when given one (IoError when it cannot be read or
// parsed).
LlamaConfig ReadHfConfig(const std::string& dir_or_file);
// transformers' keys for c (model_type, architectures, sizes, rope_parameters and the older
// rope_theta, rms_norm_eps, tie_word_embeddings, torch_dtype float32).
nlohmann::json HfConfigJson(const LlamaConfig& c);

// The absolute path of dir/tokenizer.json when dir (a Hugging Face model directory) has one,
// else "" (also for dir ""): what a run started from dir records for `sshsdp generate`.
std::string HfTokenizerPath(const std::string& dir);

// sshsdp's model description of a Llama-family model (a checkpoint's or weights file's
// "model" JSON, cli/model_config.h): {"type": "llama-family", "hf": HfConfigJson, "vocab",
// "seq_len", "padded_vocab"}; and back (ConfigError naming the key).
nlohmann::json LlamaModelJson(const LlamaConfig& c);
LlamaConfig LlamaFromModelJson(const nlohmann::json& j);

}  // namespace sshsdp
