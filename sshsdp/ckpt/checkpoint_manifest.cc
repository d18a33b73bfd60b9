// Checkpoint manifest: built, sealed, read and validated, and the listing and resolving of
// checkpoint directories that loads start from (see checkpoint.h).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include "sshsdp/base/crc32.h"
#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/checkpoint_internal.h"

namespace sshsdp {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

using ckpt_internal::Hex;
using ckpt_internal::IsTemporary;

namespace {

constexpr const char* kFormatName = "sshsdp-checkpoint";

// The manifest's fields a tensor's shards must hold: main and the state its optimizer keeps
// (OptimizerStateFields; AdamW m, v; Muon m). Every field for checkpoints that do not name
// the optimizer, and for version-2 checkpoints, which stored v for Muon parameters too.
std::vector<std::string> KeptFields(const Manifest& m, const CheckpointTensor& t) {
  if (t.optimizer.empty() || m.format_version < 3) return m.fields;
  std::vector<std::string> kept = {"main"};
  for (OptimizerKind k : {OptimizerKind::kAdamW, OptimizerKind::kMuon})
    if (t.optimizer == OptimizerName(k))
      for (const std::string& f : OptimizerStateFields(k)) kept.push_back(f);
  std::vector<std::string> out;
  for (const std::string& f : m.fields)
    if (std::find(kept.begin(), kept.end(), f) != kept.end()) out.push_back(f);
  return out;
}

// A step_<digits> name (complete checkpoint) -> its step; -1 otherwise.
int64_t ParseStepDir(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 56)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

ojson LayoutJson(const Topology& t) {
  return {{"world", t.world()},
          {"ranks_per_node", t.ranks_per_node()},
          {"sw", t.sw()},
          {"sg", t.sg()},
          {"so", t.so()}};
}

// A JSON number as the integer type T: an integer literal (not 1e3 or 2.0) within T's range —
// nlohmann's get<int> would wrap 4294967296 to 0 and truncate 1e308.
template <typename T>
T Integer(const json& v, const std::string& where, const char* key) {
  SSHSDP_CHECK(v.is_number_integer(), IoError, "{}: '{}' is malformed: {} is not an integer", where,
               key, v.dump());
  if (v.is_number_unsigned()) {  // nlohmann keeps every non-negative integer unsigned
    const uint64_t u = v.get<uint64_t>();
    SSHSDP_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<T>::max()), IoError,
                 "{}: '{}' = {} is out of range", where, key, u);
    return static_cast<T>(u);
  }
  const int64_t x = v.get<int64_t>();
  SSHSDP_CHECK(std::is_signed_v<T> && x >= static_cast<int64_t>(std::numeric_limits<T>::min()),
               IoError, "{}: '{}' = {} is out of range", where, key, x);
  return static_cast<T>(x);
}

template <typename T>
struct Strict {  // a value read as is (strings, string lists)
  static T Read(const json& v, const std::string&, const char*) { return v.get<T>(); }
};
template <typename T>
requires std::is_integral_v<T>
struct Strict<T> {
  static T Read(const json& v, const std::string& where, const char* key) {
    return Integer<T>(v, where, key);
  }
};
template <typename T>
requires std::is_integral_v<T>
struct Strict<std::vector<T>> {
  static std::vector<T> Read(const json& v, const std::string& where, const char* key) {
    SSHSDP_CHECK(v.is_array(), IoError, "{}: '{}' is not a list", where, key);
    std::vector<T> out;
    for (const json& e : v) out.push_back(Integer<T>(e, where, key));
    return out;
  }
};
template <typename T>
struct Strict<std::map<std::string, T>> {
  static std::map<std::string, T> Read(const json& v, const std::string& where, const char* key) {
    SSHSDP_CHECK(v.is_object(), IoError, "{}: '{}' is not an object", where, key);
    std::map<std::string, T> out;
    for (const auto& [k, e] : v.items()) out[k] = Integer<T>(e, where, key);
    return out;
  }
};

template <typename T>
T Get(const json& j, const char* key, const std::string& where) {
  SSHSDP_CHECK(j.is_object() && j.contains(key), IoError, "{}: missing '{}'", where, key);
  try {
    return Strict<T>::Read(j.at(key), where, key);
  } catch (const IoError&) {
    throw;
  } catch (const std::exception& e) {
    throw IoError(fmt::format("{}: '{}' is malformed: {}", where, key, e.what()));
  }
}

}  // namespace

// Rank 0: the manifest of a save whose files were reported as `reports`.
ojson ckpt_internal::BuildManifest(Engine& engine, const std::vector<Engine::Zero1Field>& fields,
                                   const CheckpointMeta& meta, const std::vector<int>& writers,
                                   const std::vector<RankFilePlan>& plans,
                                   const std::vector<Report>& reports) {
  const Topology& topo = engine.topology();
  ojson m;
  m["format"] = kFormatName;
  m["format_version"] = kCheckpointFormatVersion;
  m["step"] = engine.step();
  m["layout"] = LayoutJson(topo);
  m["runtime_dtype"] = std::string(DTypeName(engine.config().weight_dtype));
  m["state_dtype"] = "F32";
  std::vector<std::string> names;
  for (const auto& f : fields)
    if (std::find(names.begin(), names.end(), f.field) == names.end()) names.push_back(f.field);
  m["fields"] = names;
  m["model"] = meta.model;
  m["run"] = meta.run;
  m["scalars"] = meta.scalars;
  ojson files = ojson::array();
  for (size_t i = 0; i < writers.size(); ++i) {
    const int r = writers[i];
    files.push_back({{"name", RankFileName(r)},
                     {"rank", r},
                     {"bytes", reports[r].bytes},
                     {"crc32", Hex(reports[r].crc)}});
  }
  m["files"] = files;

  // Shards: every fragment of every writer's ZeRO-1 chunk, as its file's header lists it.
  std::map<std::string, ojson> shards;  // tensor -> array
  for (size_t i = 0; i < writers.size(); ++i)
    for (const ckpt_internal::ShardEntry& s : plans[i].shards) {
      ojson offs;  // a field the tensor's optimizer does not keep has no offset
      for (const auto& [j, at] : s.at) offs[fields[j].field] = plans[i].offsets[j] + at * 4;
      shards[s.tensor].push_back({{"file", i}, {"range", {s.begin, s.end}}, {"offsets", offs}});
    }
  ojson tensors = ojson::array();
  for (const UpdateParam& u : engine.UpdateParams()) {
    ojson s = shards[u.name];
    std::vector<ojson> v(s.begin(), s.end());
    std::sort(v.begin(), v.end(), [](const ojson& a, const ojson& b) {
      return a["range"][0].get<uint64_t>() < b["range"][0].get<uint64_t>();
    });
    tensors.push_back({{"name", u.name},
                       {"shape", u.shape},
                       {"group", u.group},
                       {"optimizer", OptimizerName(u.optimizer)},
                       {"shards", v}});
  }
  m["tensors"] = tensors;
  return m;
}

std::string CheckpointLayout::ToString() const {
  return fmt::format("W={} nodes={}x{} sw={} sg={} so={}", world,
                     world / std::max(1, ranks_per_node), ranks_per_node, sw, sg, so);
}

std::string Manifest::ManifestPath() const { return (fs::path(dir) / kManifestFile).string(); }
std::string Manifest::FilePath(int file) const {
  return (fs::path(dir) / files.at(file).name).string();
}
uint64_t Manifest::DataBytes() const {
  uint64_t b = 0;
  for (const auto& f : files) b += f.bytes;
  return b;
}

// ---- Listing and manifest ------------------------------------------------------------

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t step = ParseStepDir(e.path().filename().string());
    if (step < 0 || !e.is_directory()) continue;
    if (fs::exists(e.path() / kManifestFile)) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string ResolveCheckpoint(const std::string& path) {
  std::error_code ec;
  SSHSDP_CHECK(fs::exists(path, ec), IoError, "{}: no such checkpoint directory", path);
  if (fs::exists(fs::path(path) / kManifestFile, ec)) return path;
  SSHSDP_CHECK(fs::is_directory(path, ec), IoError, "{}: not a checkpoint directory", path);
  const fs::path latest = fs::path(path) / kLatestFile;
  if (fs::exists(latest, ec)) {
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    SSHSDP_CHECK(ParseStepDir(name) >= 0, IoError,
                 "{}: does not name a step directory (got '{}'); pass a step directory",
                 latest.string(), name);
    const fs::path dir = fs::path(path) / name;
    SSHSDP_CHECK(fs::exists(dir / kManifestFile, ec), IoError,
                 "{}: names {}, which is not a complete checkpoint (deleted?); pass one of the "
                 "step directories instead",
                 latest.string(), dir.string());
    return dir.string();
  }
  auto all = ListCheckpoints(path);
  if (!all.empty()) return all.back().second;
  int tmp = 0;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (IsTemporary(e.path().filename().string())) ++tmp;
  throw IoError(fmt::format(
      "{}: no complete checkpoint here (expected step_<N>/{} or a {} in this directory){}", path,
      kManifestFile, kManifestFile,
      tmp ? fmt::format("; {} incomplete save(s) (*.tmp) ignored", tmp) : std::string()));
}

std::string SealManifest(const ojson& manifest) {
  ojson m = manifest;
  m.erase("manifest_crc32");
  const std::string body = m.dump();
  m["manifest_crc32"] = Hex(Crc32(body.data(), body.size()));
  return m.dump(1);
}

namespace {

// The manifest's own CRC-32 (format version >= 2): over the compact JSON of the manifest,
// in file order, without "manifest_crc32".
void CheckManifestCrc(const std::string& text, const std::string& where) {
  ojson o = ojson::parse(text);
  SSHSDP_CHECK(o.contains("manifest_crc32") && o["manifest_crc32"].is_string(), IoError,
               "{}: 'manifest_crc32' is missing (the manifest was edited or is incomplete)", where);
  const std::string stored = o["manifest_crc32"].get<std::string>();
  o.erase("manifest_crc32");
  const std::string body = o.dump();
  const std::string actual = Hex(Crc32(body.data(), body.size()));
  SSHSDP_CHECK(stored == actual, IoError,
               "{}: manifest checksum mismatch (stored {}, computed {}): the manifest was "
               "edited or corrupted after it was written; restore it or use another checkpoint",
               where, stored, actual);
}

Manifest ParseManifest(const std::string& dir);

}  // namespace

Manifest ReadManifest(const std::string& dir) {
  // Any JSON type error (a number where a string belongs, ...) names the manifest.
  try {
    return ParseManifest(dir);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("{}: malformed manifest: {}",
                              (fs::path(dir) / kManifestFile).string(), e.what()));
  }
}

namespace {

Manifest ParseManifest(const std::string& dir) {
  Manifest m;
  m.dir = dir;
  const std::string where = m.ManifestPath();
  SSHSDP_CHECK(fs::is_regular_file(where), IoError, "{}: cannot open: {}", where,
               !fs::exists(dir)     ? "no such directory"
               : !fs::exists(where) ? "missing (an incomplete save?)"
                                    : "not a regular file");
  std::ifstream in(where, std::ios::binary);
  SSHSDP_CHECK(in.good(), IoError, "{}: cannot open: {}", where, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw IoError(fmt::format("{}: not valid JSON (corrupt or truncated): {}", where, e.what()));
  }
  SSHSDP_CHECK(j.is_object() && j.contains("format") && j["format"].is_string() &&
                   j["format"].get<std::string>() == kFormatName,
               IoError, "{}: not an sshsdp checkpoint manifest (\"format\" is not \"{}\")", where,
               kFormatName);
  m.format_version = Get<int>(j, "format_version", where);
  SSHSDP_CHECK(m.format_version <= kCheckpointFormatVersion, IoError,
               "{}: format version {} is newer than this build of sshsdp reads ({}); load it "
               "with a newer sshsdp",
               where, m.format_version, kCheckpointFormatVersion);
  SSHSDP_CHECK(m.format_version >= 1, IoError, "{}: invalid format version {}", where,
               m.format_version);
  if (m.format_version >= 2) CheckManifestCrc(text, where);
  m.step = Get<int64_t>(j, "step", where);
  const json& L = j.contains("layout") ? j["layout"] : json();
  const std::string lw = where + " layout";
  m.layout = {Get<int>(L, "world", lw), Get<int>(L, "ranks_per_node", lw), Get<int>(L, "sw", lw),
              Get<int>(L, "sg", lw), Get<int>(L, "so", lw)};
  SSHSDP_CHECK(m.step >= 0, IoError, "{}: step {} is negative", where, m.step);
  try {
    Topology check(m.layout.world, m.layout.ranks_per_node, m.layout.sw, m.layout.sg, m.layout.so);
  } catch (const LayoutError& e) {
    throw IoError(fmt::format("{}: the layout is not valid: {}", where, e.what()));
  }
  m.runtime_dtype = Get<std::string>(j, "runtime_dtype", where);
  SSHSDP_CHECK(Get<std::string>(j, "state_dtype", where) == "F32", IoError,
               "{}: state dtype {} is not supported (F32 only)", where, j["state_dtype"].dump());
  m.fields = Get<std::vector<std::string>>(j, "fields", where);
  m.meta.model = j.value("model", json::object());
  m.meta.run = j.value("run", json::object());
  m.meta.scalars = j.value("scalars", json::object());
  SSHSDP_CHECK(j.contains("files") && j["files"].is_array() && !j["files"].empty(), IoError,
               "{}: 'files' is missing or empty", where);
  for (const json& f : j["files"]) {
    CheckpointFile cf;
    cf.name = Get<std::string>(f, "name", where + " files[]");
    SSHSDP_CHECK(!cf.name.empty() && cf.name.find('/') == std::string::npos && cf.name[0] != '.',
                 IoError, "{}: file name '{}' is not a plain file name", where, cf.name);
    cf.rank = Get<int>(f, "rank", where + " " + cf.name);
    SSHSDP_CHECK(cf.rank >= 0 && cf.rank < m.layout.world, IoError,
                 "{}: {} is from rank {}, outside the saved world of {}", where, cf.name, cf.rank,
                 m.layout.world);
    for (const CheckpointFile& other : m.files)
      SSHSDP_CHECK(other.rank != cf.rank && other.name != cf.name, IoError,
                   "{}: rank {} / file {} is listed twice", where, cf.rank, cf.name);
    cf.bytes = Get<uint64_t>(f, "bytes", where + " " + cf.name);
    const std::string crc = Get<std::string>(f, "crc32", where + " " + cf.name);
    try {
      size_t pos = 0;
      cf.crc32 = static_cast<uint32_t>(std::stoul(crc, &pos, 16));
      SSHSDP_CHECK(pos == crc.size(), IoError, "");
    } catch (const std::exception&) {
      throw IoError(fmt::format("{}: crc32 '{}' of {} is not hexadecimal", where, crc, cf.name));
    }
    m.files.push_back(cf);
  }
  SSHSDP_CHECK(j.contains("tensors") && j["tensors"].is_array(), IoError, "{}: 'tensors' missing",
               where);
  for (const json& t : j["tensors"]) {
    CheckpointTensor ct;
    ct.name = Get<std::string>(t, "name", where + " tensors[]");
    const std::string tw = fmt::format("{} tensor '{}'", where, ct.name);
    ct.shape = Get<std::vector<int64_t>>(t, "shape", tw);
    ct.group = Get<int>(t, "group", tw);
    SSHSDP_CHECK(ct.group >= 0, IoError, "{}: group {} is negative", tw, ct.group);
    if (t.contains("optimizer")) ct.optimizer = Get<std::string>(t, "optimizer", tw);
    for (int64_t d : ct.shape) SSHSDP_CHECK(d > 0, IoError, "{}: non-positive dimension", tw);
    const uint64_t numel = NumElements(ct.shape);
    uint64_t next = 0;
    SSHSDP_CHECK(t.contains("shards") && t["shards"].is_array(), IoError, "{}: 'shards' missing",
                 tw);
    for (const json& s : t["shards"]) {
      CheckpointShard cs;
      cs.file = Get<int>(s, "file", tw);
      const auto range = Get<std::vector<uint64_t>>(s, "range", tw);
      SSHSDP_CHECK(range.size() == 2, IoError, "{}: a shard range is not [begin, end]", tw);
      cs.begin = range[0], cs.end = range[1];
      SSHSDP_CHECK(cs.file >= 0 && cs.file < static_cast<int>(m.files.size()), IoError,
                   "{}: shard refers to file #{}, the manifest lists {} files", tw, cs.file,
                   m.files.size());
      SSHSDP_CHECK(cs.begin == next && cs.end > cs.begin && cs.end <= numel, IoError,
                   "{}: shards do not tile its {} elements (shard [{}, {}) after element {})", tw,
                   numel, cs.begin, cs.end, next);
      next = cs.end;
      cs.offsets = Get<std::map<std::string, uint64_t>>(s, "offsets", tw);
      for (const std::string& f : KeptFields(m, ct)) {
        auto it = cs.offsets.find(f);
        SSHSDP_CHECK(it != cs.offsets.end(), IoError, "{}: shard in {} lacks field '{}'", tw,
                     m.files[cs.file].name, f);
      }
      for (const auto& [f, off] : cs.offsets) {
        SSHSDP_CHECK(std::find(m.fields.begin(), m.fields.end(), f) != m.fields.end(), IoError,
                     "{}: shard in {} has field '{}', which the manifest does not list", tw,
                     m.files[cs.file].name, f);
        const uint64_t file_bytes = m.files[cs.file].bytes;
        SSHSDP_CHECK(off <= file_bytes && (cs.end - cs.begin) <= (file_bytes - off) / 4, IoError,
                     "{}: field '{}' [{}, {}) lies beyond the {} bytes of {}", tw, f, cs.begin,
                     cs.end, m.files[cs.file].bytes, m.files[cs.file].name);
      }
      ct.shards.push_back(std::move(cs));
    }
    SSHSDP_CHECK(next == numel, IoError, "{}: shards cover {} of its {} elements", tw, next, numel);
    m.tensors.push_back(std::move(ct));
  }
  return m;
}

}  // namespace

}  // namespace sshsdp
