// Model configurations from command-line options and from model JSON (model_config.h).
#include "sshsdp/cli/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/hf/hf_config.h"

namespace sshsdp {

bool IsMoePreset(const std::string& name) { return name.rfind("moe-", 0) == 0; }

bool IsLlamaFamily(const TrainOptions& o) {
  return LlamaConfig::IsPreset(o.model) || !o.model_config.empty() || !o.init_from_hf.empty();
}

TrainedWeights ReadTrainedWeights(const std::string& ckpt, const std::string& weights,
                                  const char* command) {
  SSHSDP_CHECK(ckpt.empty() != weights.empty(), ConfigError,
               "{} needs exactly one of --ckpt DIR and --weights FILE", command);
  TrainedWeights out;
  if (!ckpt.empty()) {
    const Manifest m = ReadManifest(ResolveCheckpoint(ckpt));
    VerifyCheckpointFiles(m);  // never read a damaged file
    out.model = m.meta.model;
    out.tensors = ReadConsolidated(m, "main");
    out.source = m.dir;
    out.tokenizer = m.meta.run.value("tokenizer", std::string());
    return out;
  }
  std::map<std::string, std::string> meta;
  out.tensors = ReadSafetensors(weights, &meta);
  out.source = weights;
  if (const auto it = meta.find("model"); it != meta.end())
    out.model = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  SSHSDP_CHECK(out.model.is_object(), ConfigError,
               "{}: no model description in its metadata (files from `sshsdp train "
               "--save-weights` and `sshsdp ckpt export` have one)",
               weights);
  if (const auto it = meta.find("tokenizer"); it != meta.end()) out.tokenizer = it->second;
  return out;
}

nlohmann::json LlamaRunJson(const TrainOptions& o, int vocab) {
  const LlamaConfig c = MakeLlamaConfig(o, vocab);
  nlohmann::json j = LlamaModelJson(c);
  if (c.IsMoe() && o.weight_dtype == "mxfp8") j["expert_group"] = true;  // other groups
  return j;
}

std::string ModelName(const TrainOptions& o) {
  return !o.init_from_hf.empty()   ? o.init_from_hf
         : !o.model_config.empty() ? o.model_config
                                   : o.model;
}

int ModelVocab(const TrainOptions& o) {
  if (o.init_from_hf.empty() && o.model_config.empty()) return 0;
  return MakeLlamaConfig(o, 0).vocab;
}

LlamaConfig MakeLlamaConfig(const TrainOptions& o, int data_vocab) {
  SSHSDP_CHECK(o.model_config.empty() || o.init_from_hf.empty(), ConfigError,
               "--model-config and --init-from-hf exclude each other: the model directory of "
               "--init-from-hf holds its config.json");
  const std::string hf = o.init_from_hf.empty() ? o.model_config : o.init_from_hf;
  SSHSDP_CHECK(hf.empty() || (o.model == TrainOptions{}.model && !o.model_given), ConfigError,
               "--model {} and {} both name the architecture; leave --model out (the "
               "config.json gives it)",
               o.model, o.init_from_hf.empty() ? "--model-config" : "--init-from-hf");
  LlamaConfig c;
  const bool gone = !hf.empty() && !std::filesystem::exists(hf) && o.resumed_model.is_object() &&
                    o.resumed_model.value("type", std::string()) == "llama-family";
  if (gone) {  // a resume whose Hugging Face directory moved: the checkpoint describes the model
    c = LlamaFromModelJson(o.resumed_model);
  } else if (!hf.empty()) {
    c = ReadHfConfig(hf);
    SSHSDP_CHECK(o.layers == 0 && o.d_model == 0 && o.heads == 0, ConfigError,
                 "--layers/--d-model/--heads change a preset; {} fixes the architecture (edit "
                 "its config.json instead)",
                 hf);
  } else {
    c = LlamaConfig::Preset(o.model);
    c.vocab = data_vocab;
    if (o.layers) c.n_layer = o.layers;
    if (o.d_model) c.d_model = o.d_model;
    if (o.heads) c.n_head = o.heads;
  }
  c.bf16_attention = Bf16Attention(o.attention_dtype);
  SSHSDP_CHECK(o.seq_len <= c.seq_len, ConfigError,
               "--seq-len {} exceeds the {} positions the model's RoPE tables cover "
               "(max_position_embeddings)",
               o.seq_len, c.seq_len);
  c.Validate();
  return c;
}

// What the header and the memory estimates read of a Llama-family model.
GptConfig LlamaSummary(const LlamaConfig& c) {
  GptConfig g;
  g.vocab = c.vocab, g.vocab_multiple = c.vocab_multiple, g.d_model = c.d_model;
  g.n_layer = c.n_layer, g.n_head = c.n_head, g.d_ff = c.d_ff;
  g.seq_len = std::min(c.seq_len, 1024);
  return g;
}

// The MoE configuration of an MoE preset: its trunk with the GPT overrides, then the MoE
// flags. ConfigError for MoE flags on a dense preset.
MoeConfig MakeMoeConfig(const TrainOptions& o, const GptConfig& trunk) {
  if (!IsMoePreset(o.model)) {
    constexpr int kUnset = TrainOptions::kUnset;
    SSHSDP_CHECK(o.experts == kUnset && o.top_k == kUnset && o.moe_every == kUnset &&
                     o.d_expert == kUnset && o.gating.empty() && o.expert_mlp.empty() &&
                     std::isnan(o.aux_loss_weight) && !o.shared_expert,
                 ConfigError,
                 "--experts/--top-k/--moe-every/--d-expert/--gating/--expert-mlp/"
                 "--aux-loss-weight/--shared-expert apply to MoE presets (moe-tiny, moe-small), "
                 "not '{}'{}",
                 o.model,
                 o.resume.empty() ? ""
                                  : fmt::format(" (--resume {} restored them: that checkpoint "
                                                "is an MoE run; resume it with its own --model)",
                                                o.resume));
    return {};
  }
  MoeConfig c = MoeConfig::Preset(o.model);
  c.trunk = trunk;
  if (o.experts != TrainOptions::kUnset) c.n_expert = o.experts;
  if (o.top_k != TrainOptions::kUnset) c.top_k = o.top_k;
  if (o.moe_every != TrainOptions::kUnset) c.moe_every = o.moe_every;
  if (o.d_expert != TrainOptions::kUnset) c.d_expert = o.d_expert;
  if (!o.gating.empty()) c.gating = ParseGating(o.gating);
  if (!o.expert_mlp.empty()) c.expert_mlp = ParseExpertMlp(o.expert_mlp);
  if (!std::isnan(o.aux_loss_weight)) c.aux_loss_weight = o.aux_loss_weight;
  c.shared_expert = o.shared_expert;
  // MXFP8: experts in their own runtime groups, the only MX groups (moe.h).
  c.expert_group = o.weight_dtype == "mxfp8";
  c.Validate();
  return c;
}

GptConfig PresetTrunk(const std::string& model) {
  return IsMoePreset(model) ? MoeConfig::Preset(model).trunk : GptConfig::Preset(model);
}

std::unique_ptr<Model> MakeModel(const GptConfig& trunk, const MoeConfig* moe) {
  if (!moe) return std::make_unique<Gpt>(trunk);
  MoeConfig c = *moe;
  c.trunk = trunk;
  c.Validate();
  return std::make_unique<MoeGpt>(c);
}

// The model a preset names: the dense GPT or the MoE GPT over the same trunk.
std::unique_ptr<Model> MakeModel(const TrainOptions& o, const GptConfig& trunk) {
  if (IsLlamaFamily(o))
    return MakeLlamaFamilyModel(MakeLlamaConfig(o, trunk.vocab), nullptr,
                                o.weight_dtype == "mxfp8");
  if (!IsMoePreset(o.model)) return MakeModel(trunk, nullptr);
  const MoeConfig c = MakeMoeConfig(o, trunk);
  return MakeModel(trunk, &c);
}

std::string ModelDescription(const TrainOptions& o, const GptConfig& trunk) {
  if (IsLlamaFamily(o)) {
    const LlamaConfig c = MakeLlamaConfig(o, trunk.vocab);
    int moe = 0;
    for (int l = 0; l < c.n_layer; ++l) moe += c.IsMoeLayer(l);
    const std::string experts =
        c.IsMoe() ? fmt::format(", {} of {} blocks MoE: E={} top-{}{} f={}", moe, c.n_layer,
                                c.n_expert, c.top_k, c.norm_topk_prob ? " renorm" : "", c.d_expert)
                  : "";
    return fmt::format("{} [{} Q / {} KV heads of {}{}, SwiGLU ff {}, RoPE theta {:g}{}{}]",
                       c.model_type == "qwen3"       ? "Qwen3"
                       : c.model_type == "qwen3_moe" ? "Qwen3-MoE"
                                                     : "Llama",
                       c.n_head, c.n_kv_head, c.head_dim, c.qk_norm ? ", QK-norm" : "", c.d_ff,
                       c.rope_theta, c.tied ? ", tied" : "", experts);
  }
  if (!IsMoePreset(o.model)) return "GPT";
  const MoeConfig c = MakeMoeConfig(o, trunk);
  int moe_blocks = 0;
  for (int l = 0; l < trunk.n_layer; ++l) moe_blocks += c.IsMoeLayer(l);
  return fmt::format("MoE GPT [{} of {} blocks MoE, E={} top-{} {} {}{} f={}{}, aux {}{}]",
                     moe_blocks, trunk.n_layer, c.n_expert, c.top_k, GatingName(c.gating),
                     ExpertMlpName(c.expert_mlp), c.renormalize ? " renorm" : "", c.expert_ff(),
                     c.shared_expert ? " +shared" : "", c.aux_loss_weight,
                     c.expert_group ? ", expert groups" : "");
}

bool Bf16Attention(const std::string& attention_dtype) {
  SSHSDP_CHECK(attention_dtype == "auto" || attention_dtype == "fp32", ConfigError,
               "--attention-dtype must be auto (bf16 operands with bf16 QKV weights) or fp32, "
               "got '{}'",
               attention_dtype);
  return attention_dtype == "auto";
}

bool RunsBf16Attention(const std::string& model, const std::string& weight_dtype,
                       const std::string& attention_dtype) {
  if (!Bf16Attention(attention_dtype)) return false;
  return weight_dtype == "bf16" || (weight_dtype == "mxfp8" && IsMoePreset(model));
}

GptConfig MakeGptConfig(const TrainOptions& o, int vocab) {
  if (IsLlamaFamily(o)) {
    const GptConfig c = LlamaSummary(MakeLlamaConfig(o, vocab));
    MakeMoeConfig(o, c);  // MoE flags refused by name
    return c;
  }
  GptConfig c = PresetTrunk(o.model);
  c.vocab = vocab;
  c.bf16_attention = Bf16Attention(o.attention_dtype);
  // The dense GPT's (an MoE preset with --mx-gemm bf16 is refused: CheckBackendOptions).
  if (!IsMoePreset(o.model)) c.mx_gemm = o.mx_gemm == "bf16" ? DType::kBF16 : DType::kF32;
  if (o.layers) c.n_layer = o.layers;
  if (o.d_model) c.d_model = o.d_model;
  if (o.heads) c.n_head = o.heads;
  SSHSDP_CHECK(o.layers >= 0 && o.d_model >= 0 && o.heads >= 0 && o.seq_len >= 0, ConfigError,
               "--layers, --d-model, --heads and --seq-len must be >= 0 (0: the preset's), got "
               "{}, {}, {}, {}",
               o.layers, o.d_model, o.heads, o.seq_len);
  SSHSDP_CHECK(o.seq_len <= c.seq_len, ConfigError,
               "--seq-len {} exceeds the '{}' preset's context of {} tokens (its position "
               "table); use a preset with a longer context (tiny 64, small 128, base 256; "
               "moe-tiny 64, moe-small 128)",
               o.seq_len, o.model, c.seq_len);
  c.Validate();
  MakeMoeConfig(o, c);  // MoE flags checked before any collective
  return c;
}

nlohmann::json GptModelJson(const GptConfig& c) {
  nlohmann::json j = {{"type", "gpt"},        {"vocab", c.vocab},   {"seq_len", c.seq_len},
                      {"d_model", c.d_model}, {"n_head", c.n_head}, {"n_layer", c.n_layer},
                      {"d_ff", c.ff()}};
  // Only a padded vocabulary records its table rows (checkpoints from before padding existed
  // have none and load as unpadded).
  if (c.padded_vocab() != c.vocab) j["padded_vocab"] = c.padded_vocab();
  if (c.fused_qkv) j["fused_qkv"] = true;  // one attn.qkv update parameter per block
  return j;
}

nlohmann::json MoeModelJson(const MoeConfig& c) {
  nlohmann::json j = GptModelJson(c.trunk);
  std::vector<int> moe_layers;
  for (int l = 0; l < c.trunk.n_layer; ++l)
    if (c.IsMoeLayer(l)) moe_layers.push_back(l);
  j["type"] = "moe-gpt";
  j["n_expert"] = c.n_expert;
  j["top_k"] = c.top_k;
  j["d_expert"] = c.expert_ff();
  j["moe_layers"] = moe_layers;
  j["gating"] = GatingName(c.gating);
  j["renormalize"] = c.renormalize;
  j["expert_mlp"] = ExpertMlpName(c.expert_mlp);
  j["d_shared"] = c.shared_expert ? c.shared_ff() : 0;
  // Experts in their own runtime groups (mxfp8) change the groups a checkpoint is cut into.
  if (c.expert_group) j["expert_group"] = true;
  return j;
}

namespace {

template <class T>
T Key(const nlohmann::json& j, const char* key) {
  SSHSDP_CHECK(j.contains(key), ConfigError, "model description {} lacks '{}'", j.dump(), key);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(
        fmt::format("model description: '{}' is {} ({})", key, j.at(key).dump(), e.what()));
  }
}

GptConfig GptFromJson(const nlohmann::json& j) {
  GptConfig c;
  c.vocab = Key<int>(j, "vocab");
  c.seq_len = Key<int>(j, "seq_len");
  c.d_model = Key<int>(j, "d_model");
  c.n_head = Key<int>(j, "n_head");
  c.n_layer = Key<int>(j, "n_layer");
  c.d_ff = Key<int>(j, "d_ff");
  c.vocab_multiple = 1;  // unpadded unless the description says otherwise
  if (j.contains("padded_vocab")) {
    c.vocab_multiple = GptConfig{}.vocab_multiple;
    SSHSDP_CHECK(c.padded_vocab() == Key<int>(j, "padded_vocab"), ConfigError,
                 "model description: padded_vocab {} is not vocab {} rounded up to {}",
                 j.at("padded_vocab").dump(), c.vocab, c.vocab_multiple);
  }
  c.fused_qkv = j.value("fused_qkv", false);
  c.Validate();
  return c;
}

}  // namespace

std::unique_ptr<Model> ModelFromJson(const nlohmann::json& j) {
  const std::string type = Key<std::string>(j, "type");
  if (type == "llama-family")
    return MakeLlamaFamilyModel(LlamaFromModelJson(j), nullptr, j.value("expert_group", false));
  if (type == "gpt") return std::make_unique<Gpt>(GptFromJson(j));
  SSHSDP_CHECK(type == "moe-gpt", ConfigError,
               "model description: type '{}' is neither gpt nor moe-gpt", type);
  MoeConfig c;
  c.trunk = GptFromJson(j);
  c.n_expert = Key<int>(j, "n_expert");
  c.top_k = Key<int>(j, "top_k");
  c.d_expert = Key<int>(j, "d_expert");
  c.moe_layers = Key<std::vector<int>>(j, "moe_layers");
  c.gating = ParseGating(Key<std::string>(j, "gating"));
  c.renormalize = Key<bool>(j, "renormalize");
  c.expert_mlp = ParseExpertMlp(Key<std::string>(j, "expert_mlp"));
  c.d_shared = Key<int>(j, "d_shared");
  c.shared_expert = c.d_shared > 0;
  c.expert_group = j.value("expert_group", false);
  c.Validate();
  return std::make_unique<MoeGpt>(c);
}

}  // namespace sshsdp
