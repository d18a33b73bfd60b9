// transformers' state dict of a Llama-family model to and from sshsdp's update parameters
// (hf_weights.h).
#include "sshsdp/hf/hf_weights.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "sshsdp/base/error.h"
#include "sshsdp/base/posix_file.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/hf/hf_config.h"
#include "sshsdp/layout/tensor_list.h"

namespace sshsdp {
namespace {

namespace fs = std::filesystem;

// The safetensors files of an HF directory: model.safetensors, or the index's shards.
std::vector<std::string> WeightFiles(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(single)) return {single};
  SSHSDP_CHECK(fs::exists(index), IoError,
               "{}: neither model.safetensors nor model.safetensors.index.json is there (save the "
               "model with save_pretrained, safe_serialization on)",
               dir);
  std::ifstream in(index);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("{}: not valid JSON: {}", index, e.what()));
  }
  SSHSDP_CHECK(j.contains("weight_map") && j.at("weight_map").is_object(), IoError,
               "{}: no weight_map object", index);
  std::set<std::string> files;
  for (const auto& [name, file] : j.at("weight_map").items()) {
    SSHSDP_CHECK(file.is_string() && file.get<std::string>().find('/') == std::string::npos,
                 IoError, "{}: weight_map['{}'] must name a file in the directory, got {}", index,
                 name, file.dump());
    files.insert(dir + "/" + file.get<std::string>());
  }
  return {files.begin(), files.end()};
}

}  // namespace

std::vector<HfTensor> HfTensors(const LlamaConfig& c) {
  SSHSDP_CHECK(!c.fused_qkv, ConfigError,
               "a Llama-family model with one fused QKV update parameter (sshsdp bench's "
               "baselines) has no Hugging Face layout: use per-head parameters");
  const int64_t d = c.d_model, dh = c.head_dim, ff = c.d_ff;
  std::vector<HfTensor> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab, d}, {"embed_tokens"}, true});
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    auto one = [&](const std::string& name, std::vector<int64_t> shape) {
      out.push_back({"model." + p + name + ".weight", std::move(shape), {p + name}, false});
    };
    one("input_layernorm", {d});
    for (const char* which : {"q", "k", "v"}) {
      const int heads = which[0] == 'q' ? c.n_head : c.n_kv_head;
      HfTensor t{fmt::format("model.{}self_attn.{}_proj.weight", p, which), {heads * dh, d}, {}};
      for (int h = 0; h < heads; ++h)
        t.parts.push_back(fmt::format("{}self_attn.{}_proj.h{}", p, which, h));
      out.push_back(std::move(t));
    }
    if (c.qk_norm) {
      one("self_attn.q_norm", {dh});
      one("self_attn.k_norm", {dh});
    }
    one("self_attn.o_proj", {d, c.q_dim()});
    one("post_attention_layernorm", {d});
    if (!c.IsMoeLayer(l)) {
      one("mlp.gate_proj", {ff, d});
      one("mlp.up_proj", {ff, d});
      one("mlp.down_proj", {d, ff});
      continue;
    }
    one("mlp.gate", {c.n_expert, d});  // the router
    const int64_t f = c.d_expert;
    for (int e = 0; e < c.n_expert; ++e) {
      one(fmt::format("mlp.experts.{}.gate_proj", e), {f, d});
      one(fmt::format("mlp.experts.{}.up_proj", e), {f, d});
      one(fmt::format("mlp.experts.{}.down_proj", e), {d, f});
    }
  }
  out.push_back({"model.norm.weight", {d}, {"norm"}, false});
  if (!c.tied) out.push_back({"lm_head.weight", {c.vocab, d}, {"lm_head"}, true});
  return out;
}

HfWeights::HfWeights(const std::string& dir, const LlamaConfig& c)
    : dir_(dir), paths_(WeightFiles(dir)) {
  std::map<std::string, std::pair<size_t, SafetensorsEntry>> file;
  for (size_t i = 0; i < paths_.size(); ++i)
    for (SafetensorsEntry& e : ReadSafetensorsIndex(paths_[i])) {
      SSHSDP_CHECK(!file.count(e.name), ConfigError, "{}: tensor '{}' is in two shards", dir,
                   e.name);
      std::string name = e.name;
      file.emplace(std::move(name), std::pair{i, std::move(e)});
    }
  const std::vector<HfTensor> want = HfTensors(c);
  std::vector<TensorSpec> want_specs, have_specs;
  for (const HfTensor& t : want) want_specs.push_back({t.name, t.shape});
  for (const auto& [name, t] : file) have_specs.push_back({name, t.second.shape});
  const std::string mismatch = DescribeTensorMismatch(want_specs, have_specs, dir);
  SSHSDP_CHECK(mismatch.empty(), ConfigError, "{}", mismatch);
  for (const HfTensor& t : want) {
    const auto& [index, entry] = file.at(t.name);
    const uint64_t n = NumElements(t.shape);
    if (t.table) {  // [vocab, d] of a [padded, d] table
      sources_[t.parts[0]] = {index, entry, 0, n};
      continue;
    }
    const uint64_t each = n / t.parts.size();  // heads are equal row blocks
    for (size_t p = 0; p < t.parts.size(); ++p)
      sources_[t.parts[p]] = {index, entry, p * each, each};
  }
  files_.resize(paths_.size());
}

void HfWeights::Read(const std::string& name, size_t begin, size_t count, float* out) {
  const auto it = sources_.find(name);
  SSHSDP_CHECK(it != sources_.end(), ConfigError, "{}: no tensor holds update parameter '{}'", dir_,
               name);
  const Source& s = it->second;
  const size_t end = begin + count;
  const size_t from_file = begin < s.valid ? std::min<size_t>(end, s.valid) - begin : 0;
  if (from_file > 0) {
    if (!files_[s.file]) files_[s.file] = std::make_unique<InFile>(paths_[s.file]);
    ReadSafetensorsElements(*files_[s.file], s.entry, s.first + begin, from_file, out);
    const float* bad =
        std::find_if(out, out + from_file, [](float x) { return !std::isfinite(x); });
    SSHSDP_CHECK(bad == out + from_file, ConfigError,
                 "{}: tensor '{}' holds a non-finite value ({} at element {}); initial weights "
                 "must be finite",
                 dir_, s.entry.name, *bad, s.first + begin + static_cast<size_t>(bad - out));
  }
  std::fill(out + from_file, out + count, 0.0f);  // padded rows
}

std::map<std::string, std::vector<float>> ReadHfWeights(const std::string& dir,
                                                        const LlamaConfig& c) {
  HfWeights w(dir, c);
  std::map<std::string, std::vector<float>> out;
  const int64_t padded = int64_t{c.padded_vocab()} * c.d_model;
  for (const HfTensor& t : HfTensors(c))
    for (const std::string& part : t.parts) {
      std::vector<float>& v = out[part];
      v.resize(t.table ? static_cast<size_t>(padded) : NumElements(t.shape) / t.parts.size());
      w.Read(part, 0, v.size(), v.data());
    }
  return out;
}

namespace {

// The transformers tensor t assembled from the update parameters.
SafeTensor Assemble(const HfTensor& t, const LlamaConfig& c,
                    const std::map<std::string, SafeTensor>& update) {
  SafeTensor out{t.shape, {}};
  const size_t n = NumElements(t.shape);
  out.data.reserve(n);
  for (const std::string& part : t.parts) {
    const auto it = update.find(part);
    SSHSDP_CHECK(it != update.end(), ConfigError,
                 "export to Hugging Face: update parameter '{}' (of {}) is missing", part, t.name);
    const std::vector<float>& v = it->second.data;
    const size_t take = t.table ? n : v.size();
    SSHSDP_CHECK(
        v.size() >= take &&
            (!t.table || v.size() == static_cast<size_t>(int64_t{c.padded_vocab()} * c.d_model)),
        ConfigError, "export to Hugging Face: '{}' has {} values, {} needs {}", part, v.size(),
        t.name, t.table ? int64_t{c.padded_vocab()} * c.d_model : int64_t(n));
    out.data.insert(out.data.end(), v.begin(), v.begin() + static_cast<std::ptrdiff_t>(take));
  }
  SSHSDP_CHECK(out.data.size() == n, ConfigError,
               "export to Hugging Face: {} assembles {} values, its shape {} needs {}", t.name,
               out.data.size(), ShapeString(t.shape), n);
  return out;
}

// The weight files of an earlier export in `dir` that this one did not write: a loader takes
// model.safetensors before an index (as transformers does), so a stale one would be loaded
// in place of the new shards.
void RemoveStaleWeights(const std::string& dir, const std::set<std::string>& written) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool weights = name == "model.safetensors" || name == "model.safetensors.index.json" ||
                         (name.starts_with("model-") && name.ends_with(".safetensors") &&
                          name.find("-of-") != std::string::npos);
    if (!weights || written.count(name)) continue;
    fs::remove(e.path(), ec);
    SSHSDP_CHECK(!ec, IoError, "{}: cannot remove this weight file of an earlier export: {}",
                 e.path().string(), ec.message());
  }
}

}  // namespace

void WriteHfCheckpoint(const std::string& dir, const LlamaConfig& c,
                       const std::map<std::string, SafeTensor>& update, int64_t max_shard_bytes) {
  std::vector<std::map<std::string, SafeTensor>> shards(1);
  int64_t bytes = 0, total = 0;
  for (const HfTensor& t : HfTensors(c)) {
    SafeTensor s = Assemble(t, c, update);
    const int64_t b = static_cast<int64_t>(s.data.size()) * 4;
    if (bytes > 0 && bytes + b > max_shard_bytes) shards.emplace_back(), bytes = 0;
    bytes += b, total += b;
    shards.back().emplace(t.name, std::move(s));
  }
  fs::create_directories(dir);
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  std::set<std::string> written;
  auto write_text = [&](const std::string& name, const std::string& text) {
    WriteFileAtomically(dir + "/" + name, [&](OutFile& f) { f.Write(text.data(), text.size()); });
    written.insert(name);
  };
  if (shards.size() == 1) {
    WriteSafetensors(dir + "/model.safetensors", shards[0], meta);
    written.insert("model.safetensors");
  } else {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", {}}};
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string name =
          fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      WriteSafetensors(dir + "/" + name, shards[i], meta);
      written.insert(name);
      for (const auto& [tensor, s] : shards[i]) index["weight_map"][tensor] = name;
    }
    write_text("model.safetensors.index.json", index.dump(2) + "\n");
  }
  RemoveStaleWeights(dir, written);
  write_text("config.json", HfConfigJson(c).dump(2) + "\n");
}

}  // namespace sshsdp
