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
#include <sstream>

#include "sshsdp/base/error.h"
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

std::string ReadWhole(const std::string& path) {
  std::error_code ec;
  SSHSDP_CHECK(fs::is_regular_file(path, ec), IoError, "--input {}: not a readable regular file{}",
               path, fs::is_directory(path, ec) ? " (a directory: name its files)" : "");
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

// Writes tokens under a temporary name in the target's directory and renames it over the
// target: a crash leaves no half-written file under the final name.
void WriteAtomically(const std::string& path, const std::vector<uint32_t>& tokens, bool wide) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  try {
    if (wide) {
      WriteTokenFile(tmp, tokens);
    } else {
      WriteTokenFile(tmp, std::vector<uint16_t>(tokens.begin(), tokens.end()), /*llmc=*/true);
    }
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) std::remove(tmp.c_str());
  SSHSDP_CHECK(!ec, IoError, "--out {}: cannot rename the written file into place: {}", path,
               ec.message());
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
  for (const std::string& out : {o.out, o.val_out}) {
    if (out.empty()) continue;
    SSHSDP_CHECK(!fs::is_directory(out, ec), ConfigError,
                 "{} is a directory: --out / --val-out name files", out);
    for (const std::string& in : o.inputs)
      SSHSDP_CHECK(!fs::exists(in, ec) || !fs::exists(out, ec) || !fs::equivalent(in, out, ec),
                   ConfigError, "{} is both an input and an output: choose another --out", out);
  }
  SSHSDP_CHECK(o.val_out.empty() || o.out != o.val_out, ConfigError,
               "--out and --val-out name the same file");
}

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
    std::vector<Document> docs;
    for (const std::string& in : o.inputs) {
      if (in.ends_with(".jsonl")) {
        ReadJsonl(in, o.text_key, &docs);
      } else {
        ReadText(in, o.document_per_file, &docs);
      }
    }
    SSHSDP_CHECK(!docs.empty(), IoError, "--input: no documents (the files hold no text)");
    int64_t total_bytes = 0, done_bytes = 0, n_tokens = 0;
    for (const Document& d : docs) total_bytes += static_cast<int64_t>(d.text.size());
    const int threads = Threads(o.threads);
    fmt::print(stderr,
               "sshsdp tokenize: {} | {} documents, {:.1f} MB from {} file(s) | {} threads\n",
               tok.Describe(), docs.size(), total_bytes / 1e6, o.inputs.size(), threads);

    std::vector<uint32_t> train, val;
    int64_t n_val = 0;
    const auto start = Clock::now();
    const size_t batch = 1024;
    for (size_t b0 = 0; b0 < docs.size(); b0 += batch) {
      const size_t b1 = std::min(docs.size(), b0 + batch);
      std::vector<std::string> texts;
      for (size_t i = b0; i < b1; ++i) texts.push_back(std::move(docs[i].text));
      for (const std::string& t : texts) done_bytes += static_cast<int64_t>(t.size());
      const auto ids = tok.EncodeBatch(texts, threads);
      for (size_t i = b0; i < b1; ++i) {
        const bool to_val = o.val_fraction > 0 && IsValidation(i, o.val_fraction);
        std::vector<uint32_t>& dst = to_val ? val : train;
        n_val += to_val;
        dst.insert(dst.end(), ids[i - b0].begin(), ids[i - b0].end());
        dst.push_back(static_cast<uint32_t>(*eot));
        n_tokens += static_cast<int64_t>(ids[i - b0].size()) + 1;
      }
      const double s = std::chrono::duration<double>(Clock::now() - start).count();
      fmt::print(stderr, "\r  {:5.1f} % | {:.1f} MB/s | {:.0f} tokens/s   ",
                 100.0 * done_bytes / total_bytes, done_bytes / 1e6 / std::max(s, 1e-9),
                 n_tokens / std::max(s, 1e-9));
    }
    SSHSDP_CHECK(o.val_out.empty() || (n_val > 0 && n_val < static_cast<int64_t>(docs.size())),
                 ConfigError,
                 "--val-fraction {} sent {} of the {} documents to validation: each file needs at "
                 "least one; change --val-fraction (nothing was written)",
                 o.val_fraction, n_val, docs.size());
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const bool wide = tok.vocab_size() > 65536;
    WriteAtomically(o.out, train, wide);
    if (!o.val_out.empty()) WriteAtomically(o.val_out, val, wide);
    fmt::print(stderr, "\n");
    fmt::print(
        "sshsdp tokenize: {} documents ({} to validation), {} tokens ({} train, {} "
        "validation), {:.2f} bytes per token, {:.1f} MB/s, {} tokens -> {}{}\n",
        docs.size(), n_val, n_tokens, train.size(), val.size(),
        static_cast<double>(total_bytes) / n_tokens, total_bytes / 1e6 / seconds,
        wide ? "uint32" : "uint16", o.out, o.val_out.empty() ? "" : ", " + o.val_out);
    fmt::print("train on it with --vocab-size {} (the tokenizer's vocabulary)\n", tok.vocab_size());
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "sshsdp tokenize: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace sshsdp
