// The state-dict adapter between a Hugging Face checkpoint of a Llama-family model and
// sshsdp's update parameters (models/llama.h), both ways. transformers' q/k/v_proj.weight
// [heads·dh, d] are the row-concatenations of the per-head update parameters
// (layers.N.self_attn.q_proj.h<i>), its embedding and LM head have `vocab` rows where sshsdp's
// tables have the padded count (the rows past vocab are zero), and every other tensor is one
// update parameter named as in transformers without "model." and ".weight". A tied model has
// no lm_head.weight (transformers saves the table once, as model.embed_tokens.weight).
//
//   LlamaConfig c = ReadHfConfig(dir);
//   auto init = ReadHfWeights(dir, c);        // update name -> fp32 values, checked
//   WriteHfCheckpoint(out, c, tensors);        // config.json + model.safetensors
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/models/llama.h"

namespace sshsdp {

// One tensor of transformers' state dict and the update parameters it is made of: the
// row-concatenation of `parts` (all of each), or the first `rows` rows of a single padded
// table when `table` is set.
struct HfTensor {
  std::string name;            // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // transformers' shape
  std::vector<std::string> parts;
  bool table = false;
};
// Every tensor of c's transformers model, in model order.
std::vector<HfTensor> HfTensors(const LlamaConfig& c);

// The weights of a Hugging Face directory opened for reading in pieces: the safetensors headers
// of model.safetensors or the index's shards are read and checked against c when it is made —
// ConfigError listing the first missing, extra or mis-shaped tensors, IoError for a file that
// cannot be read — and Read gives any element range of an update parameter, reading only those
// bytes, so each rank reads what its shards hold (Engine::LoadMainWeights with a reader).
class HfWeights {
 public:
  HfWeights(const std::string& dir, const LlamaConfig& c);
  // Elements [begin, begin + count) of update parameter `name` as fp32 (F32, BF16, F16 read
  // exactly; a table's padded rows are zeros). ConfigError for a non-finite value, naming the
  // tensor and element, or an unknown name.
  void Read(const std::string& name, size_t begin, size_t count, float* out);

 private:
  // Where an update parameter's elements lie: `valid` elements from element `first` of a
  // file's tensor, zeros after them (padded rows).
  struct Source {
    size_t file = 0;
    SafetensorsEntry entry;
    uint64_t first = 0, valid = 0;
  };
  std::string dir_;
  std::vector<std::string> paths_;
  std::vector<std::unique_ptr<InFile>> files_;  // opened on first use
  std::map<std::string, Source> sources_;
};

// The update parameters of the model c describes, read whole from the safetensors of the
// Hugging Face directory `dir` (model.safetensors, or the shards model.safetensors.index.json
// names): update name -> fp32 values (F32, BF16 and F16 are read exactly; padded rows zero).
// ConfigError listing the first missing, extra or mis-shaped tensors, or a non-finite value;
// IoError for a file that cannot be read.
std::map<std::string, std::vector<float>> ReadHfWeights(const std::string& dir,
                                                        const LlamaConfig& c);

// Writes c's config.json and its weights from `update` (update name -> tensor, as
// ReadConsolidated or a weights file give them) into `dir` (created if absent): one
// model.safetensors, or shards model-0000i-of-0000n.safetensors with
// model.safetensors.index.json when the weights exceed max_shard_bytes. fp32. Every file is
// written through a temporary renamed into place, and the weight files of an earlier export
// there that this one does not replace are removed (as transformers' save_pretrained does).
// ConfigError naming a missing or mis-shaped update parameter.
void WriteHfCheckpoint(const std::string& dir, const LlamaConfig& c,
                       const std::map<std::string, SafeTensor>& update,
                       int64_t max_shard_bytes = int64_t{5} << 30);

}  // namespace sshsdp
