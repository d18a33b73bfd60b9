// Checkpoint verification: file sizes and CRC-32s against the manifest, and the summary
// `sshsdp ckpt inspect` prints (see checkpoint.h).
#include <algorithm>
#include <filesystem>
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
  return {};
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
