// config.json of transformers' Llama / Qwen3 to and from LlamaConfig (hf_config.h).
#include "sshsdp/hf/hf_config.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <type_traits>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

// j[key] as T when present, else `fallback`; ConfigError naming the key for a wrong type.
template <class T>
T Get(const nlohmann::json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // An integer literal within T's range: nlohmann's get<int> would wrap 2^40 to 0 and
    // truncate 1e9.
    const nlohmann::json& v = j.at(key);
    const bool fits =
        v.is_number_unsigned()
            ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
            : v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<T>::min() &&
                  v.get<int64_t>() <= std::numeric_limits<T>::max();
    SSHSDP_CHECK(fits, ConfigError, "{}: '{}' is {}, not an integer from {} to {}", source, key,
                 v.dump(), std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
  }
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw ConfigError(fmt::format("{}: '{}' is {}, not the {} transformers writes", source, key,
                                  j.at(key).dump(),
                                  std::is_same_v<T, bool>          ? "boolean"
                                  : std::is_same_v<T, std::string> ? "string"
                                                                   : "number"));
  }
}

template <class T>
T Need(const nlohmann::json& j, const char* key, const std::string& source) {
  SSHSDP_CHECK(j.contains(key) && !j.at(key).is_null(), ConfigError,
               "{}: '{}' is missing (a Hugging Face config.json of a Llama or Qwen3 model has it)",
               source, key);
  return Get<T>(j, key, T{}, source);
}

void Refuse(bool bad, const std::string& source, const std::string& what) {
  SSHSDP_CHECK(!bad, ConfigError, "{}: {}", source, what);
}

// rope_theta from rope_parameters (transformers 5) or the top level; other RoPE types refused.
double RopeTheta(const nlohmann::json& j, const std::string& source) {
  double theta = Get<double>(j, "rope_theta", 10000.0, source);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j.at(key).is_null()) continue;
    const nlohmann::json& r = j.at(key);
    Refuse(!r.is_object(), source, fmt::format("'{}' must be an object", key));
    const std::string type =
        Get<std::string>(r, "rope_type", Get<std::string>(r, "type", "default", source), source);
    Refuse(type != "default", source,
           fmt::format("{}.rope_type '{}' is not supported: sshsdp computes the default RoPE "
                       "only (drop the scaling or use a model without it)",
                       key, type));
    theta = Get<double>(r, "rope_theta", theta, source);
  }
  return theta;
}

void RefuseUnsupported(const nlohmann::json& j, const std::string& source) {
  Refuse(Get<bool>(j, "attention_bias", false, source), source,
         "attention_bias true is not supported (Llama 3 and Qwen3 have none)");
  Refuse(Get<bool>(j, "mlp_bias", false, source), source, "mlp_bias true is not supported");
  const std::string act = Get<std::string>(j, "hidden_act", "silu", source);
  Refuse(act != "silu", source,
         fmt::format("hidden_act '{}' is not supported (SwiGLU with silu only)", act));
  Refuse(Get<bool>(j, "use_sliding_window", false, source), source,
         "use_sliding_window true is not supported: sshsdp's attention is full causal");
  if (j.contains("layer_types") && j.at("layer_types").is_array())
    for (const auto& t : j.at("layer_types"))
      Refuse(
          !t.is_string() || t.get<std::string>() != "full_attention", source,
          fmt::format("layer_types holds {}: only full_attention layers are supported", t.dump()));
  Refuse(Get<double>(j, "attention_dropout", 0.0, source) != 0.0, source,
         "attention_dropout is not supported (set it to 0)");
}

// Qwen3-MoE's keys (num_experts is num_local_experts in transformers 5's files).
void ReadMoe(const nlohmann::json& j, const std::string& source, LlamaConfig* c) {
  c->n_expert = Get<int>(j, "num_experts", Get<int>(j, "num_local_experts", 0, source), source);
  c->top_k = Need<int>(j, "num_experts_per_tok", source);
  c->d_expert = Need<int>(j, "moe_intermediate_size", source);
  c->sparse_step = Get<int>(j, "decoder_sparse_step", 1, source);
  c->mlp_only_layers = Get<std::vector<int>>(j, "mlp_only_layers", {}, source);
  c->norm_topk_prob = Get<bool>(j, "norm_topk_prob", false, source);
  c->router_aux_loss_coef = Get<double>(j, "router_aux_loss_coef", 0.001, source);
  c->output_router_logits = Get<bool>(j, "output_router_logits", false, source);
  Refuse(c->n_expert <= 0, source, "num_experts is missing or not positive (a qwen3_moe config)");
  Refuse(Get<int>(j, "shared_expert_intermediate_size", 0, source) > 0, source,
         "shared_expert_intermediate_size: shared experts (Qwen2-MoE) are not supported");
}

}  // namespace

LlamaConfig LlamaConfigFromHf(const nlohmann::json& j, const std::string& source) {
  SSHSDP_CHECK(j.is_object(), ConfigError, "{}: a config.json must hold a JSON object", source);
  LlamaConfig c;
  c.model_type = Need<std::string>(j, "model_type", source);
  Refuse(c.model_type != "llama" && c.model_type != "qwen3" && c.model_type != "qwen3_moe", source,
         fmt::format("model_type '{}' is not supported: sshsdp reads llama, qwen3 and qwen3_moe "
                     "configs",
                     c.model_type));
  RefuseUnsupported(j, source);
  c.vocab = Need<int>(j, "vocab_size", source);
  c.d_model = Need<int>(j, "hidden_size", source);
  c.n_layer = Need<int>(j, "num_hidden_layers", source);
  c.n_head = Need<int>(j, "num_attention_heads", source);
  // A key left out takes transformers' default for that model_type (Qwen3Config,
  // Qwen3MoeConfig, LlamaConfig), so that both build the same model from the same file.
  const bool llama = c.model_type == "llama", moe = c.model_type == "qwen3_moe";
  c.n_kv_head = Get<int>(j, "num_key_value_heads", llama ? c.n_head : moe ? 4 : 32, source);
  c.d_ff = Need<int>(j, "intermediate_size", source);
  SSHSDP_CHECK(c.n_head > 0, ConfigError, "{}: num_attention_heads {} must be positive", source,
               c.n_head);
  c.head_dim = Get<int>(j, "head_dim", llama || moe ? c.d_model / c.n_head : 128, source);
  c.seq_len = Get<int>(j, "max_position_embeddings", llama ? 2048 : 32768, source);
  c.rope_theta = RopeTheta(j, source);
  c.norm_eps = static_cast<float>(Get<double>(j, "rms_norm_eps", 1e-6, source));
  c.qk_norm = c.model_type != "llama";
  if (c.model_type == "qwen3_moe") ReadMoe(j, source, &c);
  c.tied = Get<bool>(j, "tie_word_embeddings", false, source);
  try {
    c.Validate();
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: {}", source, e.what()));
  }
  return c;
}

LlamaConfig ReadHfConfig(const std::string& dir_or_file) {
  const std::string path =
      std::filesystem::is_directory(dir_or_file) ? dir_or_file + "/config.json" : dir_or_file;
  std::ifstream in(path);
  SSHSDP_CHECK(in.good(), IoError,
               "{}: cannot read it (a Hugging Face model directory holds config.json and "
               "model.safetensors)",
               path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  return LlamaConfigFromHf(j, path);
}

nlohmann::json HfConfigJson(const LlamaConfig& c) {
  const bool qwen = c.model_type != "llama";
  const char* arch = c.model_type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                     : qwen                      ? "Qwen3ForCausalLM"
                                                 : "LlamaForCausalLM";
  nlohmann::json j = {
      {"architectures", {arch}},
      {"model_type", c.model_type},
      {"vocab_size", c.vocab},
      {"hidden_size", c.d_model},
      {"intermediate_size", c.d_ff},
      {"num_hidden_layers", c.n_layer},
      {"num_attention_heads", c.n_head},
      {"num_key_value_heads", c.n_kv_head},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.seq_len},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", c.tied},
      {"torch_dtype", "float32"},
  };
  if (c.IsMoe()) {
    j["num_experts"] = c.n_expert;
    j["num_experts_per_tok"] = c.top_k;
    j["moe_intermediate_size"] = c.d_expert;
    j["decoder_sparse_step"] = c.sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
  }
  if (qwen) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  } else {
    j["mlp_bias"] = false;
  }
  return j;
}

std::string HfTokenizerPath(const std::string& dir) {
  if (dir.empty()) return {};
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::path(dir) / "tokenizer.json";
  if (!std::filesystem::is_regular_file(p, ec)) return {};
  return std::filesystem::absolute(p, ec).string();
}

nlohmann::json LlamaModelJson(const LlamaConfig& c) {
  return {{"type", "llama-family"},
          {"hf", HfConfigJson(c)},
          {"vocab", c.vocab},
          {"seq_len", c.seq_len},
          {"padded_vocab", c.padded_vocab()}};
}

LlamaConfig LlamaFromModelJson(const nlohmann::json& j) {
  const std::string source = "model description";
  SSHSDP_CHECK(j.is_object() && j.contains("hf"), ConfigError, "{} {} lacks 'hf'", source,
               j.dump());
  LlamaConfig c = LlamaConfigFromHf(j.at("hf"), source);
  c.seq_len = Need<int>(j, "seq_len", source);
  const int padded = Need<int>(j, "padded_vocab", source);
  SSHSDP_CHECK(padded == c.padded_vocab(), ConfigError,
               "{}: padded_vocab {} is not vocab {} rounded up to {}", source, padded, c.vocab,
               c.vocab_multiple);
  return c;
}

}  // namespace sshsdp
