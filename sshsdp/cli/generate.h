// `sshsdp generate`: sample text from a checkpoint or a safetensors weights file, in one
// process (no mpirun). The model comes from the file's model description (what `train`
// records), the weights are the fp32 main weights.
//
//   sshsdp generate --ckpt out/ckpt --prompt "int main(" --tokens 100 --temperature 0.8 --top-k 40
//   sshsdp generate --weights out/final.safetensors --prompt-tokens 464,3290 --temperature 0
//
// Sampling runs a full forward pass over the last min(length, seq_len) tokens per new token
// (no KV cache: the reference models are small) and draws from the last position's softmax:
// temperature 0 is greedy (argmax), otherwise p^(1/temperature) renormalised over the top-k
// tokens (k = 0: all), from a std::mt19937_64 seeded with --seed. With --tokenizer (a HF
// tokenizer.json) --prompt is encoded with it and the text is printed as it is generated;
// without one, byte vocabularies print text and others token ids.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "sshsdp/params/model.h"

namespace sshsdp {

struct GenerateOptions {
  std::string ckpt, weights;  // exactly one
  std::string prompt, prompt_tokens;
  std::string tokenizer;
  int tokens = 64;
  double temperature = 1.0;
  int top_k = 0;
  uint64_t seed = 1;
};

void AddGenerateOptions(CLI::App& app, GenerateOptions& o);
// Returns the exit code: 0, or 1 after printing the error.
int RunGenerate(const GenerateOptions& o);

struct SampleOptions {
  int tokens = 64;
  double temperature = 1.0;
  int top_k = 0;
  uint64_t seed = 1;
  std::function<void(int32_t)> on_token;  // called with each new token as it is drawn
};

// The next token from one row of probabilities (vocab entries; padded columns excluded).
int SampleToken(const float* probs, int vocab, double temperature, int top_k, std::mt19937_64& rng);
// prompt followed by o.tokens sampled tokens. `weights` are the model's runtime weights
// (DenseParams), `vocab` its real vocabulary and `seq_len` its context. ConfigError for an
// empty prompt or a token outside the vocabulary.
std::vector<int32_t> Generate(Model& model, DenseParams& weights, int vocab, int seq_len,
                              std::vector<int32_t> prompt, const SampleOptions& o);

}  // namespace sshsdp
