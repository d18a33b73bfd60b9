// Checkpoint pieces that need no ranks: CRC-32, manifest parsing and validation (each
// malformed manifest names the file and the problem), file verification, consolidation,
// listing / resolving (incomplete *.tmp saves ignored), tensor-mismatch messages and
// --init-weights refusal of another model's safetensors file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "sshsdp/base/crc32.h"
#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/safetensors.h"

namespace sshsdp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Fresh directories under the temp dir, removed after the last test.
std::vector<fs::path>& TmpDirs() {
  static std::vector<fs::path> dirs;
  return dirs;
}
class RemoveTmpDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& d : TmpDirs()) fs::remove_all(d);
  }
};
const auto* const kRemoveTmpDirs = ::testing::AddGlobalTestEnvironment(new RemoveTmpDirs);

std::string Tmp(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     fmt::format("sshsdp_ckpt_unit_{}_{}", static_cast<long>(::getpid()), name);
  fs::remove_all(p);
  fs::create_directories(p);
  TmpDirs().push_back(p);
  return p.string();
}

// Expects `f` to throw E whose message contains every needle.
template <typename E, typename F>
void ExpectError(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing " << needles.front();
  } catch (const E& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << "\nlacks: " << n;
  }
}

TEST(Crc32, StandardCheckValueAndIncremental) {
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32("", 0), 0u);
  std::string s(1000, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 37 + 11);
  const uint32_t whole = Crc32(s.data(), s.size());
  for (size_t cut : {1u, 7u, 8u, 9u, 500u, 999u})
    EXPECT_EQ(Crc32(s.data() + cut, s.size() - cut, Crc32(s.data(), cut)), whole) << cut;
  s[500] ^= 1;
  EXPECT_NE(Crc32(s.data(), s.size()), whole);
}

// A hand-made checkpoint: tensor "w" [2, 3] split over two files, fields main and m.
struct HandMade {
  std::string dir;
  json manifest;
  uint64_t data_start[2] = {0, 0};  // each file's first record byte (after its header)
  // Sealed (manifest_crc32), as SaveCheckpoint writes it: the malformed manifests below test
  // the validation of what a sealed manifest says.
  void Write() const {
    std::ofstream(fs::path(dir) / kManifestFile) << SealManifest(nlohmann::ordered_json(manifest));
  }
};

// `edit_header` may change each rank file's safetensors header before it is written.
HandMade MakeCheckpoint(const std::string& root, int64_t step,
                        const std::function<void(int file, json& header)>& edit_header = {}) {
  HandMade h;
  h.dir = (fs::path(root) / fmt::format("step_{:08d}", step)).string();
  fs::create_directories(h.dir);
  // file 0: main[0..4) then m[0..4); file 1: main[4..6) then m[4..6).
  const float main_v[6] = {1, 2, 3, 4, 5, 6}, m_v[6] = {-1, -2, -3, -4, -5, -6};
  json files = json::array();
  uint64_t* data_start = h.data_start;
  for (int f = 0; f < 2; ++f) {
    const int b = f == 0 ? 0 : 4, n = f == 0 ? 4 : 2;
    json header = {
        {"__metadata__",
         {{"format", "sshsdp-checkpoint-shard"},
          {"rank", std::to_string(f)},
          {"step", std::to_string(step)},
          {"shards", json::array({{"w", {2, 3}, 0, b, b + n, {{"main", 0}, {"m", 0}}}}).dump()}}},
        {"group0.main", {{"dtype", "F32"}, {"shape", {n}}, {"data_offsets", {0, 4 * n}}}},
        {"group0.m", {{"dtype", "F32"}, {"shape", {n}}, {"data_offsets", {4 * n, 8 * n}}}}};
    if (edit_header) edit_header(f, header);
    std::string text = header.dump();
    while ((text.size() + 8) % 8) text.push_back(' ');
    const uint64_t len = text.size();
    std::string bytes(reinterpret_cast<const char*>(&len), 8);
    bytes += text;
    data_start[f] = bytes.size();
    bytes.append(reinterpret_cast<const char*>(main_v + b), n * 4);
    bytes.append(reinterpret_cast<const char*>(m_v + b), n * 4);
    const std::string name = fmt::format("rank_{:05d}.safetensors", f);
    std::ofstream(fs::path(h.dir) / name, std::ios::binary) << bytes;
    files.push_back({{"name", name},
                     {"rank", f},
                     {"bytes", bytes.size()},
                     {"crc32", fmt::format("0x{:08x}", Crc32(bytes.data(), bytes.size()))}});
  }
  h.manifest = {{"format", "sshsdp-checkpoint"},
                {"format_version", kCheckpointFormatVersion},
                {"step", step},
                {"layout", {{"world", 2}, {"ranks_per_node", 2}, {"sw", 1}, {"sg", 1}, {"so", 2}}},
                {"runtime_dtype", "bf16"},
                {"state_dtype", "F32"},
                {"fields", {"main", "m"}},
                {"model", {{"type", "toy"}}},
                {"run", json::object()},
                {"scalars", {{"data_position", step}}},
                {"files", files},
                {"tensors",
                 {{{"name", "w"},
                   {"shape", {2, 3}},
                   {"group", 0},
                   {"shards",
                    {{{"file", 0},
                      {"range", {0, 4}},
                      {"offsets", {{"main", data_start[0]}, {"m", data_start[0] + 16}}}},
                     {{"file", 1},
                      {"range", {4, 6}},
                      {"offsets", {{"main", data_start[1]}, {"m", data_start[1] + 8}}}}}}}}}};
  h.Write();
  return h;
}

TEST(Manifest, ReadVerifyConsolidate) {
  const std::string root = Tmp("read");
  HandMade h = MakeCheckpoint(root, 7);
  Manifest m = ReadManifest(h.dir);
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.layout.ToString(), "W=2 nodes=1x2 sw=1 sg=1 so=2");
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.DataBytes(), 48u + h.data_start[0] + h.data_start[1]);
  VerifyCheckpointFiles(m);
  auto main = ReadConsolidated(m, "main");
  EXPECT_EQ(main.at("w").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(main.at("w").data, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ReadConsolidated(m, "m").at("w").data, (std::vector<float>{-1, -2, -3, -4, -5, -6}));
  ExpectError<ConfigError>([&] { ReadConsolidated(m, "v"); }, {"no field 'v'", "main, m"});
  EXPECT_NE(DescribeCheckpoint(m).find("rank_00001.safetensors"), std::string::npos);
}

TEST(Manifest, CorruptFilesAreNamed) {
  const std::string root = Tmp("corrupt");
  HandMade h = MakeCheckpoint(root, 1);
  const Manifest m = ReadManifest(h.dir);
  const std::string f1 = m.FilePath(1);
  {  // flipped byte: same size, different CRC
    std::fstream f(f1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('\x7f');
  }
  EXPECT_EQ(CheckFileSize(m, 1), "");
  EXPECT_NE(CheckFileContents(m, 1).find("checksum mismatch"), std::string::npos);
  ExpectError<IoError>([&] { VerifyCheckpointFiles(m); }, {f1, "checksum mismatch"});
  fs::resize_file(f1, 10);
  EXPECT_NE(CheckFileSize(m, 1).find(
                fmt::format("truncated: 10 bytes, the manifest says {}", h.data_start[1] + 16)),
            std::string::npos);
  fs::remove(f1);
  ExpectError<IoError>([&] { VerifyCheckpointFiles(m); }, {f1, "missing"});
}

TEST(Manifest, MalformedManifestsAreRefused) {
  const std::string root = Tmp("malformed");
  HandMade h = MakeCheckpoint(root, 1);
  const std::string mp = (fs::path(h.dir) / kManifestFile).string();
  auto expect = [&](json j, const std::string& needle) {
    HandMade bad = h;
    bad.manifest = std::move(j);
    bad.Write();
    ExpectError<IoError>([&] { ReadManifest(h.dir); }, {mp, needle});
  };
  json j = h.manifest;
  j["format_version"] = kCheckpointFormatVersion + 1;
  expect(j, fmt::format("format version {} is newer", kCheckpointFormatVersion + 1));
  j = h.manifest;
  j["tensors"][0]["shards"][1]["range"] = {5, 6};
  expect(j, "do not tile");
  j = h.manifest;
  j["tensors"][0]["shards"][1]["file"] = 9;
  expect(j, "file #9");
  j = h.manifest;
  const uint64_t bytes1 = h.data_start[1] + 16;
  j["tensors"][0]["shards"][1]["offsets"]["m"] = bytes1 - 4;
  expect(j, fmt::format("beyond the {} bytes", bytes1));
  // Numbers are what they must be: integers in range, never wrapped or truncated.
  j = h.manifest;
  j["tensors"][0]["shards"][1]["file"] = 4294967296;
  expect(j, "'file' = 4294967296 is out of range");
  j = h.manifest;
  j["layout"]["world"] = 4294967300;
  expect(j, "'world' = 4294967300 is out of range");
  j = h.manifest;
  j["tensors"][0]["shards"][1]["offsets"]["m"] = -1;
  expect(j, "'offsets' = -1 is out of range");
  j = h.manifest;
  j["tensors"][0]["shards"][1]["offsets"]["m"] = 18446744073709551615ull;
  expect(j, "beyond the");
  j = h.manifest;
  j["step"] = 1e308;
  expect(j, "'step' is malformed: 1e+308 is not an integer");
  j = h.manifest;
  j["files"][0]["name"] = "../etc/passwd";
  expect(j, "not a plain file name");
  j = h.manifest;
  j.erase("step");
  expect(j, "missing 'step'");
  j = h.manifest;
  j["format"] = "something-else";
  expect(j, "not an sshsdp checkpoint manifest");
  j = h.manifest;
  j["files"][1]["rank"] = 0;
  expect(j, "listed twice");
  j = h.manifest;
  j["files"][1]["rank"] = 5;
  expect(j, "outside the saved world of 2");
  j = h.manifest;
  j["layout"]["so"] = 3;
  expect(j, "the layout is not valid");
  j = h.manifest;
  j["step"] = -3;
  expect(j, "step -3 is negative");
  j = h.manifest;
  j["format"] = 5;  // a wrong JSON type is an error naming the manifest, never a crash
  expect(j, "not an sshsdp checkpoint manifest");
  j = h.manifest;
  j["layout"]["sw"] = "two";
  expect(j, "'sw' is malformed");
  j = h.manifest;
  j["tensors"][0]["shards"] = 7;
  expect(j, "'shards' missing");
  std::ofstream(mp) << "{\"format\": \"sshsdp-checkpoint\", ";
  ExpectError<IoError>([&] { ReadManifest(h.dir); }, {mp, "not valid JSON"});
}

// A manifest whose numbers are valid but disagree with a rank file's own header is refused at
// verification, naming the tensor and both sources.
TEST(Manifest, ManifestAndRankHeadersMustAgree) {
  const std::string root = Tmp("headers");
  HandMade h = MakeCheckpoint(root, 1);
  // Shard 0's moments read from the file's main record: inside the file, outside its record.
  json j = h.manifest;
  j["tensors"][0]["shards"][0]["offsets"]["m"] = h.data_start[0];
  HandMade moved = h;
  moved.manifest = j;
  moved.Write();
  ExpectError<IoError>([&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
                       {"rank_00000.safetensors", "tensor 'w' [0, 4) field 'm'",
                        "outside the file's record 'group0.m'"});
  h.Write();
  VerifyCheckpointFiles(ReadManifest(h.dir));
  // A rank file whose header names another rank (its CRC re-sealed in the manifest).
  const std::string f1 = (fs::path(h.dir) / "rank_00001.safetensors").string();
  std::string bytes;
  {
    std::ifstream in(f1, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t at = bytes.find("\"rank\":\"1\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 8] = '0';
  std::ofstream(f1, std::ios::binary | std::ios::trunc) << bytes;
  j = h.manifest;
  j["files"][1]["crc32"] = fmt::format("0x{:08x}", Crc32(bytes.data(), bytes.size()));
  moved.manifest = j;
  moved.Write();
  ExpectError<IoError>([&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
                       {f1, "its header says rank 0 step 1, the manifest lists it as rank 1"});
}

// Format version 4: the manifest's shards must be those each rank file's header lists.
TEST(Manifest, ManifestMustMatchTheShardsTheFilesList) {
  const std::string root = Tmp("listed");
  const auto listing = [](json l) {
    return [l](int file, json& header) {
      if (file == 1) header["__metadata__"]["shards"] = l.dump();
    };
  };
  // File 1's header says it holds 'w' [4, 6) main only: the manifest's m offset disagrees.
  HandMade h =
      MakeCheckpoint(root, 1, listing(json::array({{"w", {2, 3}, 0, 4, 6, {{"main", 0}}}})));
  ExpectError<IoError>([&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
                       {"rank_00001.safetensors", "tensor 'w' is group 0 [4, 6) m at byte",
                        "in the manifest but group 0 [4, 6) main at byte"});
  // It names another tensor.
  h = MakeCheckpoint(root, 2,
                     listing(json::array({{"u", {2, 3}, 0, 4, 6, {{"main", 0}, {"m", 0}}}})));
  ExpectError<IoError>(
      [&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
      {"rank_00001.safetensors", "places tensor 'w' [4, 6) in this file", "lists no shard of it"});
  // It lists one shard more than the manifest places there.
  h = MakeCheckpoint(root, 3,
                     listing(json::array({{"w", {2, 3}, 0, 4, 6, {{"main", 0}, {"m", 0}}},
                                          {"u", {1}, 0, 0, 1, {{"main", 1}}}})));
  ExpectError<IoError>(
      [&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
      {"rank_00001.safetensors", "its header lists 2 shards, the manifest places 1"});
  // Malformed, or beyond its records.
  h = MakeCheckpoint(root, 4, listing(json::array({{"w", 0, 4}})));
  ExpectError<IoError>([&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
                       {"rank_00001.safetensors", "malformed shard [\"w\",0,4]"});
  h = MakeCheckpoint(root, 5,
                     listing(json::array({{"w", {2, 3}, 0, 4, 6, {{"main", 1}, {"m", 0}}}})));
  ExpectError<IoError>([&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
                       {"rank_00001.safetensors", "outside its records"});
  h = MakeCheckpoint(root, 8, [](int file, json& header) {
    if (file == 1) header["__metadata__"]["shards"] = json::array();  // a list, not its text
  });
  ExpectError<IoError>([&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
                       {"rank_00001.safetensors", "not a JSON list in a string"});
  // The tensor's shape transposed in the header (the manifest's [2, 3]).
  h = MakeCheckpoint(root, 7,
                     listing(json::array({{"w", {3, 2}, 0, 4, 6, {{"main", 0}, {"m", 0}}}})));
  ExpectError<IoError>([&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
                       {"rank_00001.safetensors",
                        "tensor 'w' has shape [2, 3] in the manifest but "
                        "[3, 2] in this file's header"});
  // No list: refused at version 4, loaded as the version 3 files it then is.
  const auto unlisted = [](int, json& header) { header["__metadata__"].erase("shards"); };
  h = MakeCheckpoint(root, 6, unlisted);
  ExpectError<IoError>([&] { VerifyCheckpointFiles(ReadManifest(h.dir)); },
                       {"rank_00000.safetensors", "does not list its shards"});
  h.manifest["format_version"] = 3;
  h.Write();
  VerifyCheckpointFiles(ReadManifest(h.dir));
}

TEST(Manifest, EditsOfASealedManifestAreRefused) {
  const std::string root = Tmp("sealed");
  HandMade h = MakeCheckpoint(root, 1);
  const std::string mp = (fs::path(h.dir) / kManifestFile).string();
  std::string text;
  {
    std::ifstream in(mp);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  EXPECT_NO_THROW(ReadManifest(h.dir));
  auto write = [&](const std::string& t) { std::ofstream(mp, std::ios::trunc) << t; };
  // One digit of a shard offset (still in range: the structural checks pass).
  std::string edited = text;
  const std::string from = fmt::format("\"m\": {}", h.data_start[0] + 16);
  const size_t at = edited.find(from);
  ASSERT_NE(at, std::string::npos) << text;
  edited.replace(at, from.size(), fmt::format("\"m\": {}", h.data_start[0] + 12));
  write(edited);
  ExpectError<IoError>([&] { ReadManifest(h.dir); }, {mp, "manifest checksum mismatch"});
  // The two files' CRCs swapped.
  json j = json::parse(text);
  std::swap(j["files"][0]["crc32"], j["files"][1]["crc32"]);
  write(j.dump(1));
  ExpectError<IoError>([&] { ReadManifest(h.dir); }, {mp, "manifest checksum mismatch"});
  // The seal removed.
  j = json::parse(text);
  j.erase("manifest_crc32");
  write(j.dump(1));
  ExpectError<IoError>([&] { ReadManifest(h.dir); }, {mp, "'manifest_crc32' is missing"});
  // Reformatting keeps the content: still accepted.
  write(json::parse(text).dump(4));
  EXPECT_NO_THROW(ReadManifest(h.dir));
  // A version 1 manifest (before the seal) still loads.
  j = json::parse(text);
  j.erase("manifest_crc32");
  j["format_version"] = 1;
  write(j.dump(1));
  EXPECT_NO_THROW(ReadManifest(h.dir));
}

TEST(Listing, LatestCompleteCheckpointIgnoringIncompleteSaves) {
  const std::string root = Tmp("list");
  ExpectError<IoError>([&] { ResolveCheckpoint(root); }, {root, "no complete checkpoint"});
  MakeCheckpoint(root, 5);
  MakeCheckpoint(root, 20);
  HandMade h = MakeCheckpoint(root, 30);
  fs::rename(h.dir, h.dir + ".tmp");                         // an interrupted save
  fs::create_directories(fs::path(root) / "step_00000040");  // no manifest: incomplete
  fs::create_directories(fs::path(root) / "notes");
  auto all = ListCheckpoints(root);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, 5);
  EXPECT_EQ(all[1].first, 20);
  EXPECT_EQ(ResolveCheckpoint(root), all[1].second);
  EXPECT_EQ(ResolveCheckpoint(all[0].second), all[0].second);
  ExpectError<IoError>([&] { ResolveCheckpoint(root + "/nope"); }, {"nope", "no such"});
  ExpectError<IoError>([&] { ReadManifest(h.dir + ".tmp/../step_00000040"); },
                       {"missing (an incomplete save?)"});
}

TEST(TensorMatch, MismatchesAreListed) {
  std::vector<TensorSpec> want = {{"a", {2, 3}}, {"b", {4}}, {"c", {5}}};
  EXPECT_EQ(DescribeTensorMismatch(want, want, "f"), "");
  std::vector<TensorSpec> have = {{"a", {3, 2}}, {"c", {5}}, {"z", {1}}};
  const std::string s = DescribeTensorMismatch(want, have, "x.safetensors");
  EXPECT_NE(s.find("x.safetensors: does not match this model (3 parameters; the file has 3): "
                   "3 mismatches"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("'a' has shape [3, 2] in the file, the model needs [2, 3]"), std::string::npos);
  EXPECT_NE(s.find("'b' [4] is missing in the file"), std::string::npos);
  EXPECT_NE(s.find("'z' [1] in the file is not a parameter of this model"), std::string::npos);
  EXPECT_EQ(DescribeTensorMismatch(want, have, "x", 1).find("'b'"), std::string::npos);
}

TEST(TensorMatch, InitWeightsRefuseAnotherModel) {
  const std::string dir = Tmp("init");
  const std::string p = dir + "/w.safetensors";
  WriteSafetensors(p, {{"a", {{2, 3}, {1, 2, 3, 4, 5, 6}}}, {"b", {{4}, {1, 2, 3, 4}}}});
  auto w = ReadInitWeights(p, {{"a", {2, 3}}, {"b", {4}}});
  EXPECT_EQ(w.at("a")[5], 6.0f);
  ExpectError<ConfigError>(
      [&] {
        ReadInitWeights(p, {{"a", {2, 3}}, {"b", {8}}, {"c", {1}}});
      },
      {p, "2 mismatches", "'b' has shape [4] in the file, the model needs [8]",
       "'c' [1] is missing"});
}

TEST(JsonDiff, NamesEveryDifferingKey) {
  json a = {{"d_model", 32}, {"n_layer", 1}, {"type", "gpt"}};
  json b = {{"d_model", 64}, {"n_layer", 1}, {"vocab", 256}};
  auto d = JsonDifferences(a, b);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0], "d_model 32 (checkpoint) vs 64 (this run)");
  EXPECT_EQ(d[1], "type gpt (checkpoint) vs absent (this run)");
  EXPECT_EQ(d[2], "vocab absent (checkpoint) vs 256 (this run)");
  EXPECT_TRUE(JsonDifferences(a, a).empty());
}

}  // namespace
}  // namespace sshsdp
