// Sampling (generate.h): greedy generation equals the argmax of one forward pass over the
// generated sequence, token by token (the model is causal, so one pass sees what each step
// saw); temperature sampling follows the softmax; top-k never leaves the k most likely; a
// padded vocabulary's columns are never drawn; the model JSON round-trips.
#include "sshsdp/cli/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/testing/grad_check.h"

namespace sshsdp {
namespace {

GptConfig SmallGpt() {
  GptConfig c;
  c.vocab = 40;  // padded to 128 rows
  c.seq_len = 32;
  c.d_model = 16;
  c.n_head = 2;
  c.n_layer = 2;
  return c;
}

TEST(Generate, GreedyEqualsArgmaxOfOneForwardPass) {
  const GptConfig c = SmallGpt();
  Gpt model(c);
  DenseParams p(model);
  testing::RandomizeWeights(p, 5);  // O(1) activations: sharp, varied distributions
  const std::vector<int32_t> prompt = {3, 17, 9};
  const std::vector<int32_t> seq =
      Generate(model, p, c.vocab, c.seq_len, prompt, {/*tokens=*/25, /*temperature=*/0, 0, 1});
  ASSERT_EQ(seq.size(), 28u);
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), seq.begin()));
  const int T = static_cast<int>(seq.size()) - 1;
  std::vector<int32_t> tok(seq.begin(), seq.end() - 1);
  model.SetBatch(tok.data(), tok.data(), 1, T);
  for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, p.Weights(g));
  int distinct = 0;
  for (int t = static_cast<int>(prompt.size()) - 1; t < T; ++t) {
    const float* row = model.Probs() + static_cast<int64_t>(t) * model.ProbsStride();
    const int argmax = static_cast<int>(std::max_element(row, row + c.vocab) - row);
    EXPECT_EQ(seq[t + 1], argmax) << "position " << t + 1;
    distinct += seq[t + 1] != seq[t];
  }
  EXPECT_GT(distinct, 3);  // not one repeated token
}

TEST(Generate, ContextSlidesBeyondTheModelsLength) {
  const GptConfig c = SmallGpt();
  Gpt model(c);
  DenseParams p(model);
  testing::RandomizeWeights(p, 6);
  const std::vector<int32_t> seq = Generate(model, p, c.vocab, c.seq_len, {1}, {50, 0.8, 5, 3});
  ASSERT_EQ(seq.size(), 51u);
  for (int32_t t : seq) EXPECT_TRUE(t >= 0 && t < c.vocab);
  // The same seed draws the same tokens; another seed other ones.
  EXPECT_EQ(Generate(model, p, c.vocab, c.seq_len, {1}, {50, 0.8, 5, 3}), seq);
  EXPECT_NE(Generate(model, p, c.vocab, c.seq_len, {1}, {50, 0.8, 5, 4}), seq);
  EXPECT_THROW(Generate(model, p, c.vocab, c.seq_len, {}, {}), ConfigError);
  EXPECT_THROW(Generate(model, p, c.vocab, c.seq_len, {40}, {}), ConfigError);
}

TEST(SampleToken, FollowsTheSoftmaxAndRespectsTopK) {
  // Probabilities of 5 real tokens followed by 3 padded columns (0).
  const std::vector<float> probs = {0.1f, 0.4f, 0.2f, 0.25f, 0.05f, 0, 0, 0};
  std::mt19937_64 rng(11);
  std::vector<int> counts(8);
  const int n = 200000;
  for (int i = 0; i < n; ++i) counts[SampleToken(probs.data(), 5, 1.0, 0, rng)]++;
  for (int v = 0; v < 5; ++v) EXPECT_NEAR(counts[v] / double(n), probs[v], 0.005) << v;
  EXPECT_EQ(SampleToken(probs.data(), 5, 0.0, 0, rng), 1);  // greedy
  EXPECT_EQ(SampleToken(probs.data(), 5, 1.0, 1, rng), 1);  // top-1
  std::fill(counts.begin(), counts.end(), 0);
  for (int i = 0; i < n; ++i) counts[SampleToken(probs.data(), 5, 1.0, 2, rng)]++;
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);  // only tokens 1 and 3
  EXPECT_NEAR(counts[1] / double(n), 0.4 / 0.65, 0.005);
  // Temperature 0.5 squares the probabilities before renormalising.
  std::fill(counts.begin(), counts.end(), 0);
  for (int i = 0; i < n; ++i) counts[SampleToken(probs.data(), 5, 0.5, 0, rng)]++;
  double z = 0;
  for (int v = 0; v < 5; ++v) z += probs[v] * probs[v];
  for (int v = 0; v < 5; ++v) EXPECT_NEAR(counts[v] / double(n), probs[v] * probs[v] / z, 0.005);
}

TEST(ModelJson, RoundTripsPaddedGptAndMoe) {
  GptConfig c = SmallGpt();
  c.vocab = 50257;
  const auto gpt = ModelFromJson(GptModelJson(c));
  EXPECT_EQ(dynamic_cast<Gpt&>(*gpt).config().padded_vocab(), 50304);
  EXPECT_EQ(GptModelJson(dynamic_cast<Gpt&>(*gpt).config()), GptModelJson(c));
  GptConfig unpadded = SmallGpt();
  unpadded.vocab = 61;
  unpadded.vocab_multiple = 1;
  const auto old = ModelFromJson(GptModelJson(unpadded));  // no padded_vocab key: unpadded
  EXPECT_EQ(dynamic_cast<Gpt&>(*old).config().padded_vocab(), 61);
  MoeConfig m = MoeConfig::Preset("moe-tiny");
  m.moe_every = 2;
  const auto moe = ModelFromJson(MoeModelJson(m));
  EXPECT_EQ(MoeModelJson(dynamic_cast<MoeGpt&>(*moe).config()), MoeModelJson(m));
  nlohmann::json bad = GptModelJson(c);
  bad.erase("d_model");
  EXPECT_THROW(ModelFromJson(bad), ConfigError);
}

}  // namespace
}  // namespace sshsdp
