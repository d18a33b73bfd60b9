// Training data that needs no download, and readers for token files.
//
// A TokenSource maps a global sample index to T input tokens and T targets (the same T+1
// consecutive tokens shifted by one). Samples depend only on (source, seed, index), so
// different ranks and microbatches read different data and one process can rebuild any
// global batch exactly (SampleIndex fixes the numbering).
//
//   SyntheticTokens src(/*vocab=*/256, /*seed=*/7);
//   fmt::print("optimal loss {:.3f} nats\n", src.OptimalLoss());
//   src.Batch(SampleIndex(step, micro, n_micro, rank, n_ranks, 0, B), B, T, tok, tgt);
//
//   TokenFile file("train.bin", /*vocab=*/50257, /*seq_len=*/1024, /*seed=*/1);
//
// SyntheticTokens is an order-1 Markov chain over the vocabulary with a sparse random
// transition table (each state has `branching` successors, one of them on a random
// Hamiltonian cycle so the chain is irreducible). Every sample starts from the stationary
// distribution, so every position's best achievable loss is the entropy rate
// H = Σ_i π_i Σ_j −P_ij ln P_ij, which OptimalLoss() returns exactly: a model trained on it
// should approach that number.
//
// TokenFile reads uint16 tokens in either raw nanoGPT format (a flat uint16 array) or
// llm.c's format (256 int32 header: magic 20240520, version 1, token count; then uint16
// tokens), or uint32 tokens after magic 20240801 version 7 (llm.c's Llama 3 files) or magic
// 20240520 version 2. Anything malformed throws IoError naming the file and the problem.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace sshsdp {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int vocab() const = 0;
  // tokens[0..T) and targets[0..T) of global sample `index` (targets[t] = tokens[t+1] of the
  // underlying stream).
  virtual void Sample(int64_t index, int T, int32_t* tokens, int32_t* targets) const = 0;
  // Samples first_index .. first_index+B-1 as [B, T] row-major arrays.
  void Batch(int64_t first_index, int B, int T, int32_t* tokens, int32_t* targets) const;
};

// Global index of sample b (of B) in microbatch `micro` (of n_micro) on data-parallel rank
// `rank` (of n_ranks) at optimizer step `step`: steps take consecutive blocks of
// n_micro·n_ranks·B samples, ordered (micro, rank, b).
int64_t SampleIndex(int64_t step, int micro, int n_micro, int rank, int n_ranks, int b, int B);

class SyntheticTokens final : public TokenSource {
 public:
  SyntheticTokens(int vocab, uint64_t seed, int branching = 4, int max_seq_len = 1 << 20);

  int vocab() const override { return vocab_; }
  void Sample(int64_t index, int T, int32_t* tokens, int32_t* targets) const override;

  // Entropy rate of the chain in nats: the lowest expected loss any model can reach.
  double OptimalLoss() const { return entropy_rate_; }
  // P(next = j | current = i) and the stationary distribution.
  double Transition(int i, int j) const;
  const std::vector<double>& Stationary() const { return stationary_; }

 private:
  int Draw(const std::vector<int>& next, const std::vector<double>& cdf, uint64_t bits) const;

  int vocab_, branching_, max_seq_len_;
  uint64_t seed_;
  std::vector<std::vector<int>> next_;     // successors of each state
  std::vector<std::vector<double>> prob_;  // their probabilities
  std::vector<std::vector<double>> cdf_;   // cumulative, last entry 1
  std::vector<double> stationary_, stationary_cdf_;
  double entropy_rate_ = 0.0;
};

class TokenFile final : public TokenSource {
 public:
  // Maps the file read-only (ranks on one machine share its pages instead of each holding a
  // copy) and validates every token against `vocab`; vocab 0 takes it from the data
  // (InferVocab of the largest token). Samples are windows at positions drawn from (seed,
  // index). IoError for a directory, FIFO or other non-regular file, with the OS's reason
  // for an unreadable one.
  TokenFile(const std::string& path, int vocab, int seq_len, uint64_t seed = 0);
  ~TokenFile() override;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int vocab() const override { return vocab_; }
  void Sample(int64_t index, int T, int32_t* tokens, int32_t* targets) const override;

  int64_t num_tokens() const { return count_; }
  int max_token() const { return max_token_; }
  // The vocabulary a file whose largest token is max_token was most likely made with: 256
  // (bytes) below 256, GPT-2's 50,257 below that, else max_token + 1. --vocab-size overrides.
  static int InferVocab(int max_token);
  bool is_llmc_format() const { return llmc_; }
  int token_bytes() const { return width_; }  // 2 (uint16) or 4 (llm.c's uint32 files)

 private:
  std::string path_;
  int vocab_, seq_len_;
  uint64_t seed_;
  void Validate();  // header, size and every token of the mapped file

  bool llmc_ = false;
  int max_token_ = 0;
  void* map_ = nullptr;  // the whole file, mapped read-only
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;  // into map_, past the llm.c header if any
  int width_ = 2;                 // bytes per token
  int64_t count_ = 0;
  int64_t Token(int64_t i) const {
    return width_ == 2 ? static_cast<const uint16_t*>(tokens_)[i]
                       : static_cast<const uint32_t*>(tokens_)[i];
  }
};

// Writes tokens as a raw nanoGPT .bin (llmc=false) or an llm.c file (llmc=true). Throws
// IoError if the file cannot be written.
void WriteTokenFile(const std::string& path, const std::vector<uint16_t>& tokens, bool llmc);
// An llm.c file of uint32 tokens (llm.c's Llama 3 format: vocabularies beyond 65,536).
void WriteTokenFile(const std::string& path, const std::vector<uint32_t>& tokens);

// Streams an llm.c token file of any length without holding it: tokens go to `path`.tmp.<pid>
// as they come, Commit() writes the header's count, flushes and renames the file over `path`;
// a writer destroyed without Commit (an error on the way) removes its temporary, so nothing
// half-written is ever left under `path`. uint32 tokens when `wide` (vocabularies beyond
// 65,536), else uint16.
//
//   TokenFileWriter w("train.bin", /*wide=*/false);
//   w.Append(ids.data(), ids.size());   // as often as needed
//   w.Commit();                         // IoError naming the file when it cannot be written
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, bool wide);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void Append(const uint32_t* tokens, size_t n);
  int64_t count() const { return count_; }
  void Commit();

 private:
  std::string path_, tmp_;
  bool wide_;
  std::ofstream out_;
  std::vector<uint16_t> narrow_;  // Append's uint16 copy
  int64_t count_ = 0;
  bool committed_ = false;
};

inline constexpr int kGpt2Vocab = 50257;
inline constexpr int32_t kLlmcMagic = 20240520;  // uint16 tokens (GPT-2)
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int32_t kLlmcVersionWide = 2;     // the same magic, uint32 tokens
inline constexpr int32_t kLlmcMagic32 = 20240801;  // uint32 tokens (Llama 3)
inline constexpr int32_t kLlmcVersion32 = 7;
inline constexpr int kLlmcHeaderInts = 256;
inline constexpr int kMaxTokenFileVocab = 1 << 24;  // GptConfig's largest vocabulary

}  // namespace sshsdp
