// Tokenizer: a Hugging Face `tokenizer.json` of the byte-level BPE family (GPT-2, Llama 3,
// Qwen2 / Qwen3), encoding and decoding exactly as HF `tokenizers` does — the ids of every
// text are HF's (tokenizer_test holds them to goldens `tokenizers` wrote).
//
// What it reads: the normalizer (none, or NFC — ICU), the pre-tokenizer (ByteLevel with its
// GPT-2 regex, or a Sequence of Split(Regex, "Isolated") and ByteLevel without regex — the
// Llama 3 / Qwen pattern, run by PCRE2 with Unicode properties), the BPE model (vocab, merges,
// ignore_merges), the added tokens (matched in the raw text before anything else, leftmost and
// longest first) and the ByteLevel decoder. Anything else — WordPiece or Unigram models, BPE
// dropout or subword prefixes, another normalizer or pre-tokenizer, added tokens with strip
// or single-word options — is refused when the file is read, naming the key: never a silently
// different tokenization. The post-processor is not applied (HF's add_special_tokens=False):
// documents are joined with EndOfText() by the caller.
//
//   Tokenizer tok = Tokenizer::FromFile("tokenizer.json");
//   std::vector<int32_t> ids = tok.Encode("Hello, world");
//   std::string back = tok.Decode(ids);                       // == "Hello, world"
//   auto all = tok.EncodeBatch(documents, /*threads=*/4);     // documents in parallel
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sshsdp {

class Tokenizer {
 public:
  // A tokenizer.json, or a Hugging Face model directory holding one. IoError for an
  // unreadable file or invalid JSON; ConfigError naming what is unsupported.
  static Tokenizer FromFile(const std::string& file_or_dir);
  static Tokenizer FromJson(std::string_view json_text, const std::string& where);

  // IoError naming the byte offset of invalid UTF-8.
  std::vector<int32_t> Encode(std::string_view text) const;
  // Every document on up to `threads` threads (the result in document order).
  std::vector<std::vector<int32_t>> EncodeBatch(const std::vector<std::string>& docs,
                                                int threads) const;
  // The text of `ids` (added tokens as their content; skip_special leaves special ones out).
  // Ids outside the vocabulary: ConfigError. A byte sequence cut inside a character decodes
  // to U+FFFD, as HF does.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The bytes `ids` stand for, as they are (a streamed decode: a character cut between two
  // tokens is completed by the next).
  std::string DecodeBytes(const std::vector<int32_t>& ids) const;

  int vocab_size() const;  // the largest id + 1
  std::optional<int32_t> TokenId(std::string_view token) const;
  // The token documents are separated by: <|endoftext|> where the vocabulary has it, else
  // <|end_of_text|> (Llama 3), else the first special added token; nullopt without any.
  std::optional<int32_t> EndOfText() const;
  // "byte-level BPE, 50,257 tokens, GPT-2 regex, no normalizer" and the like.
  std::string Describe() const;

  struct Impl;  // opaque: tokenizer.cc

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace sshsdp
