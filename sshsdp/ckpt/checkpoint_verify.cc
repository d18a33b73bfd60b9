// Checkpoint verification: file sizes, CRC-32s and each rank file's own safetensors header
// against the manifest, and the summary
// `sshsdp ckpt inspect` prints (see checkpoint.h).
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/checkpoint_internal.h"
#include "sshsdp/ckpt/crc32.h"
#include "sshsdp/ckpt/posix_file.h"
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

// The rank file's header, checked on its own: its metadata names the manifest's rank and
// step, every record is F32 [n] with 4·n bytes, back to back from the data start to the end of
// the file. IoError naming the file and what disagrees.
std::map<std::string, Record> ReadRankHeader(const Manifest& m, int file) {
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
  return records;
}

// Every shard the manifest places in `file` lies inside that file's own record of its group
// and field: a manifest offset or file index moved onto another record, or beyond one, is
// refused naming the tensor, the manifest's offset and the file's record.
std::string CheckFileHeader(const Manifest& m, int file) {
  try {
    const std::map<std::string, Record> records = ReadRankHeader(m, file);
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
