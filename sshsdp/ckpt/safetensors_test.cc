// safetensors round trip, metadata, atomic write, and errors naming file and problem: each
// malformed file below (the cases a hostile or broken writer produces) must be refused with
// an IoError naming the problem, never read as shifted or partial weights.
#include "sshsdp/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>

#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

std::string TmpPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("sshsdp_st_" + name)).string();
}

TEST(Safetensors, RoundTrip) {
  std::map<std::string, SafeTensor> t;
  t["a.w"] = {{2, 3}, {1, 2, 3, 4, 5, 6}};
  t["b"] = {{1}, {-0.5f}};
  const std::string p = TmpPath("rt.safetensors");
  WriteSafetensors(p, t, {{"model", "gpt"}});
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
  std::map<std::string, std::string> meta;
  auto back = ReadSafetensors(p, &meta);
  EXPECT_EQ(meta["model"], "gpt");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back["a.w"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(back["a.w"].data, t["a.w"].data);
  EXPECT_EQ(back["b"].data[0], -0.5f);
  std::filesystem::remove(p);
}

// A write that fails part-way (here the file-size limit, as a full disk would) throws naming
// the file and leaves neither the target nor a half-written PATH.tmp behind.
TEST(Safetensors, FailedWriteLeavesNoFile) {
  std::map<std::string, SafeTensor> t;
  t["w"] = {{4096}, std::vector<float>(4096, 1.0f)};  // 16 KiB of data
  const std::string p = TmpPath("full.safetensors");
  std::filesystem::remove(p);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  try {
    WriteSafetensors(p, t, {});
  } catch (const IoError& e) {
    threw = std::string(e.what()).find(p + ".tmp: write failed") != std::string::npos;
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_FALSE(std::filesystem::exists(p));
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

TEST(Safetensors, ErrorsNameFileAndProblem) {
  const std::string missing = TmpPath("nope.safetensors");
  try {
    ReadSafetensors(missing);
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos);
  }
  std::map<std::string, SafeTensor> t;
  t["x"] = {{4}, {1, 2, 3, 4}};
  const std::string p = TmpPath("trunc.safetensors");
  WriteSafetensors(p, t);
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 4);
  try {
    ReadSafetensors(p);
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("outside"), std::string::npos) << e.what();
  }
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    uint64_t n = 5;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write("{oops", 5);
  }
  EXPECT_THROW(ReadSafetensors(p), IoError);
  std::filesystem::remove(p);
  EXPECT_THROW(WriteSafetensors(p, {{"bad", {{3}, {1, 2}}}}), IoError);
}

// Writes an 8-byte length, `header` padded with spaces to `header_len` (or its own length),
// and `data` bytes.
void WriteRaw(const std::string& p, const std::string& header, size_t data_bytes,
              int64_t length_delta = 0) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  std::string h = header;
  while (h.size() % 8) h.push_back(' ');
  const uint64_t n = static_cast<uint64_t>(static_cast<int64_t>(h.size()) + length_delta);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  const std::string data(data_bytes, '\0');
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

void ExpectRefused(const std::string& p, const std::string& needle) {
  try {
    ReadSafetensors(p);
    ADD_FAILURE() << "accepted a file that should fail with: " << needle;
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Safetensors, MalformedHeadersAreRefused) {
  const std::string p = TmpPath("bad.safetensors");
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string b = R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]})";
  WriteRaw(p, "{" + a + "," + b + "}", 12);
  EXPECT_EQ(ReadSafetensors(p).size(), 2u);  // the well-formed baseline reads

  WriteRaw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8);
  ExpectRefused(p, "data_offsets must be [begin, end]");
  WriteRaw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8);
  ExpectRefused(p, "data_offsets must be [begin, end]");
  WriteRaw(p, "{" + a + "," + R"("a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]})" + "}", 12);
  ExpectRefused(p, "tensor 'a' appears twice");
  WriteRaw(p, "{" + a + "," + R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})" + "}", 8);
  ExpectRefused(p, "overlapping");
  WriteRaw(p, "{" + a + "," + R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]})" + "}",
           16);
  ExpectRefused(p, "a gap between");
  WriteRaw(p, "{" + a + "," + b + "}", 16);  // 4 bytes no tensor claims
  ExpectRefused(p, "cover 12 of the 16 data bytes");
  WriteRaw(p, "{" + a + "," + b + "}", 12, -1);  // header length one byte short
  ExpectRefused(p, "cover 12 of the 13 data bytes");
  WriteRaw(p, R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", 8);
  ExpectRefused(p, "dtype must be a string");
  WriteRaw(p, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8);
  ExpectRefused(p, "shape must hold integers >= 0");
  WriteRaw(p, R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8);
  ExpectRefused(p, "shape must be an array");
  WriteRaw(p, R"({"a":[1,2]})", 8);
  ExpectRefused(p, "must be an object with dtype, shape and data_offsets");
  WriteRaw(p, R"({"__metadata__":{"k":3}})", 0);
  ExpectRefused(p, "__metadata__ 'k' must be a string");
  WriteRaw(p, "[1,2]", 0);
  ExpectRefused(p, "header must be a JSON object");
  WriteRaw(p, "{}", 0, int64_t{1} << 40);
  ExpectRefused(p, "exceeds the file");
  std::filesystem::remove(p);
}

// Hugging Face checkpoints in fp16 (safetensors' F16) read exactly: normal, subnormal, zero,
// infinite and NaN halves; and any element range of a tensor without the rest.
TEST(Safetensors, F16ReadsExactlyAndInRanges) {
  const std::string p = ::testing::TempDir() + "/f16.safetensors";
  const uint16_t half[] = {0x3c00, 0xc000, 0x0001, 0x8000, 0x7c00, 0x7bff, 0x7e00, 0x3555};
  const float want[] = {1.0f, -2.0f, 5.9604645e-08f, -0.0f, INFINITY, 65504.0f, NAN, 0.33325195f};
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    std::string h = R"({"h":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]}})";
    while (h.size() % 8) h.push_back(' ');
    const uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    f.write(reinterpret_cast<const char*>(half), sizeof(half));
  }
  const auto t = ReadSafetensors(p).at("h").data;
  for (int i = 0; i < 8; ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(t[i])) << i;
    } else {
      EXPECT_EQ(t[i], want[i]) << i;
      EXPECT_EQ(std::signbit(t[i]), std::signbit(want[i])) << i;
    }
  }
  const std::vector<SafetensorsEntry> index = ReadSafetensorsIndex(p);
  ASSERT_EQ(index.size(), 1u);
  InFile f(p);
  float part[3];
  ReadSafetensorsElements(f, index[0], 5, 3, part);
  EXPECT_EQ(part[0], 65504.0f);
  EXPECT_TRUE(std::isnan(part[1]));
  EXPECT_EQ(part[2], want[7]);
  EXPECT_THROW(ReadSafetensorsElements(f, index[0], 6, 3, part), IoError);
}

TEST(Safetensors, NonRegularFilesAreRefused) {
  const std::string dir = TmpPath("a_dir");
  std::filesystem::create_directories(dir);
  ExpectRefused(dir, "not a regular file (a directory)");
  const std::string fifo = TmpPath("a_fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  ExpectRefused(fifo, "not a regular file (a FIFO)");  // must not block opening it
  std::filesystem::remove(fifo);
  std::filesystem::remove(dir);
  ExpectRefused(TmpPath("nope.safetensors"), "No such file or directory");
}

}  // namespace
}  // namespace sshsdp
