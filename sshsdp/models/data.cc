// Synthetic Markov token source and token-file readers (see data.h).
#include "sshsdp/models/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "sshsdp/base/error.h"
#include "sshsdp/base/posix_file.h"

static_assert(std::endian::native == std::endian::little,
              "token files (nanoGPT .bin, llm.c) are little-endian integers read in place");

namespace sshsdp {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Counter-based stream: the k-th draw depends only on (key, k).
struct Stream {
  uint64_t key, counter = 0;
  uint64_t Next() { return Mix(key ^ Mix(counter++)); }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

Stream SampleStream(uint64_t seed, int64_t index) {
  return Stream{Mix(seed * 0x2545F4914F6CDD1Dull + 0x5851F42D4C957F2Dull) ^
                Mix(static_cast<uint64_t>(index))};
}

}  // namespace

void TokenSource::Batch(int64_t first_index, int B, int T, int32_t* tokens,
                        int32_t* targets) const {
  for (int b = 0; b < B; ++b) {
    Sample(first_index + b, T, tokens + static_cast<int64_t>(b) * T,
           targets + static_cast<int64_t>(b) * T);
  }
}

int64_t SampleIndex(int64_t step, int micro, int n_micro, int rank, int n_ranks, int b, int B) {
  SSHSDP_CHECK(
      step >= 0 && micro >= 0 && micro < n_micro && rank >= 0 && rank < n_ranks && b >= 0 && b < B,
      ConfigError, "SampleIndex: step {} micro {}/{} rank {}/{} sample {}/{} invalid", step, micro,
      n_micro, rank, n_ranks, b, B);
  const int64_t per_step = static_cast<int64_t>(n_micro) * n_ranks * B;
  return step * per_step + (static_cast<int64_t>(micro) * n_ranks + rank) * B + b;
}

// ---- SyntheticTokens ----

SyntheticTokens::SyntheticTokens(int vocab, uint64_t seed, int branching, int max_seq_len)
    : vocab_(vocab), branching_(branching), max_seq_len_(max_seq_len), seed_(seed) {
  SSHSDP_CHECK(vocab >= 2 && branching >= 1 && max_seq_len >= 1, ConfigError,
               "SyntheticTokens: need vocab >= 2, branching >= 1, max_seq_len >= 1 (got {}, {}, "
               "{})",
               vocab, branching, max_seq_len);
  branching_ = std::min(branching_, vocab_);
  Stream rng{Mix(seed ^ 0xA0761D6478BD642Full)};

  // A random Hamiltonian cycle makes the chain irreducible (unique stationary distribution).
  std::vector<int> order(vocab_);
  std::iota(order.begin(), order.end(), 0);
  for (int i = vocab_ - 1; i > 0; --i) std::swap(order[i], order[rng.Next() % (i + 1)]);
  std::vector<int> cycle_next(vocab_);
  for (int i = 0; i < vocab_; ++i) cycle_next[order[i]] = order[(i + 1) % vocab_];

  next_.resize(vocab_);
  prob_.resize(vocab_);
  cdf_.resize(vocab_);
  for (int s = 0; s < vocab_; ++s) {
    std::vector<int>& nx = next_[s];
    nx.push_back(cycle_next[s]);
    while (static_cast<int>(nx.size()) < branching_) {
      int c = static_cast<int>(rng.Next() % vocab_);
      if (std::find(nx.begin(), nx.end(), c) == nx.end()) nx.push_back(c);
    }
    // Dirichlet(1, ..., 1) weights: normalised Exponential(1) draws.
    std::vector<double>& p = prob_[s];
    for (size_t j = 0; j < nx.size(); ++j) p.push_back(-std::log(1.0 - rng.Uniform()) + 1e-3);
    double sum = std::accumulate(p.begin(), p.end(), 0.0);
    double acc = 0.0;
    for (double& v : p) {
      v /= sum;
      acc += v;
      cdf_[s].push_back(acc);
    }
    cdf_[s].back() = 1.0;
  }

  // Stationary distribution by power iteration on the lazy chain (P + I)/2, which has the
  // same stationary distribution and is aperiodic, so the iteration converges.
  std::vector<double> pi(vocab_, 1.0 / vocab_), nxt(vocab_);
  for (int it = 0;; ++it) {
    SSHSDP_CHECK(it < 1000000, ConfigError,
                 "SyntheticTokens: stationary distribution of the "
                 "vocab {} chain did not converge",
                 vocab_);
    for (int s = 0; s < vocab_; ++s) nxt[s] = 0.5 * pi[s];
    for (int s = 0; s < vocab_; ++s) {
      for (size_t j = 0; j < next_[s].size(); ++j) nxt[next_[s][j]] += 0.5 * pi[s] * prob_[s][j];
    }
    double total = std::accumulate(nxt.begin(), nxt.end(), 0.0), diff = 0.0;
    for (int s = 0; s < vocab_; ++s) {
      nxt[s] /= total;
      diff += std::abs(nxt[s] - pi[s]);
    }
    pi.swap(nxt);
    if (diff < 1e-15) break;
  }
  stationary_ = pi;
  double acc = 0.0;
  for (double v : pi) stationary_cdf_.push_back(acc += v);
  stationary_cdf_.back() = 1.0;

  entropy_rate_ = 0.0;
  for (int s = 0; s < vocab_; ++s) {
    double h = 0.0;
    for (double p : prob_[s]) h -= p * std::log(p);
    entropy_rate_ += stationary_[s] * h;
  }
}

double SyntheticTokens::Transition(int i, int j) const {
  SSHSDP_CHECK(i >= 0 && i < vocab_ && j >= 0 && j < vocab_, ConfigError,
               "SyntheticTokens::Transition({}, {}) outside vocab {}", i, j, vocab_);
  for (size_t k = 0; k < next_[i].size(); ++k) {
    if (next_[i][k] == j) return prob_[i][k];
  }
  return 0.0;
}

int SyntheticTokens::Draw(const std::vector<int>& next, const std::vector<double>& cdf,
                          uint64_t bits) const {
  double u = static_cast<double>(bits >> 11) * 0x1.0p-53;
  size_t k = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
  k = std::min(k, cdf.size() - 1);
  return next.empty() ? static_cast<int>(k) : next[k];
}

void SyntheticTokens::Sample(int64_t index, int T, int32_t* tokens, int32_t* targets) const {
  SSHSDP_CHECK(index >= 0 && T >= 1 && T <= max_seq_len_, ConfigError,
               "SyntheticTokens::Sample: index {} T {} invalid (max_seq_len {})", index, T,
               max_seq_len_);
  Stream rng = SampleStream(seed_, index);
  static const std::vector<int> kIdentity;  // empty: index into the stationary cdf directly
  int cur = Draw(kIdentity, stationary_cdf_, rng.Next());
  for (int t = 0; t < T; ++t) {
    tokens[t] = cur;
    cur = Draw(next_[cur], cdf_[cur], rng.Next());
    targets[t] = cur;
  }
}

// ---- TokenFile ----

TokenFile::TokenFile(const std::string& path, int vocab, int seq_len, uint64_t seed)
    : path_(path), vocab_(vocab), seq_len_(seq_len), seed_(seed) {
  SSHSDP_CHECK(vocab >= 0 && vocab <= kMaxTokenFileVocab && seq_len > 0, ConfigError,
               "TokenFile '{}': vocab {} (1..{}; 0: from the data) or seq_len {} invalid", path,
               vocab, kMaxTokenFileVocab, seq_len);
  struct stat st {};
  SSHSDP_CHECK(::stat(path.c_str(), &st) == 0, IoError, "token file '{}': cannot open: {}", path,
               std::strerror(errno));
  SSHSDP_CHECK(S_ISREG(st.st_mode), IoError,
               "token file '{}': not a regular file ({}); --data takes a token file", path,
               S_ISDIR(st.st_mode)    ? "a directory"
               : S_ISFIFO(st.st_mode) ? "a FIFO"
                                      : "a device or socket");
  const int64_t size = static_cast<int64_t>(st.st_size);
  SSHSDP_CHECK(size % 2 == 0, IoError,
               "token file '{}': odd byte size {} (uint16 tokens need an even size)", path, size);
  SSHSDP_CHECK(size > 0, IoError, "token file '{}': empty", path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SSHSDP_CHECK(fd >= 0, IoError, "token file '{}': cannot open: {}", path, std::strerror(errno));
  void* map = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  SSHSDP_CHECK(map != MAP_FAILED, IoError, "token file '{}': cannot map {} bytes: {}", path, size,
               std::strerror(map_errno));
  map_ = map;
  map_bytes_ = static_cast<size_t>(size);
  try {
    Validate();
  } catch (...) {
    ::munmap(map_, map_bytes_);  // the destructor does not run for a throwing constructor
    throw;
  }
}

void TokenFile::Validate() {
  const std::string& path = path_;
  const int64_t size = static_cast<int64_t>(map_bytes_);
  const int seq_len = seq_len_;
  const char* bytes = static_cast<const char*>(map_);

  int64_t data_offset = 0;
  int64_t count = size / 2;
  const int64_t header_bytes = kLlmcHeaderInts * 4;
  int32_t header[3] = {0, 0, 0};
  if (size >= 12) std::memcpy(header, bytes, sizeof(header));
  for (const int32_t magic : {kLlmcMagic, kLlmcMagic32})
    SSHSDP_CHECK(header[0] != static_cast<int32_t>(__builtin_bswap32(static_cast<uint32_t>(magic))),
                 IoError,
                 "token file '{}': an llm.c header written big-endian (magic {} byte-swapped); "
                 "llm.c files are little-endian: re-create it on a little-endian machine",
                 path, magic);
  // uint32 tokens: llm.c's Llama 3 header (20240801, version 7), or version 2 of the GPT-2
  // magic (what other tools write for vocabularies beyond 65,536).
  const bool wide =
      header[0] == kLlmcMagic32 || (header[0] == kLlmcMagic && header[1] == kLlmcVersionWide);
  if (header[0] == kLlmcMagic || wide) {
    const int32_t version = header[0] == kLlmcMagic32 ? kLlmcVersion32
                            : wide                    ? kLlmcVersionWide
                                                      : kLlmcVersion;
    SSHSDP_CHECK(size >= header_bytes, IoError,
                 "token file '{}': llm.c magic {} but only {} bytes (header is {} bytes)", path,
                 header[0], size, header_bytes);
    SSHSDP_CHECK(header[1] == version, IoError,
                 "token file '{}': llm.c version {} unsupported (expected {} with magic {}{})",
                 path, header[1], version, header[0],
                 header[0] == kLlmcMagic ? ", or 2 for uint32 tokens" : "");
    width_ = wide ? 4 : 2;
    SSHSDP_CHECK((size - header_bytes) % width_ == 0, IoError,
                 "token file '{}': {} bytes after the header are not whole uint32 tokens", path,
                 size - header_bytes);
    const int64_t payload = (size - header_bytes) / width_;
    SSHSDP_CHECK(header[2] >= 0 && header[2] == payload, IoError,
                 "token file '{}': header count mismatch: header says {} tokens, file holds {}",
                 path, header[2], payload);
    llmc_ = true;
    data_offset = header_bytes;
    count = payload;
  } else {
    // An llm.c header whose magic is damaged (version and token count still match) would
    // otherwise read as tokens and fail as "outside the vocabulary".
    SSHSDP_CHECK(!(size >= header_bytes && header[1] == kLlmcVersion &&
                   header[2] == (size - header_bytes) / 2),
                 IoError,
                 "token file '{}': looks like an llm.c file (version {}, {} tokens) whose magic "
                 "is damaged: {} at byte 0 instead of {}; re-create the file",
                 path, header[1], header[2], header[0], kLlmcMagic);
  }
  SSHSDP_CHECK(count >= static_cast<int64_t>(seq_len) + 1, IoError,
               "token file '{}': {} tokens, fewer than seq_len + 1 = {}", path, count,
               static_cast<int64_t>(seq_len) + 1);
  tokens_ = bytes + data_offset;
  count_ = count;
  int64_t max_token = 0;
  if (width_ == 2) {
    const uint16_t* t = static_cast<const uint16_t*>(tokens_);
    uint16_t m = 0;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < count; ++i) m = std::max(m, t[i]);
    max_token = m;
  } else {
    const uint32_t* t = static_cast<const uint32_t*>(tokens_);
    uint32_t m = 0;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < count; ++i) m = std::max(m, t[i]);
    max_token = m;
  }
  SSHSDP_CHECK(max_token < kMaxTokenFileVocab, IoError,
               "token file '{}': token {} is beyond the largest vocabulary sshsdp trains ({})",
               path, max_token, kMaxTokenFileVocab);
  max_token_ = static_cast<int>(max_token);
  if (vocab_ == 0) vocab_ = InferVocab(max_token_);
  if (max_token_ < vocab_) return;
  for (int64_t i = 0; i < count; ++i) {
    SSHSDP_CHECK(Token(i) < vocab_, IoError,
                 "token file '{}': token {} at position {} is outside the vocabulary of {} (the "
                 "file's largest token is {}; pass --vocab-size for its tokenizer)",
                 path, Token(i), i, vocab_, max_token_);
  }
}

int TokenFile::InferVocab(int max_token) {
  if (max_token < 256) return 256;                // bytes
  if (max_token < kGpt2Vocab) return kGpt2Vocab;  // GPT-2's BPE (nanoGPT, llm.c files)
  return max_token + 1;
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

void TokenFile::Sample(int64_t index, int T, int32_t* tokens, int32_t* targets) const {
  SSHSDP_CHECK(index >= 0 && T >= 1 && T <= seq_len_, ConfigError,
               "TokenFile '{}': sample index {} T {} invalid (seq_len {})", path_, index, T,
               seq_len_);
  const uint64_t windows = static_cast<uint64_t>(count_) - static_cast<uint64_t>(T);
  Stream rng = SampleStream(seed_, index);
  const int64_t pos = static_cast<int64_t>(rng.Next() % windows);
  for (int t = 0; t < T; ++t) {
    tokens[t] = static_cast<int32_t>(Token(pos + t));
    targets[t] = static_cast<int32_t>(Token(pos + t + 1));
  }
}

namespace {

// n tokens of `width` bytes, after an llm.c header (magic, version, count) unless magic is 0.
void WriteTokens(const std::string& path, const void* tokens, size_t n, int width, int32_t magic,
                 int32_t version) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  SSHSDP_CHECK(out.good(), IoError, "token file '{}': cannot create ({})", path,
               std::strerror(errno));
  if (magic != 0) {
    SSHSDP_CHECK(n <= 0x7FFFFFFFu, IoError,
                 "token file '{}': {} tokens do not fit llm.c's int32 count", path, n);
    std::vector<int32_t> header(kLlmcHeaderInts, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = static_cast<int32_t>(n);
    out.write(reinterpret_cast<const char*>(header.data()), kLlmcHeaderInts * 4);
  }
  out.write(static_cast<const char*>(tokens), static_cast<std::streamsize>(n * width));
  out.close();
  SSHSDP_CHECK(out.good(), IoError, "token file '{}': write failed", path);
}

}  // namespace

void WriteTokenFile(const std::string& path, const std::vector<uint16_t>& tokens, bool llmc) {
  WriteTokens(path, tokens.data(), tokens.size(), 2, llmc ? kLlmcMagic : 0, kLlmcVersion);
}

void WriteTokenFile(const std::string& path, const std::vector<uint32_t>& tokens) {
  WriteTokens(path, tokens.data(), tokens.size(), 4, kLlmcMagic32, kLlmcVersion32);
}

TokenFileWriter::TokenFileWriter(std::string path, bool wide)
    : path_(std::move(path)), tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())), wide_(wide) {
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  SSHSDP_CHECK(out_.good(), IoError, "token file '{}': cannot create {} ({})", path_, tmp_,
               std::strerror(errno));
  const std::vector<int32_t> header(kLlmcHeaderInts, 0);  // the count is written by Commit
  out_.write(reinterpret_cast<const char*>(header.data()), kLlmcHeaderInts * 4);
}

TokenFileWriter::~TokenFileWriter() {
  if (committed_) return;
  out_.close();
  std::remove(tmp_.c_str());
}

void TokenFileWriter::Append(const uint32_t* tokens, size_t n) {
  SSHSDP_CHECK(count_ + static_cast<int64_t>(n) <= 0x7FFFFFFF, IoError,
               "token file '{}': more than 2,147,483,647 tokens do not fit llm.c's int32 count; "
               "split the input",
               path_);
  if (wide_) {
    out_.write(reinterpret_cast<const char*>(tokens), static_cast<std::streamsize>(n * 4));
  } else {
    SSHSDP_CHECK(std::all_of(tokens, tokens + n, [](uint32_t t) { return t <= 0xFFFF; }), IoError,
                 "token file '{}': a token above 65,535 in a uint16 file (write it wide)", path_);
    narrow_.assign(tokens, tokens + n);
    out_.write(reinterpret_cast<const char*>(narrow_.data()), static_cast<std::streamsize>(n * 2));
  }
  count_ += static_cast<int64_t>(n);
  SSHSDP_CHECK(out_.good(), IoError, "token file '{}': write failed (disk full?): {}", tmp_,
               std::strerror(errno));
}

void TokenFileWriter::Commit() {
  const int32_t header[3] = {wide_ ? kLlmcMagic32 : kLlmcMagic,
                             wide_ ? kLlmcVersion32 : kLlmcVersion, static_cast<int32_t>(count_)};
  out_.seekp(0);
  out_.write(reinterpret_cast<const char*>(header), sizeof(header));
  out_.close();
  SSHSDP_CHECK(out_.good(), IoError, "token file '{}': write failed (disk full?): {}", tmp_,
               std::strerror(errno));
  FsyncFile(tmp_);  // durable before it replaces anything: a power loss leaves old or new
  RenameInto(tmp_, path_);
  committed_ = true;
}

}  // namespace sshsdp
