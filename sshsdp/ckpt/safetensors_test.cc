// safetensors round trip, metadata, atomic write, and errors naming file and problem.
#include "sshsdp/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

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

}  // namespace
}  // namespace sshsdp
