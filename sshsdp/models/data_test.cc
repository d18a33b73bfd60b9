// Tests of the built-in data: the synthetic chain's optimal loss against an empirical
// estimate, its stationary distribution, determinism of samples by global index, and the
// token-file reader on good files of both formats and on every malformed case (each must
// throw IoError naming the file).
#include "sshsdp/models/data.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

TEST(SyntheticTokens, OptimalLossMatchesEmpiricalCrossEntropy) {
  for (int vocab : {32, 256}) {
    SyntheticTokens src(vocab, 17);
    const int T = 64, n = 4000;
    std::vector<int32_t> tok(T), tgt(T);
    double nll = 0.0;
    for (int i = 0; i < n; ++i) {
      src.Sample(i, T, tok.data(), tgt.data());
      for (int t = 0; t < T; ++t) {
        double p = src.Transition(tok[t], tgt[t]);
        ASSERT_GT(p, 0.0);
        nll -= std::log(p);
      }
    }
    nll /= static_cast<double>(n) * T;
    // 256k tokens: standard error of the mean is well under 0.01 nats.
    EXPECT_NEAR(nll, src.OptimalLoss(), 0.02) << "vocab " << vocab;
    EXPECT_GT(src.OptimalLoss(), 0.1);
    EXPECT_LT(src.OptimalLoss(), std::log(4.0));  // 4 successors per state
  }
}

TEST(SyntheticTokens, StationaryDistributionIsStationary) {
  SyntheticTokens src(64, 3);
  const auto& pi = src.Stationary();
  double total = 0;
  for (int j = 0; j < 64; ++j) {
    double in = 0;
    for (int i = 0; i < 64; ++i) in += pi[i] * src.Transition(i, j);
    EXPECT_NEAR(in, pi[j], 1e-12);
    total += pi[j];
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  for (int i = 0; i < 64; ++i) {
    double row = 0;
    for (int j = 0; j < 64; ++j) row += src.Transition(i, j);
    EXPECT_NEAR(row, 1.0, 1e-12);
  }
}

TEST(SyntheticTokens, DeterministicByIndexAndSeed) {
  SyntheticTokens a(256, 5), b(256, 5), c(256, 6);
  const int T = 32;
  std::vector<int32_t> t1(T), g1(T), t2(T), g2(T);
  a.Sample(123, T, t1.data(), g1.data());
  b.Sample(123, T, t2.data(), g2.data());
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(g1, g2);
  for (int t = 0; t + 1 < T; ++t) EXPECT_EQ(g1[t], t1[t + 1]);
  a.Sample(124, T, t2.data(), g2.data());
  EXPECT_NE(t1, t2);
  c.Sample(123, T, t2.data(), g2.data());
  EXPECT_NE(t1, t2);
  // Shorter samples are prefixes of longer ones.
  std::vector<int32_t> t3(8), g3(8);
  a.Sample(123, 8, t3.data(), g3.data());
  EXPECT_TRUE(std::equal(t3.begin(), t3.end(), t1.begin()));
  // A batch is the run of consecutive samples.
  std::vector<int32_t> bt(3 * T), bg(3 * T);
  a.Batch(122, 3, T, bt.data(), bg.data());
  EXPECT_TRUE(std::equal(t1.begin(), t1.end(), bt.begin() + T));
  EXPECT_TRUE(std::equal(g1.begin(), g1.end(), bg.begin() + T));
}

TEST(SampleIndex, PartitionsEachStepExactly) {
  const int n_micro = 3, n_ranks = 4, B = 2;
  std::set<int64_t> seen;
  for (int m = 0; m < n_micro; ++m) {
    for (int r = 0; r < n_ranks; ++r) {
      for (int b = 0; b < B; ++b) seen.insert(SampleIndex(5, m, n_micro, r, n_ranks, b, B));
    }
  }
  EXPECT_EQ(seen.size(), 24u);
  EXPECT_EQ(*seen.begin(), 5 * 24);
  EXPECT_EQ(*seen.rbegin(), 6 * 24 - 1);
  EXPECT_THROW(SampleIndex(0, 3, 3, 0, 1, 0, 1), ConfigError);
}

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("sshsdp_data_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }
  void WriteBytes(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  }
  // Expects IoError whose message names the file and contains `what`.
  void ExpectIoError(const std::string& path, int vocab, int seq_len, const std::string& what) {
    try {
      TokenFile f(path, vocab, seq_len);
      ADD_FAILURE() << "no IoError for " << path;
    } catch (const IoError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  }
  std::filesystem::path dir_;
};

TEST_F(TokenFileTest, ReadsBothFormats) {
  std::vector<uint16_t> tokens(500);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 300);
  for (bool llmc : {false, true}) {
    std::string path = Path(llmc ? "llmc.bin" : "raw.bin");
    WriteTokenFile(path, tokens, llmc);
    TokenFile f(path, 300, 16, 9);
    EXPECT_EQ(f.num_tokens(), 500);
    EXPECT_EQ(f.is_llmc_format(), llmc);
    std::vector<int32_t> tok(16), tgt(16), tok2(16), tgt2(16);
    for (int64_t idx = 0; idx < 20; ++idx) {
      f.Sample(idx, 16, tok.data(), tgt.data());
      // The window is consecutive file tokens: find its start from the first token.
      int64_t start = -1;
      for (int64_t s = 0; s + 16 < 500; ++s) {
        bool match = true;
        for (int t = 0; t < 16 && match; ++t) {
          match = tok[t] == tokens[s + t] && tgt[t] == tokens[s + t + 1];
        }
        if (match) start = s;
      }
      EXPECT_GE(start, 0) << "sample " << idx;
      f.Sample(idx, 16, tok2.data(), tgt2.data());
      EXPECT_EQ(tok, tok2);
    }
  }
}

// llm.c's uint32 files (Llama 3's format: vocabularies beyond 65,536) read as the uint16 ones.
TEST_F(TokenFileTest, ReadsUint32Files) {
  std::vector<uint32_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 997 % 151936);
  const std::string path = Path("wide.bin");
  WriteTokenFile(path, tokens);
  TokenFile f(path, /*vocab=*/0, 8, 3);
  EXPECT_TRUE(f.is_llmc_format());
  EXPECT_EQ(f.token_bytes(), 4);
  EXPECT_EQ(f.num_tokens(), 300);
  EXPECT_EQ(f.vocab(), f.max_token() + 1);
  EXPECT_GT(f.max_token(), 65535);
  std::vector<int32_t> tok(8), tgt(8);
  f.Sample(5, 8, tok.data(), tgt.data());
  const auto at = std::find(tokens.begin(), tokens.end(), static_cast<uint32_t>(tok[0]));
  ASSERT_NE(at, tokens.end());
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(static_cast<uint32_t>(tok[t]), at[t]);
    EXPECT_EQ(static_cast<uint32_t>(tgt[t]), at[t + 1]);
  }
  ExpectIoError(path, /*vocab=*/65536, 8, "outside the vocabulary");
}

std::vector<char> FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The streaming writer writes, in pieces, the bytes WriteTokenFile writes at once; without
// Commit it leaves neither the file nor its temporary.
TEST_F(TokenFileTest, StreamingWriterEqualsTheWholeFileAndLeavesNothingUncommitted) {
  std::vector<uint32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 37 % 50000);
  for (bool wide : {false, true}) {
    const std::string whole = Path(wide ? "w32.bin" : "w16.bin");
    if (wide) {
      WriteTokenFile(whole, tokens);
    } else {
      WriteTokenFile(whole, std::vector<uint16_t>(tokens.begin(), tokens.end()), /*llmc=*/true);
    }
    const std::string streamed = Path(wide ? "s32.bin" : "s16.bin");
    {
      TokenFileWriter w(streamed, wide);
      for (size_t at = 0; at < tokens.size(); at += 333)
        w.Append(tokens.data() + at, std::min<size_t>(333, tokens.size() - at));
      EXPECT_EQ(w.count(), 1000);
      EXPECT_FALSE(std::filesystem::exists(streamed));  // only the temporary until Commit
      w.Commit();
    }
    EXPECT_EQ(FileBytes(streamed), FileBytes(whole)) << (wide ? "uint32" : "uint16");
  }
  {
    TokenFileWriter w(Path("abandoned.bin"), false);
    w.Append(tokens.data(), 10);
    const uint32_t big = 70000;  // does not fit a uint16 file: refused, not truncated
    EXPECT_THROW(w.Append(&big, 1), IoError);
  }
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find("abandoned"), std::string::npos) << e.path();
}

// uint32 tokens under the GPT-2 magic with version 2 read as under llm.c's Llama 3 header; a
// version neither 1 nor 2 is refused naming both.
TEST_F(TokenFileTest, ReadsVersionTwoOfTheGpt2Magic) {
  for (const int32_t version : {kLlmcVersionWide, 3}) {
    std::vector<int32_t> header(kLlmcHeaderInts, 0);
    header[0] = kLlmcMagic, header[1] = version, header[2] = 40;
    std::vector<char> bytes(reinterpret_cast<const char*>(header.data()),
                            reinterpret_cast<const char*>(header.data()) + kLlmcHeaderInts * 4);
    for (uint32_t t = 0; t < 40; ++t) {
      const uint32_t v = 70000 + t;
      bytes.insert(bytes.end(), reinterpret_cast<const char*>(&v),
                   reinterpret_cast<const char*>(&v) + 4);
    }
    const std::string path = Path("v2.bin");
    WriteBytes(path, bytes);
    if (version == 3) {
      ExpectIoError(path, 0, 8, "or 2 for uint32 tokens");
      continue;
    }
    TokenFile f(path, /*vocab=*/0, 8, 3);
    EXPECT_EQ(f.token_bytes(), 4);
    EXPECT_EQ(f.num_tokens(), 40);
    EXPECT_EQ(f.max_token(), 70039);
  }
}

// An llm.c file written big-endian is named as such (it would otherwise read as raw tokens).
TEST_F(TokenFileTest, BigEndianHeaderIsNamed) {
  std::vector<int32_t> header(kLlmcHeaderInts, 0);
  header[0] = static_cast<int32_t>(__builtin_bswap32(static_cast<uint32_t>(kLlmcMagic)));
  header[1] = static_cast<int32_t>(__builtin_bswap32(kLlmcVersion));
  header[2] = static_cast<int32_t>(__builtin_bswap32(100));
  std::vector<char> bytes(reinterpret_cast<const char*>(header.data()),
                          reinterpret_cast<const char*>(header.data()) + kLlmcHeaderInts * 4);
  bytes.resize(bytes.size() + 200, 0);
  const std::string path = Path("be.bin");
  WriteBytes(path, bytes);
  ExpectIoError(path, 0, 8, "written big-endian");
}

// vocab 0: the vocabulary comes from the data (bytes, GPT-2, else the largest token + 1);
// a token beyond an explicit vocabulary names the largest token and --vocab-size.
TEST_F(TokenFileTest, InfersTheVocabularyFromTheData) {
  EXPECT_EQ(TokenFile::InferVocab(0), 256);
  EXPECT_EQ(TokenFile::InferVocab(255), 256);
  EXPECT_EQ(TokenFile::InferVocab(256), kGpt2Vocab);
  EXPECT_EQ(TokenFile::InferVocab(50256), kGpt2Vocab);
  EXPECT_EQ(TokenFile::InferVocab(50257), 50258);
  for (const auto& [top, want] :
       {std::pair{200, 256}, std::pair{50000, kGpt2Vocab}, std::pair{60000, 60001}}) {
    std::vector<uint16_t> tokens(64, 7);
    tokens[40] = static_cast<uint16_t>(top);
    const std::string path = Path("infer.bin");
    WriteTokenFile(path, tokens, true);
    TokenFile f(path, /*vocab=*/0, 16);
    EXPECT_EQ(f.vocab(), want) << top;
    EXPECT_EQ(f.max_token(), top);
  }
  std::vector<uint16_t> tokens(64, 7);
  tokens[9] = 50000;
  WriteTokenFile(Path("gpt2.bin"), tokens, false);
  ExpectIoError(Path("gpt2.bin"), 256, 16, "largest token is 50000; pass --vocab-size");
}

TEST_F(TokenFileTest, MalformedFilesThrowIoErrorNamingTheFile) {
  std::vector<uint16_t> tokens(100, 3);
  // Odd byte size.
  std::string odd = Path("odd.bin");
  WriteBytes(odd, std::vector<char>(201, 0));
  ExpectIoError(odd, 256, 8, "odd byte size");
  // Header count mismatch (llm.c header says more tokens than the file holds).
  std::string mismatch = Path("mismatch.bin");
  WriteTokenFile(mismatch, tokens, true);
  {
    std::fstream f(mismatch, std::ios::binary | std::ios::in | std::ios::out);
    int32_t count = 101;
    f.seekp(8);
    f.write(reinterpret_cast<const char*>(&count), 4);
  }
  ExpectIoError(mismatch, 256, 8, "header count mismatch");
  // Unsupported version.
  std::string version = Path("version.bin");
  WriteTokenFile(version, tokens, true);
  {
    std::fstream f(version, std::ios::binary | std::ios::in | std::ios::out);
    int32_t v = 5;  // 1: uint16, 2: uint32
    f.seekp(4);
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  ExpectIoError(version, 256, 8, "version 5");
  // Truncated header.
  std::string shortheader = Path("short.bin");
  std::vector<char> bytes(40, 0);
  int32_t magic = kLlmcMagic;
  std::memcpy(bytes.data(), &magic, 4);
  WriteBytes(shortheader, bytes);
  ExpectIoError(shortheader, 256, 8, "header is 1024 bytes");
  // Token >= vocab, in both formats.
  std::vector<uint16_t> bad = tokens;
  bad[57] = 256;
  for (bool llmc : {false, true}) {
    std::string path = Path(llmc ? "badtok_llmc.bin" : "badtok_raw.bin");
    WriteTokenFile(path, bad, llmc);
    ExpectIoError(path, 256, 8, "token 256 at position 57");
  }
  // Fewer than seq_len + 1 tokens.
  std::string few = Path("few.bin");
  WriteTokenFile(few, std::vector<uint16_t>(8, 1), false);
  ExpectIoError(few, 256, 8, "fewer than seq_len + 1");
  WriteTokenFile(few, std::vector<uint16_t>(8, 1), true);
  ExpectIoError(few, 256, 8, "fewer than seq_len + 1");
  // Missing file: the OS's reason.
  ExpectIoError(Path("missing.bin"), 256, 8, "cannot open: No such file or directory");
  // A damaged llm.c magic is named as such, not reported as an out-of-vocabulary token.
  std::string magic_bad = Path("magic.bin");
  WriteTokenFile(magic_bad, tokens, true);
  {
    std::fstream f(magic_bad, std::ios::binary | std::ios::in | std::ios::out);
    int32_t m = kLlmcMagic + 1;
    f.write(reinterpret_cast<const char*>(&m), 4);
  }
  ExpectIoError(magic_bad, 256, 8, "looks like an llm.c file (version 1, 100 tokens) whose magic");
  // A directory and a FIFO (reading one would block) are refused by kind.
  ExpectIoError(dir_.string(), 256, 8, "not a regular file (a directory)");
  const std::string fifo = Path("fifo.bin");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  ExpectIoError(fifo, 256, 8, "not a regular file (a FIFO)");
  std::remove(fifo.c_str());
}

}  // namespace
}  // namespace sshsdp
