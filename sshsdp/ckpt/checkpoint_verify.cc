// Checkpoint verification: file sizes, CRC-32s and each rank file's own safetensors header
// against the manifest, and the summary
// `sshsdp ckpt inspect` prints (see checkpoint.h).
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "sshsdp/base/crc32.h"
#include "sshsdp/base/error.h"
#include "sshsdp/base/posix_file.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/checkpoint_internal.h"
#include "sshsdp/layout/tensor_list.h"

namespace sshsdp {

namespace fs = std::filesystem;

using ckpt_internal::FileCrc;
using ckpt_internal::Hex;

// CRC-32 of a whole file, streamed.
uint32_t ckpt_internal::FileCrc(const std::string& path, uint64_t bytes, uint64_t* bytes_read) {
  InFile f(path);
  std::vector<char> buf(std::min<uint64_t>(bytes, kIoChunk));
  uint32_t crc = 0;
  for (uint64_t off = 0; off < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kIoChunk, bytes - off));
    f.ReadAt(buf.data(), n, off);
    crc = Crc32(buf.data(), n, crc);
    off += n;
  }
  if (bytes_read) *bytes_read += bytes;
  return crc;
}

std::string CheckFileSize(const Manifest& m, int file) {
  const std::string path = m.FilePath(file);
  std::error_code ec;
  if (!fs::exists(path, ec))
    return fmt::format("{}: missing (the manifest lists it with {} bytes, saved by rank {})", path,
                       m.files[file].bytes, m.files[file].rank);
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return fmt::format("{}: cannot stat: {}", path, ec.message());
  if (size != m.files[file].bytes)
    return fmt::format("{}: {}: {} bytes, the manifest says {}", path,
                       size < m.files[file].bytes ? "truncated" : "wrong size", size,
                       m.files[file].bytes);
  return {};
}

namespace {

// A record of a rank file's own safetensors header: absolute byte range [begin, end).
struct Record {
  uint64_t begin, end;
};

struct RankHeader {
  std::map<std::string, Record> records;  // by record name, "group<g>.<field>"
  nlohmann::json meta;                    // its "__metadata__"
};

// The rank file's header, checked on its own: its metadata names the manifest's rank and
// step, every record is F32 [n] with 4·n bytes, back to back from the data start to the end of
// the file. IoError naming the file and what disagrees.
RankHeader ReadRankHeader(const Manifest& m, int file) {
  const std::string path = m.FilePath(file);
  const CheckpointFile& f = m.files[file];
  InFile in(path);
  uint64_t n = 0;
  SSHSDP_CHECK(f.bytes >= 8, IoError, "{}: too short for a safetensors header", path);
  in.ReadAt(&n, 8, 0);
  SSHSDP_CHECK(n <= f.bytes - 8, IoError, "{}: header length {} beyond the file's {} bytes", path,
               n, f.bytes);
  std::string text(n, '\0');
  in.ReadAt(text.data(), n, 8);
  const nlohmann::json h = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  SSHSDP_CHECK(h.is_object() && h.contains("__metadata__") && h["__metadata__"].is_object(),
               IoError, "{}: the safetensors header is not an sshsdp shard header", path);
  const nlohmann::json& meta = h["__metadata__"];
  SSHSDP_CHECK(meta.value("rank", "") == std::to_string(f.rank) &&
                   meta.value("step", "") == std::to_string(m.step),
               IoError,
               "{}: its header says rank {} step {}, the manifest lists it as rank {} at step {}",
               path, meta.value("rank", "?"), meta.value("step", "?"), f.rank, m.step);
  std::map<std::string, Record> records;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, r] : h.items()) {
    if (name == "__metadata__") continue;
    const bool ok = r.is_object() && r.value("dtype", "") == "F32" && r.contains("shape") &&
                    r["shape"].is_array() && r["shape"].size() == 1 &&
                    r["shape"][0].is_number_unsigned() && r.contains("data_offsets") &&
                    r["data_offsets"].is_array() && r["data_offsets"].size() == 2 &&
                    r["data_offsets"][0].is_number_unsigned() &&
                    r["data_offsets"][1].is_number_unsigned();
    SSHSDP_CHECK(ok, IoError, "{}: header record '{}' is not F32 [n] with data_offsets", path,
                 name);
    const uint64_t b = r["data_offsets"][0], e = r["data_offsets"][1], elems = r["shape"][0];
    SSHSDP_CHECK(b <= e && e - b == elems * 4, IoError,
                 "{}: header record '{}' spans [{}, {}) for {} floats", path, name, b, e, elems);
    records[name] = {8 + n + b, 8 + n + e};
    spans.push_back({b, e});
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    SSHSDP_CHECK(b == at, IoError, "{}: header records leave a gap or overlap at byte {}", path,
                 at);
    at = e;
  }
  SSHSDP_CHECK(8 + n + at == f.bytes, IoError,
               "{}: header records end at byte {}, the file has {} bytes", path, 8 + n + at,
               f.bytes);
  return {records, meta};
}

// A shard as the rank file's own header lists it (format version 4), offsets absolute.
struct Listed {
  std::vector<int64_t> shape;
  int group = 0;
  uint64_t end = 0;
  std::map<std::string, uint64_t> offsets;  // field -> byte offset of element `begin`
};
using ShardKey = std::pair<std::string, uint64_t>;  // tensor, begin

// The "shards" list of a rank file's metadata: [tensor, shape, group, begin, end, {field:
// element of its record}] each, every one inside its record. IoError naming the file when
// malformed.
std::map<ShardKey, Listed> ListedShards(const std::string& path, const RankHeader& h) {
  const nlohmann::json& text = h.meta.at("shards");  // present: CheckListedShards
  const nlohmann::json list = text.is_string()
                                  ? nlohmann::json::parse(text.get<std::string>(), nullptr, false)
                                  : nlohmann::json();
  SSHSDP_CHECK(list.is_array(), IoError,
               "{}: its header's list of shards is not a JSON list in a string (the file was "
               "edited or corrupted); use another checkpoint",
               path);
  std::map<ShardKey, Listed> out;
  for (const nlohmann::json& e : list) {
    const bool ok = e.is_array() && e.size() == 6 && e[0].is_string() && e[1].is_array() &&
                    std::all_of(e[1].begin(), e[1].end(),
                                [](const nlohmann::json& d) { return d.is_number_unsigned(); }) &&
                    e[2].is_number_unsigned() && e[2] <= 1u << 30 && e[3].is_number_unsigned() &&
                    e[4].is_number_unsigned() && e[5].is_object() && e[3] < e[4];
    SSHSDP_CHECK(ok, IoError,
                 "{}: its header lists a malformed shard {} (the file was edited or corrupted); "
                 "use another checkpoint",
                 path, e.dump());
    Listed l{e[1].get<std::vector<int64_t>>(), e[2].get<int>(), e[4].get<uint64_t>(), {}};
    const uint64_t begin = e[3].get<uint64_t>(), n = l.end - begin;
    for (const auto& [field, at] : e[5].items()) {
      const auto r = h.records.find(fmt::format("group{}.{}", l.group, field));
      SSHSDP_CHECK(r != h.records.end() && at.is_number_unsigned() &&
                       at.get<uint64_t>() <= (r->second.end - r->second.begin) / 4 &&
                       n <= (r->second.end - r->second.begin) / 4 - at.get<uint64_t>(),
                   IoError, "{}: its header lists shard {} outside its records", path, e.dump());
      l.offsets[field] = r->second.begin + at.get<uint64_t>() * 4;
    }
    SSHSDP_CHECK(out.emplace(ShardKey{e[0].get<std::string>(), begin}, l).second, IoError,
                 "{}: its header lists shard {} twice", path, e.dump());
  }
  return out;
}

std::string Describe(int group, uint64_t begin, uint64_t end,
                     const std::map<std::string, uint64_t>& offsets) {
  std::vector<std::string> at;
  for (const auto& [field, off] : offsets) at.push_back(fmt::format("{} at byte {}", field, off));
  return fmt::format("group {} [{}, {}) {}", group, begin, end, fmt::join(at, ", "));
}

// The manifest's shards in `file` are exactly those the file's header lists: same tensors,
// ranges, groups and byte offsets. A manifest whose shards were swapped between same-shape
// tensors, shifted, or moved to another file is refused, naming the tensor and both sources.
void CheckListedShards(const Manifest& m, int file, const RankHeader& h) {
  const std::string path = m.FilePath(file);
  if (!h.meta.contains("shards")) {
    SSHSDP_CHECK(m.format_version < 4, IoError,
                 "{}: its header does not list its shards, which format version {} requires "
                 "(the file was replaced by one of an older save?); use another checkpoint",
                 path, m.format_version);
    return;
  }
  const std::map<ShardKey, Listed> listed = ListedShards(path, h);
  size_t placed = 0;
  for (const CheckpointTensor& t : m.tensors)
    for (const CheckpointShard& s : t.shards) {
      if (s.file != file) continue;
      ++placed;
      const auto it = listed.find({t.name, s.begin});
      SSHSDP_CHECK(it != listed.end(), IoError,
                   "{}: the manifest places tensor '{}' [{}, {}) in this file, whose header lists "
                   "no shard of it starting at element {}: the manifest was edited",
                   path, t.name, s.begin, s.end, s.begin);
      const Listed& l = it->second;
      SSHSDP_CHECK(l.shape == t.shape, IoError,
                   "{}: tensor '{}' has shape {} in the manifest but {} in this file's header: "
                   "the manifest was edited, or the file belongs to another save",
                   path, t.name, ShapeString(t.shape), ShapeString(l.shape));
      SSHSDP_CHECK(l.group == t.group && l.end == s.end && l.offsets == s.offsets, IoError,
                   "{}: tensor '{}' is {} in the manifest but {} in this file's header: the "
                   "manifest was edited, or the file belongs to another save",
                   path, t.name, Describe(t.group, s.begin, s.end, s.offsets),
                   Describe(l.group, s.begin, l.end, l.offsets));
    }
  SSHSDP_CHECK(placed == listed.size(), IoError,
               "{}: its header lists {} shards, the manifest places {} in it: the manifest was "
               "edited, or the file belongs to another save",
               path, listed.size(), placed);
}

// Every shard the manifest places in `file` lies inside that file's own record of its group
// and field: a manifest offset or file index moved onto another record, or beyond one, is
// refused naming the tensor, the manifest's offset and the file's record.
std::string CheckFileHeader(const Manifest& m, int file) {
  try {
    const RankHeader header = ReadRankHeader(m, file);
    const std::map<std::string, Record>& records = header.records;
    for (const CheckpointTensor& t : m.tensors)
      for (const CheckpointShard& s : t.shards) {
        if (s.file != file) continue;
        for (const auto& [field, off] : s.offsets) {
          const std::string name = fmt::format("group{}.{}", t.group, field);
          const auto r = records.find(name);
          SSHSDP_CHECK(r != records.end(), IoError,
                       "{}: the manifest reads tensor '{}' field '{}' from it, its header has no "
                       "record '{}'",
                       m.FilePath(file), t.name, field, name);
          SSHSDP_CHECK(off >= r->second.begin && (s.end - s.begin) * 4 <= r->second.end - off,
                       IoError,
                       "{}: the manifest puts tensor '{}' [{}, {}) field '{}' at byte {}, outside "
                       "the file's record '{}' [{}, {})",
                       m.FilePath(file), t.name, s.begin, s.end, field, off, name, r->second.begin,
                       r->second.end);
        }
      }
    CheckListedShards(m, file, header);
  } catch (const Error& err) {
    return err.what();
  }
  return {};
}

}  // namespace

std::string CheckFileContents(const Manifest& m, int file, uint64_t* bytes_read) {
  std::string e = CheckFileSize(m, file);
  if (!e.empty()) return e;
  try {
    const uint32_t crc = FileCrc(m.FilePath(file), m.files[file].bytes, bytes_read);
    if (crc != m.files[file].crc32)
      return fmt::format(
          "{}: checksum mismatch: CRC-32 {} on disk, the manifest says {} (the file is corrupt)",
          m.FilePath(file), Hex(crc), Hex(m.files[file].crc32));
  } catch (const Error& err) {
    return err.what();
  }
  return CheckFileHeader(m, file);
}

void VerifyCheckpointFiles(const Manifest& m) {
  for (int i = 0; i < static_cast<int>(m.files.size()); ++i) {
    const std::string e = CheckFileContents(m, i);
    SSHSDP_CHECK(e.empty(), IoError, "{}", e);
  }
}

std::string DescribeCheckpoint(const Manifest& m) {
  std::string s;
  uint64_t params = 0;
  for (const auto& t : m.tensors) params += NumElements(t.shape);
  s += fmt::format("checkpoint {} (format version {})\n", m.dir, m.format_version);
  s += fmt::format("  step {} | saved at {} | runtime weights {} | fp32 state: {}\n", m.step,
                   m.layout.ToString(), m.runtime_dtype, fmt::join(m.fields, ", "));
  s += fmt::format("  model: {}\n", m.meta.model.dump());
  if (!m.meta.run.empty()) s += fmt::format("  run: {}\n", m.meta.run.dump());
  if (!m.meta.scalars.empty()) s += fmt::format("  scalars: {}\n", m.meta.scalars.dump());
  s += fmt::format("  tensors: {} update parameters, {} elements\n", m.tensors.size(), params);
  for (const auto& t : m.tensors) {
    std::vector<std::string> where;
    for (const auto& sh : t.shards)
      where.push_back(
          fmt::format("{}[{},{})", m.files[sh.file].name.substr(0, 10), sh.begin, sh.end));
    s += fmt::format("    {:<28} {:<12} group {:<3} {}\n", t.name, ShapeString(t.shape), t.group,
                     fmt::join(where, " "));
  }
  s += fmt::format("  files: {}, {} bytes\n", m.files.size(), m.DataBytes());
  for (const auto& f : m.files)
    s += fmt::format("    {}  {:>12} bytes  crc32 {}  (rank {})\n", f.name, f.bytes, Hex(f.crc32),
                     f.rank);
  return s;
}

}  // namespace sshsdp
