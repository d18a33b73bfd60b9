// safetensors reader and atomic writer (see safetensors.h).
#include "sshsdp/ckpt/safetensors.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sshsdp/base/error.h"
#include "sshsdp/layout/tensor_list.h"
#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

void WriteSafetensors(const std::string& path, const std::map<std::string, SafeTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    SSHSDP_CHECK(NumElements(t.shape) == t.data.size(), IoError,
                 "{}: tensor '{}' has shape {} but {} values", path, name, ShapeString(t.shape),
                 t.data.size());
    uint64_t bytes = t.data.size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');  // align the data section
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    SSHSDP_CHECK(f.good(), IoError, "{}: cannot open for writing", tmp);
    uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& [name, t] : tensors)
      f.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size() * 4));
    f.flush();
    SSHSDP_CHECK(f.good(), IoError, "{}: write failed (disk full?)", tmp);
  }
  SSHSDP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, IoError, "{}: cannot rename {} over it",
               path, tmp);
}

std::map<std::string, SafeTensor> ReadSafetensors(const std::string& path,
                                                  std::map<std::string, std::string>* metadata) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  SSHSDP_CHECK(f.good(), IoError, "{}: cannot open (does the file exist?)", path);
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  SSHSDP_CHECK(size >= 8, IoError, "{}: truncated: {} bytes, no safetensors header", path, size);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  SSHSDP_CHECK(n <= size - 8, IoError, "{}: header length {} exceeds the file ({} bytes)", path, n,
               size);
  std::string h(n, '\0');
  f.read(h.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const std::exception& e) {
    throw IoError(fmt::format("{}: header is not valid JSON: {}", path, e.what()));
  }
  const uint64_t data_size = size - 8 - n;
  std::vector<char> data(data_size);
  f.read(data.data(), static_cast<std::streamsize>(data_size));
  std::map<std::string, SafeTensor> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (metadata) *metadata = it.value().get<std::map<std::string, std::string>>();
      continue;
    }
    const auto& e = it.value();
    SSHSDP_CHECK(e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), IoError,
                 "{}: tensor '{}' lacks dtype/shape/data_offsets", path, it.key());
    std::string dt = e["dtype"];
    SSHSDP_CHECK(dt == "F32" || dt == "BF16", IoError,
                 "{}: tensor '{}' has dtype {}; only F32 and BF16 are supported", path, it.key(),
                 dt);
    SafeTensor t;
    t.shape = e["shape"].get<std::vector<int64_t>>();
    uint64_t b = e["data_offsets"][0], end = e["data_offsets"][1];
    const size_t es = dt == "F32" ? 4 : 2;
    SSHSDP_CHECK(b <= end && end <= data_size, IoError,
                 "{}: tensor '{}' data [{}, {}) lies outside the {} data bytes (truncated file?)",
                 path, it.key(), b, end, data_size);
    SSHSDP_CHECK((end - b) == NumElements(t.shape) * es, IoError,
                 "{}: tensor '{}' has {} bytes for shape {} of {}", path, it.key(), end - b,
                 ShapeString(t.shape), dt);
    t.data.resize(NumElements(t.shape));
    if (es == 4) {
      std::memcpy(t.data.data(), data.data() + b, end - b);
    } else {
      Bf16ToFloat(reinterpret_cast<const bf16*>(data.data() + b), t.data.data(), t.data.size());
    }
    out.emplace(it.key(), std::move(t));
  }
  return out;
}

}  // namespace sshsdp
