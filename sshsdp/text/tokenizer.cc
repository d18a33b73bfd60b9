// Tokenizer (tokenizer.h): reading tokenizer.json, and HF `tokenizers`' pipeline for byte-level
// BPE — added tokens split out of the raw text, each stretch between them normalized (NFC,
// ICU), pre-tokenized (PCRE2, "Isolated" splits) and mapped to GPT-2's byte-level alphabet,
// each piece merged by BPE rank (a heap of candidate merges, lowest rank then leftmost first,
// as tokenizers' word.rs), and the ByteLevel decoder with from_utf8_lossy's replacement.
#include "sshsdp/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "sshsdp/base/error.h"
#include "sshsdp/text/utf8.h"

namespace sshsdp {
namespace {

using json = nlohmann::json;

// Token ids a tokenizer may use: the largest vocabulary a model or token file takes (the
// id_to_token table is sized by the largest id).
constexpr int64_t kMaxTokenizerVocab = int64_t{1} << 24;

// GPT-2's pre-tokenization regex (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A compiled pattern; matching is thread-safe (match data per call).
struct Regex {
  pcre2_code* code = nullptr;
  explicit Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE at = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &at, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      throw ConfigError(fmt::format("{}: the Split regex does not compile at offset {}: {}", where,
                                    at, reinterpret_cast<const char*>(msg)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // a speed-up where available, else matched
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // "Isolated" split of valid UTF-8: every match and every stretch between matches, in order.
  void Split(std::string_view s, std::vector<std::string_view>* out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t pos = 0, gap = 0;
    while (pos < s.size()) {
      const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // an empty match: move on by one character
        pos = ov[0] + Utf8Length(static_cast<unsigned char>(s[ov[0]]));
        continue;
      }
      if (ov[0] > gap) out->push_back(s.substr(gap, ov[0] - gap));
      out->push_back(s.substr(ov[0], ov[1] - ov[0]));
      pos = gap = ov[1];
    }
    if (gap < s.size()) out->push_back(s.substr(gap));
    pcre2_match_data_free(md);
  }
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

}  // namespace

struct Tokenizer::Impl {
  std::string where;
  bool nfc = false;
  bool add_prefix_space = false;
  std::string pattern_name;
  std::unique_ptr<Regex> regex;
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;                              // vocabulary and added tokens
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, id)
  int32_t byte_id[256];                                              // byte-level symbols
  std::vector<AddedToken> added;
  std::vector<uint8_t> added_first;  // [256]: some added token starts with this byte
  std::vector<char> special;         // per id: a special added token

  using Cache = std::unordered_map<std::string, std::vector<int32_t>>;
  void EncodeStretch(std::string_view text, Cache& cache, std::vector<int32_t>* out) const;
  void EncodePiece(std::string_view piece, Cache& cache, std::vector<int32_t>* out) const;
  void Merge(std::vector<int32_t>& symbols) const;
  std::vector<int32_t> Encode(std::string_view text, Cache& cache) const;
};

namespace {

const json& Need(const json& j, const char* key, const std::string& where) {
  SSHSDP_CHECK(j.is_object() && j.contains(key), ConfigError, "{}: '{}' is missing", where, key);
  return j.at(key);
}

// ConfigError unless j is null, false, or absent under `key` (an option this reader refuses).
void Refuse(const json& obj, const char* key, const std::string& where, const char* what) {
  if (!obj.is_object() || !obj.contains(key)) return;
  const json& v = obj.at(key);
  const bool off = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                   (v.is_string() && v.get<std::string>().empty());
  SSHSDP_CHECK(off, ConfigError, "{}: {} ('{}': {}) is not supported", where, what, key, v.dump());
}

void ReadNormalizer(const json& n, Tokenizer::Impl& t) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  SSHSDP_CHECK(type == "NFC", ConfigError,
               "{}: normalizer '{}' is not supported (none or NFC: GPT-2, Llama 3, Qwen2/Qwen3)",
               t.where, type);
  t.nfc = true;
}

void ReadByteLevel(const json& p, Tokenizer::Impl& t, bool regex_allowed) {
  t.add_prefix_space = p.value("add_prefix_space", false);
  if (p.value("use_regex", true)) {
    SSHSDP_CHECK(regex_allowed, ConfigError,
                 "{}: a ByteLevel pre-tokenizer with use_regex after a Split is not supported",
                 t.where);
    t.regex = std::make_unique<Regex>(kGpt2Pattern, t.where);
    t.pattern_name = "GPT-2 regex";
  }
}

void ReadPreTokenizer(const json& p, Tokenizer::Impl& t) {
  const std::string type = p.is_null() ? "none" : p.value("type", "");
  if (type == "ByteLevel") return ReadByteLevel(p, t, true);
  SSHSDP_CHECK(type == "Sequence", ConfigError,
               "{}: pre-tokenizer '{}' is not supported (ByteLevel, or a Sequence of Split and "
               "ByteLevel)",
               t.where, type);
  const json& seq = Need(p, "pretokenizers", t.where);
  SSHSDP_CHECK(seq.is_array() && seq.size() == 2 && seq[0].value("type", "") == "Split" &&
                   seq[1].value("type", "") == "ByteLevel",
               ConfigError,
               "{}: pre-tokenizer Sequence {} is not supported (Split(Regex, Isolated) then "
               "ByteLevel, as Llama 3 and Qwen)",
               t.where, seq.dump());
  const json& split = seq[0];
  SSHSDP_CHECK(split.value("behavior", "") == "Isolated" && !split.value("invert", false),
               ConfigError, "{}: Split behavior '{}' (invert {}) is not supported (Isolated)",
               t.where, split.value("behavior", ""), split.value("invert", false));
  const json& pat = Need(split, "pattern", t.where);
  SSHSDP_CHECK(pat.is_object() && pat.contains("Regex"), ConfigError,
               "{}: Split pattern {} is not supported (a Regex)", t.where, pat.dump());
  t.regex = std::make_unique<Regex>(pat["Regex"].get<std::string>(), t.where);
  t.pattern_name = "Split regex";
  ReadByteLevel(seq[1], t, false);
}

uint64_t PairKey(int32_t a, int32_t b) {
  return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
}

// A token id: an integer below kMaxTokenizerVocab (the id_to_token table is sized by it).
int32_t TokenId(const json& id, const std::string& what, const std::string& where) {
  SSHSDP_CHECK(
      id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < kMaxTokenizerVocab,
      ConfigError, "{}: {} has id {}, not an integer from 0 to {}", where, what, id.dump(),
      kMaxTokenizerVocab - 1);
  return id.get<int32_t>();
}

void ReadModel(const json& m, Tokenizer::Impl& t) {
  const std::string type = m.value("type", "BPE");
  SSHSDP_CHECK(type == "BPE", ConfigError,
               "{}: model '{}' is not supported (byte-level BPE only: GPT-2, Llama 3, Qwen)",
               t.where, type);
  Refuse(m, "dropout", t.where, "BPE dropout");
  Refuse(m, "continuing_subword_prefix", t.where, "a continuing-subword prefix");
  Refuse(m, "end_of_word_suffix", t.where, "an end-of-word suffix");
  Refuse(m, "byte_fallback", t.where, "byte fallback");
  t.ignore_merges = m.value("ignore_merges", false);
  for (const auto& [tok, id] : Need(m, "vocab", t.where).items()) {
    const int32_t i = TokenId(id, fmt::format("token '{}'", tok), t.where);
    t.vocab.emplace(tok, i);
    if (static_cast<size_t>(i) >= t.id_to_token.size()) t.id_to_token.resize(i + 1);
    t.id_to_token[i] = tok;
  }
  int32_t rank = 0;
  for (const json& mg : Need(m, "merges", t.where)) {
    std::string a, b;
    if (mg.is_string()) {  // "a b" (older files)
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      SSHSDP_CHECK(sp != std::string::npos, ConfigError, "{}: merge '{}' is not 'a b'", t.where, s);
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      SSHSDP_CHECK(mg.is_array() && mg.size() == 2, ConfigError, "{}: merge {} is not [a, b]",
                   t.where, mg.dump());
      a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
    }
    const auto ia = t.vocab.find(a), ib = t.vocab.find(b), iab = t.vocab.find(a + b);
    SSHSDP_CHECK(ia != t.vocab.end() && ib != t.vocab.end() && iab != t.vocab.end(), ConfigError,
                 "{}: merge '{} {}' names a token outside the vocabulary", t.where, a, b);
    t.merges.emplace(PairKey(ia->second, ib->second), std::pair{rank++, iab->second});
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = t.vocab.find(ByteLevelChar(static_cast<uint8_t>(b)));
    SSHSDP_CHECK(it != t.vocab.end(), ConfigError,
                 "{}: the vocabulary lacks the byte-level symbol of byte 0x{:02x} (not a "
                 "byte-level BPE vocabulary)",
                 t.where, b);
    t.byte_id[b] = it->second;
  }
}

void ReadAddedTokens(const json& list, Tokenizer::Impl& t) {
  t.added_first.assign(256, 0);
  for (const json& a : list) {
    const std::string what = fmt::format("added token {}", a.value("content", ""));
    for (const char* opt : {"single_word", "lstrip", "rstrip"}) Refuse(a, opt, t.where, opt);
    AddedToken tok{Need(a, "content", t.where).get<std::string>(),
                   TokenId(Need(a, "id", t.where), what, t.where), a.value("special", false)};
    SSHSDP_CHECK(!tok.content.empty(), ConfigError, "{}: {} is empty", t.where, what);
    if (static_cast<size_t>(tok.id) >= t.id_to_token.size()) t.id_to_token.resize(tok.id + 1);
    t.id_to_token[tok.id] = tok.content;
    t.added_first[static_cast<uint8_t>(tok.content[0])] = 1;
    t.added.push_back(std::move(tok));
  }
  // Longest first: at one position the longest added token wins.
  std::stable_sort(t.added.begin(), t.added.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  t.special.assign(t.id_to_token.size(), 0);
  for (const AddedToken& a : t.added) t.special[a.id] = a.special;
}

void ReadDecoder(const json& d, const std::string& where) {
  const std::string type = d.is_null() ? "none" : d.value("type", "");
  SSHSDP_CHECK(type == "ByteLevel", ConfigError, "{}: decoder '{}' is not supported (ByteLevel)",
               where, type);
}

}  // namespace

Tokenizer Tokenizer::FromJson(std::string_view text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw IoError(fmt::format("{}: not valid JSON: {}", where, e.what()));
  }
  auto t = std::make_shared<Impl>();
  t->where = where;
  ReadNormalizer(j.value("normalizer", json()), *t);
  ReadPreTokenizer(j.value("pre_tokenizer", json()), *t);
  ReadModel(Need(j, "model", where), *t);
  ReadAddedTokens(j.value("added_tokens", json::array()), *t);
  ReadDecoder(j.value("decoder", json()), where);
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::FromFile(const std::string& file_or_dir) {
  // A Hugging Face model directory holds its tokenizer.json.
  const std::string path =
      std::filesystem::is_directory(file_or_dir) ? file_or_dir + "/tokenizer.json" : file_or_dir;
  std::ifstream in(path, std::ios::binary);
  SSHSDP_CHECK(in.good(), IoError, "--tokenizer {}: cannot read it", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return FromJson(ss.str(), path);
}

// BPE on one piece's symbols, in place: the candidate merges in a heap by (rank, position); a
// candidate applies while its left symbol is still there and the pair it now forms still
// merges into the candidate's token (tokenizers' word.rs, whose check this is).
void Tokenizer::Impl::Merge(std::vector<int32_t>& sym) const {
  const int n = static_cast<int>(sym.size());
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) next[i] = i + 1 < n ? i + 1 : -1, prev[i] = i - 1;
  struct Cand {
    int32_t rank;
    int pos;
    int32_t id;  // the token it makes
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    const auto it = merges.find(PairKey(sym[i], sym[next[i]]));
    if (it != merges.end()) heap.push({it->second.first, i, it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<char> gone(n, 0);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int j = next[c.pos];
    if (gone[c.pos] || j < 0) continue;
    const auto now = merges.find(PairKey(sym[c.pos], sym[j]));
    if (now == merges.end() || now->second.second != c.id) continue;
    sym[c.pos] = c.id;
    gone[j] = 1;
    next[c.pos] = next[j];
    if (next[j] >= 0) prev[next[j]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  int w = 0;
  for (int i = 0; i < n; ++i)
    if (!gone[i]) sym[w++] = sym[i];
  sym.resize(w);
}

void Tokenizer::Impl::EncodePiece(std::string_view piece, Cache& cache,
                                  std::vector<int32_t>* out) const {
  const std::string chars = ToByteLevel(piece);
  if (ignore_merges) {
    const auto it = vocab.find(chars);
    if (it != vocab.end()) return out->push_back(it->second);
  }
  const bool cacheable = piece.size() < 256;
  if (cacheable) {
    const auto hit = cache.find(chars);
    if (hit != cache.end()) {
      out->insert(out->end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::vector<int32_t> sym;
  for (char c : piece) sym.push_back(byte_id[static_cast<uint8_t>(c)]);
  Merge(sym);
  out->insert(out->end(), sym.begin(), sym.end());
  if (cacheable) cache.emplace(chars, std::move(sym));
}

// A stretch between added tokens: normalize, pre-tokenize, BPE each piece.
void Tokenizer::Impl::EncodeStretch(std::string_view text, Cache& cache,
                                    std::vector<int32_t>* out) const {
  std::string norm;
  if (nfc) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(
        icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
    if (!n->isNormalized(u, status)) {
      n->normalize(u, status).toUTF8String(norm);
      text = norm;
    }
    SSHSDP_CHECK(U_SUCCESS(status), IoError, "NFC normalization failed: {}", u_errorName(status));
  }
  std::string prefixed;
  if (add_prefix_space && !text.empty() && text[0] != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  std::vector<std::string_view> pieces;
  if (regex) {
    regex->Split(text, &pieces);
  } else {
    pieces.push_back(text);
  }
  for (std::string_view p : pieces) EncodePiece(p, cache, out);
}

std::vector<int32_t> Tokenizer::Impl::Encode(std::string_view text, Cache& cache) const {
  const size_t bad = FirstInvalidUtf8(text);
  SSHSDP_CHECK(bad == std::string_view::npos, IoError, "invalid UTF-8 at byte {}", bad);
  std::vector<int32_t> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* hit = nullptr;
    if (added_first[static_cast<uint8_t>(text[i])]) {
      for (const AddedToken& a : added)
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > start) EncodeStretch(text.substr(start, i - start), cache, &out);
    out.push_back(hit->id);
    i += hit->content.size();
    start = i;
  }
  if (start < text.size()) EncodeStretch(text.substr(start), cache, &out);
  return out;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text) const {
  Impl::Cache cache;
  return impl_->Encode(text, cache);
}

std::vector<std::vector<int32_t>> Tokenizer::EncodeBatch(const std::vector<std::string>& docs,
                                                         int threads) const {
  std::vector<std::vector<int32_t>> out(docs.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    Impl::Cache cache;
    for (size_t i; !failed && (i = next++) < docs.size();) {
      try {
        out[i] = impl_->Encode(docs[i], cache);
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(docs.size())));
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  if (!skip_special) return Utf8Lossy(DecodeBytes(ids));
  std::vector<int32_t> kept;
  for (int32_t id : ids)
    if (id < 0 || static_cast<size_t>(id) >= impl_->special.size() || !impl_->special[id])
      kept.push_back(id);
  return Utf8Lossy(DecodeBytes(kept));
}

std::string Tokenizer::DecodeBytes(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    SSHSDP_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->id_to_token.size(), ConfigError,
                 "token id {} is outside the vocabulary of {} tokens", id,
                 impl_->id_to_token.size());
    AppendFromByteLevel(impl_->id_to_token[id], &bytes);
  }
  return bytes;
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  const auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> Tokenizer::EndOfText() const {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>"})
    if (auto id = TokenId(name)) return id;
  for (const AddedToken& a : impl_->added)
    if (a.special) return a.id;
  return std::nullopt;
}

std::string Tokenizer::Describe() const {
  return fmt::format("byte-level BPE, {} tokens, {}{}, {}", vocab_size(),
                     impl_->pattern_name.empty() ? "no regex" : impl_->pattern_name,
                     impl_->ignore_merges ? ", ignore_merges" : "",
                     impl_->nfc ? "NFC" : "no normalizer");
}

}  // namespace sshsdp
