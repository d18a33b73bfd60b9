// `sshsdp generate` (generate.h).
#include "sshsdp/cli/generate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/text/tokenizer.h"
#include "sshsdp/text/utf8.h"

namespace sshsdp {

void AddGenerateOptions(CLI::App& app, GenerateOptions& o) {
  app.add_option("--ckpt", o.ckpt,
                 "checkpoint root (its latest complete checkpoint) or step directory");
  app.add_option("--weights", o.weights,
                 "safetensors file written by `train --save-weights` or `ckpt export`");
  app.add_option("--prompt", o.prompt, "prompt text (byte vocabularies, or with --tokenizer)");
  app.add_option("--tokenizer", o.tokenizer,
                 "Hugging Face tokenizer.json the model's tokens come from: --prompt is encoded "
                 "with it, and the text is printed as it is generated");
  app.add_option("--prompt-tokens", o.prompt_tokens,
                 "prompt as comma-separated token ids (any vocabulary), e.g. 464,3290");
  app.add_option("--tokens", o.tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", o.temperature, "softmax temperature (0: greedy)")
      ->capture_default_str();
  app.add_option("--top-k", o.top_k, "sample among the k most likely tokens (0: all)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "sampling seed")->capture_default_str();
}

int SampleToken(const float* probs, int vocab, double temperature, int top_k,
                std::mt19937_64& rng) {
  if (temperature == 0) return static_cast<int>(std::max_element(probs, probs + vocab) - probs);
  std::vector<int> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  int k = top_k > 0 ? std::min(top_k, vocab) : vocab;
  if (k < vocab) {
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int a, int b) { return probs[a] > probs[b]; });
    ids.resize(k);
  }
  // p^(1/T) = softmax(logits / T) up to normalisation; in log space so small p do not vanish.
  std::vector<double> w(ids.size());
  double mx = -INFINITY;
  for (size_t i = 0; i < ids.size(); ++i) {
    w[i] =
        probs[ids[i]] > 0 ? std::log(static_cast<double>(probs[ids[i]])) / temperature : -INFINITY;
    mx = std::max(mx, w[i]);
  }
  double sum = 0;
  for (double& x : w) sum += (x = std::exp(x - mx));
  double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (size_t i = 0; i < ids.size(); ++i) {
    if ((u -= w[i]) < 0) return ids[i];
  }
  return ids.back();
}

std::vector<int32_t> Generate(Model& model, DenseParams& weights, int vocab, int seq_len,
                              std::vector<int32_t> prompt, const SampleOptions& o) {
  SSHSDP_CHECK(!prompt.empty(), ConfigError,
               "generate: the prompt is empty (--prompt or "
               "--prompt-tokens)");
  for (int32_t t : prompt)
    SSHSDP_CHECK(t >= 0 && t < vocab, ConfigError,
                 "generate: prompt token {} is outside the model's vocabulary of {}", t, vocab);
  SSHSDP_CHECK(o.tokens >= 0 && std::isfinite(o.temperature) && o.temperature >= 0 && o.top_k >= 0,
               ConfigError,
               "generate: --tokens ({}) and --top-k ({}) must be >= 0 and --temperature ({}) a "
               "finite number >= 0",
               o.tokens, o.top_k, o.temperature);
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> seq = std::move(prompt);
  for (int i = 0; i < o.tokens; ++i) {
    const int T = std::min<int>(static_cast<int>(seq.size()), seq_len);
    std::vector<int32_t> ctx(seq.end() - T, seq.end());
    model.SetBatch(ctx.data(), ctx.data(), 1, T);  // targets unused (any valid token)
    for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, weights.ModelWeights(g));
    const float* last = model.Probs() + static_cast<int64_t>(T - 1) * model.ProbsStride();
    seq.push_back(SampleToken(last, vocab, o.temperature, o.top_k, rng));
    if (o.on_token) o.on_token(seq.back());
  }
  return seq;
}

namespace {

std::vector<int32_t> ParseTokenList(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SSHSDP_CHECK(used == item.size() && used > 0, ConfigError,
                 "--prompt-tokens: '{}' is not a token id (want e.g. 464,3290)", item);
    out.push_back(v);
  }
  return out;
}

}  // namespace

int RunGenerate(const GenerateOptions& o) {
  try {
    SSHSDP_CHECK(o.prompt.empty() || o.prompt_tokens.empty(), ConfigError,
                 "--prompt and --prompt-tokens exclude each other");
    TrainedWeights in = ReadTrainedWeights(o.ckpt, o.weights, "generate");
    const nlohmann::json& model_json = in.model;
    const std::map<std::string, SafeTensor>& tensors = in.tensors;
    const std::string& source = in.source;
    // Or the one the Hugging Face directory of --init-from-hf had.
    const std::string tokenizer = o.tokenizer.empty() ? in.tokenizer : o.tokenizer;
    SSHSDP_CHECK(tokenizer.empty() || !o.tokenizer.empty() || std::filesystem::exists(tokenizer),
                 ConfigError,
                 "{} was trained from a Hugging Face directory whose tokenizer was {}, which is "
                 "gone: pass --tokenizer FILE",
                 source, tokenizer);
    std::unique_ptr<Model> model = ModelFromJson(model_json);
    const int vocab = model_json.at("vocab").get<int>();
    const int seq_len = model_json.at("seq_len").get<int>();
    DenseParams p(*model);
    std::vector<TensorSpec> want = ModelTensors(*model), have;
    for (const auto& [name, t] : tensors) have.push_back({name, t.shape});
    const std::string mismatch = DescribeTensorMismatch(want, have, source);
    SSHSDP_CHECK(mismatch.empty(), ConfigError, "{}", mismatch);
    for (int g = 0; g < p.num_groups(); ++g)
      for (size_t i = 0; i < p.specs(g).size(); ++i)
        for (const UpdatePart& part : p.specs(g)[i].parts) {
          const std::vector<float>& v = tensors.at(part.name).data;
          std::copy(v.begin(), v.end(), p.master(g, i).begin() + part.offset);
        }
    p.SyncWeights();

    std::optional<Tokenizer> tok;
    if (!tokenizer.empty()) {
      tok = Tokenizer::FromFile(tokenizer);
      SSHSDP_CHECK(tok->vocab_size() <= vocab, ConfigError,
                   "--tokenizer {} has {} tokens, more than the model's vocabulary of {}: not "
                   "the tokenizer the model was trained with",
                   tokenizer, tok->vocab_size(), vocab);
    }
    std::vector<int32_t> prompt;
    if (!o.prompt_tokens.empty()) {
      prompt = ParseTokenList(o.prompt_tokens);
    } else if (tok) {
      prompt = tok->Encode(o.prompt);
    } else {
      SSHSDP_CHECK(vocab == 256, ConfigError,
                   "--prompt takes text for byte-level models; this model's vocabulary is {}: "
                   "give --prompt-tokens (ids of its tokenizer)",
                   vocab);
      for (unsigned char c : o.prompt) prompt.push_back(c);
    }
    const size_t n_prompt = prompt.size();
    SampleOptions so{o.tokens, o.temperature, o.top_k, o.seed, nullptr};
    std::string pending;  // generated bytes not printed yet: an unfinished character
    if (tok) {            // stream: the prompt, then the text as it is drawn (complete characters)
      fmt::print("{}", tok->Decode(prompt));
      so.on_token = [&](int32_t t) {
        if (t < tok->vocab_size()) pending += tok->DecodeBytes({t});
        const size_t ready = Utf8CompletePrefix(pending);
        fmt::print("{}", Utf8Lossy(std::string_view(pending).substr(0, ready)));
        pending.erase(0, ready);
        std::fflush(stdout);
      };
    }
    const std::vector<int32_t> seq = Generate(*model, p, vocab, seq_len, std::move(prompt), so);
    if (tok) {
      fmt::print("{}\n", Utf8Lossy(pending));
    } else if (vocab == 256) {
      std::string text(seq.begin(), seq.end());
      fmt::print("{}\n", text);
    } else {
      fmt::print("{}\n", fmt::join(seq, ","));
    }
    fmt::print(stderr, "generated {} tokens after a {}-token prompt from {}\n",
               seq.size() - n_prompt, n_prompt, source);
    return 0;
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "sshsdp generate: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace sshsdp
