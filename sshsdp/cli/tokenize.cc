// `sshsdp tokenize` (tokenize.h): read the documents, check them, encode them in batches on
// several threads with a progress line, write the token files atomically, print a summary.
#include "sshsdp/cli/tokenize.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "sshsdp/base/error.h"
#include "sshsdp/cli/run_config.h"
#include "sshsdp/models/data.h"
#include "sshsdp/text/tokenizer.h"
#include "sshsdp/text/utf8.h"

namespace sshsdp {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Document {
  std::string text;
  std::string where;  // file:line of its first line
};

void CheckInputFile(const std::string& path) {
  std::error_code ec;
  SSHSDP_CHECK(fs::is_regular_file(path, ec) && ::access(path.c_str(), R_OK) == 0, IoError,
               "--input {}: not a readable regular file{}", path,
               fs::is_directory(path, ec) ? " (a directory: name its files)" : "");
}

std::string ReadWhole(const std::string& path) {
  CheckInputFile(path);
  std::ifstream in(path, std::ios::binary);
  SSHSDP_CHECK(in.good(), IoError, "--input {}: cannot read it", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// IoError naming file and line of the first invalid UTF-8 byte of `text`, which starts at
// line `line0` of `path`.
void CheckUtf8(std::string_view text, const std::string& path, int64_t line0) {
  const size_t bad = FirstInvalidUtf8(text);
  if (bad == std::string_view::npos) return;
  const int64_t line = line0 + std::count(text.begin(), text.begin() + bad, '\n');
  throw IoError(fmt::format("{}:{}: invalid UTF-8 (byte 0x{:02x}); the input must be UTF-8 text",
                            path, line, static_cast<unsigned char>(text[bad])));
}

void ReadJsonl(const std::string& path, const std::string& key, std::vector<Document>* docs) {
  std::istringstream in(ReadWhole(path));
  int64_t line = 0;
  for (std::string s; std::getline(in, s);) {
    ++line;
    if (s.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false);
    SSHSDP_CHECK(!j.is_discarded() && j.is_object(), IoError,
                 "{}:{}: not a JSON object (one per line in a .jsonl file)", path, line);
    SSHSDP_CHECK(j.contains(key) && j[key].is_string(), IoError,
                 "{}:{}: no string '{}' (--text-key names the field holding the text)", path, line,
                 key);
    std::string text = j[key].get<std::string>();
    CheckUtf8(text, path, line);
    docs->push_back({std::move(text), fmt::format("{}:{}", path, line)});
  }
}

void ReadText(const std::string& path, bool whole, std::vector<Document>* docs) {
  const std::string all = ReadWhole(path);
  CheckUtf8(all, path, 1);
  if (whole) {
    if (!all.empty()) docs->push_back({all, path + ":1"});
    return;
  }
  std::istringstream in(all);
  std::string block;
  int64_t line = 0, first = 1;
  auto flush = [&] {
    while (!block.empty() && block.back() == '\n') block.pop_back();
    if (!block.empty()) docs->push_back({block, fmt::format("{}:{}", path, first)});
    block.clear();
  };
  for (std::string s; std::getline(in, s);) {
    ++line;
    if (s.find_first_not_of(" \t\r") == std::string::npos) {
      flush();
      first = line + 1;
      continue;
    }
    block += s + "\n";
  }
  flush();
}

// Whether document i goes to validation: a fixed pseudo-random draw per index.
bool IsValidation(size_t i, double fraction) {
  uint64_t x = i + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<double>((x ^ (x >> 31)) >> 11) * 0x1.0p-53 < fraction;
}

int Threads(int asked) {
  if (asked > 0) return asked;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

void CheckOutputs(const TokenizeOptions& o) {
  SSHSDP_CHECK(!o.inputs.empty(), ConfigError, "--input needs at least one file");
  SSHSDP_CHECK(!o.out.empty(), ConfigError, "--out names the token file to write");
  SSHSDP_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0, ConfigError,
               "--val-fraction must lie in [0, 1), got {}", o.val_fraction);
  SSHSDP_CHECK((o.val_fraction > 0.0) == !o.val_out.empty(), ConfigError,
               "--val-out and --val-fraction go together (the file, and the share of documents "
               "it receives)");
  std::error_code ec;
  const std::vector<NamedPath> outputs = {{"--out", o.out}, {"--val-out", o.val_out}};
  for (const auto& [flag, out] : outputs)
    SSHSDP_CHECK(out.empty() || !fs::is_directory(out, ec), ConfigError,
                 "{} {} is a directory: name a file", flag, out);
  std::vector<NamedPath> inputs = {{"--tokenizer", o.tokenizer}};
  for (const std::string& in : o.inputs) inputs.emplace_back("--input", in);
  CheckOutputsDistinct(outputs, inputs);
  CheckOutputsOutsideInputDirs(outputs, {{"--tokenizer", o.tokenizer}});
  CheckOutputsOutsideCheckpoints(outputs, {});
  for (const std::string& in : o.inputs) CheckInputFile(in);  // every input, before any is read
}

// The documents of one input file.
std::vector<Document> ReadDocuments(const std::string& in, const TokenizeOptions& o) {
  std::vector<Document> docs;
  if (in.ends_with(".jsonl")) {
    ReadJsonl(in, o.text_key, &docs);
  } else {
    ReadText(in, o.document_per_file, &docs);
  }
  return docs;
}

// The token files being written and what went where.
struct Outputs {
  Outputs(const TokenizeOptions& o, bool wide) : train(o.out, wide) {
    if (!o.val_out.empty()) val.emplace(o.val_out, wide);
  }
  TokenFileWriter train;
  std::optional<TokenFileWriter> val;
  int64_t docs = 0, val_docs = 0;
};

// Encodes `docs` in batches on `threads` threads into the outputs, each document followed by
// the end-of-text token; the progress line after each batch.
class Encoder {
 public:
  Encoder(const Tokenizer& tok, uint32_t eot, const TokenizeOptions& o, int64_t total_bytes)
      : tok_(tok), eot_(eot), o_(o), total_bytes_(total_bytes), start_(Clock::now()) {}

  // The documents of one input file of `file_bytes` bytes.
  void Encode(std::vector<Document>& docs, int64_t file_bytes, Outputs* out) {
    constexpr size_t kBatch = 1024;
    int64_t text_bytes = 0, encoded = 0;
    for (const Document& d : docs) text_bytes += static_cast<int64_t>(d.text.size());
    for (size_t b0 = 0; b0 < docs.size(); b0 += kBatch) {
      const size_t b1 = std::min(docs.size(), b0 + kBatch);
      std::vector<std::string> texts;
      for (size_t i = b0; i < b1; ++i) texts.push_back(std::move(docs[i].text));
      for (const std::string& t : texts) encoded += static_cast<int64_t>(t.size());
      const auto ids = tok_.EncodeBatch(texts, Threads(o_.threads));
      for (const std::vector<int32_t>& d : ids) {
        const bool to_val =
            out->val && IsValidation(static_cast<size_t>(out->docs), o_.val_fraction);
        TokenFileWriter& w = to_val ? *out->val : out->train;
        w.Append(reinterpret_cast<const uint32_t*>(d.data()), d.size());
        w.Append(&eot_, 1);
        out->val_docs += to_val;
        ++out->docs;
        tokens_ += static_cast<int64_t>(d.size()) + 1;
      }
      // Progress in file bytes: the files done, and this one's share of its text encoded.
      const double done = static_cast<double>(files_done_) + static_cast<double>(file_bytes) *
                                                                 encoded /
                                                                 std::max<int64_t>(text_bytes, 1);
      fmt::print(stderr, "\r  {:5.1f} % | {:.1f} MB/s | {:.0f} tokens/s   ",
                 100.0 * done / std::max<int64_t>(total_bytes_, 1), done / 1e6 / Seconds(),
                 tokens_ / Seconds());
    }
    files_done_ += file_bytes;
    text_bytes_ += text_bytes;
  }

  int64_t text_bytes() const { return text_bytes_; }

  int64_t tokens() const { return tokens_; }
  double Seconds() const {
    return std::max(std::chrono::duration<double>(Clock::now() - start_).count(), 1e-9);
  }

 private:
  const Tokenizer& tok_;
  const uint32_t eot_;
  const TokenizeOptions& o_;
  const int64_t total_bytes_;
  const Clock::time_point start_;
  int64_t files_done_ = 0, text_bytes_ = 0, tokens_ = 0;
};

}  // namespace

void AddTokenizeOptions(CLI::App& app, TokenizeOptions& o) {
  app.add_option("--tokenizer", o.tokenizer,
                 "Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen)")
      ->required();
  app.add_option("--input", o.inputs,
                 "text files (documents: blank-line-separated blocks) and .jsonl files (one "
                 "document per line)")
      ->required();
  app.add_option("--out", o.out, "the token file to write (llm.c format)")->required();
  app.add_option("--val-out", o.val_out, "the validation token file (with --val-fraction)");
  app.add_option("--val-fraction", o.val_fraction,
                 "share of documents for --val-out, drawn deterministically per document")
      ->capture_default_str();
  app.add_option("--text-key", o.text_key, "the field of a .jsonl line holding its text")
      ->capture_default_str();
  app.add_flag("--document-per-file", o.document_per_file,
               "each plain-text file is one document (default: each blank-line-separated block)");
  app.add_option("--threads", o.threads, "encoding threads (0: the CPUs this process may use)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
}

int RunTokenize(const TokenizeOptions& o) {
  try {
    CheckOutputs(o);
    const Tokenizer tok = Tokenizer::FromFile(o.tokenizer);
    const std::optional<int32_t> eot = tok.EndOfText();
    SSHSDP_CHECK(eot.has_value(), ConfigError,
                 "{}: no end-of-text token (<|endoftext|>, <|end_of_text|> or a special added "
                 "token) to separate documents with",
                 o.tokenizer);
    int64_t total_bytes = 0;
    for (const std::string& in : o.inputs) total_bytes += static_cast<int64_t>(fs::file_size(in));
    const bool wide = tok.vocab_size() > 65536;
    fmt::print(stderr, "sshsdp tokenize: {} | {:.1f} MB in {} file(s) | {} threads\n",
               tok.Describe(), total_bytes / 1e6, o.inputs.size(), Threads(o.threads));
    // One input file in memory at a time; the tokens stream to temporary files that become
    // --out / --val-out only when everything succeeded.
    Outputs out(o, wide);
    Encoder enc(tok, static_cast<uint32_t>(*eot), o, total_bytes);
    for (const std::string& in : o.inputs) {
      std::vector<Document> docs = ReadDocuments(in, o);
      enc.Encode(docs, static_cast<int64_t>(fs::file_size(in)), &out);
    }
    fmt::print(stderr, "\n");
    SSHSDP_CHECK(out.docs > 0, IoError, "--input: no documents (the files hold no text)");
    SSHSDP_CHECK(!out.val || (out.val_docs > 0 && out.val_docs < out.docs), ConfigError,
                 "--val-fraction {} sent {} of the {} documents to validation: each file needs at "
                 "least one; change --val-fraction (nothing was written)",
                 o.val_fraction, out.val_docs, out.docs);
    const double seconds = enc.Seconds();
    out.train.Commit();
    if (out.val) out.val->Commit();
    fmt::print(
        "sshsdp tokenize: {} documents ({} to validation), {} tokens ({} train, {} "
        "validation), {:.2f} bytes per token, {:.1f} MB/s, {} tokens -> {}{}\n",
        out.docs, out.val_docs, enc.tokens(), out.train.count(), out.val ? out.val->count() : 0,
        static_cast<double>(enc.text_bytes()) / enc.tokens(), total_bytes / 1e6 / seconds,
        wide ? "uint32" : "uint16", o.out, o.val_out.empty() ? "" : ", " + o.val_out);
    fmt::print("train on it with --vocab-size {} (the tokenizer's vocabulary)\n", tok.vocab_size());
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "sshsdp tokenize: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace sshsdp
