// safetensors reader and atomic writer (see safetensors.h).
//
// The reader follows the format's rules rather than trusting the header: the header is a
// JSON object of at most 100 MB with unique keys; each entry is an object with a string
// dtype, a shape of non-negative integers and data_offsets of exactly two integers; the
// tensors' byte ranges, sorted, tile the data section exactly (no hole, no overlap, nothing
// past the end), so a header length that is off by a byte or a swapped offset is an error,
// not shifted weights.
#include "sshsdp/ckpt/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "sshsdp/base/error.h"
#include "sshsdp/base/posix_file.h"
#include "sshsdp/layout/tensor_list.h"
#include "sshsdp/numerics/dtype.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors data and its header length are little-endian; this reader and writer "
              "copy them as they are");

namespace sshsdp {

namespace {

// IEEE binary16 (safetensors' F16) to fp32, exactly (subnormals, infinities and NaN included).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: man · 2^-24
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  const uint32_t bits =
      exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112u) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // the format's limit

// A JSON array of non-negative integers, or IoError naming `what`.
std::vector<uint64_t> Unsigneds(const nlohmann::json& j, const std::string& what) {
  SSHSDP_CHECK(j.is_array(), IoError, "{} must be an array of integers, got {}", what, j.dump());
  std::vector<uint64_t> out;
  for (const auto& v : j) {
    SSHSDP_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
                 IoError, "{} must hold integers >= 0, got {}", what, j.dump());
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

}  // namespace

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
  WriteFileAtomically(path, [&](OutFile& f) {
    const uint64_t n = h.size();
    f.Write(&n, 8);
    f.Write(h.data(), h.size());
    for (const auto& [name, t] : tensors) f.Write(t.data.data(), t.data.size() * 4);
  });
}

std::vector<SafetensorsEntry> ReadSafetensorsIndex(const std::string& path,
                                                   std::map<std::string, std::string>* metadata) {
  InFile f(path);  // IoError with the OS's reason; directories and FIFOs refused
  const uint64_t size = f.size();
  SSHSDP_CHECK(size >= 8, IoError, "{}: truncated: {} bytes, no safetensors header", path, size);
  uint64_t n = 0;
  f.ReadAt(&n, 8, 0);
  SSHSDP_CHECK(n <= size - 8 && n <= kMaxHeaderBytes, IoError,
               "{}: header length {} exceeds the file ({} bytes) or the format's 100 MB limit "
               "(not a safetensors file?)",
               path, n, size);
  std::string h(n, '\0');
  f.ReadAt(h.data(), n, 8);
  // Duplicate top-level names would silently keep the last one: refuse them while parsing.
  std::set<std::string> keys;
  std::string duplicate;
  const nlohmann::json::parser_callback_t unique_keys =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (depth == 1 && event == nlohmann::json::parse_event_t::key &&
            !keys.insert(parsed.get<std::string>()).second && duplicate.empty())
          duplicate = parsed.get<std::string>();
        return true;
      };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h, unique_keys);
  } catch (const std::exception& e) {
    throw IoError(fmt::format("{}: header is not valid JSON: {}", path, e.what()));
  }
  SSHSDP_CHECK(duplicate.empty(), IoError, "{}: tensor '{}' appears twice in the header", path,
               duplicate);
  SSHSDP_CHECK(header.is_object(), IoError, "{}: header must be a JSON object, got {}", path,
               header.type_name());
  const uint64_t data_begin = 8 + n, data_size = size - data_begin;

  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string what = fmt::format("{}: tensor '{}'", path, it.key());
    if (it.key() == "__metadata__") {
      SSHSDP_CHECK(it.value().is_object(), IoError, "{}: __metadata__ must be an object", path);
      for (auto m = it.value().begin(); m != it.value().end(); ++m)
        SSHSDP_CHECK(m.value().is_string(), IoError, "{}: __metadata__ '{}' must be a string", path,
                     m.key());
      if (metadata) *metadata = it.value().get<std::map<std::string, std::string>>();
      continue;
    }
    const auto& e = it.value();
    SSHSDP_CHECK(
        e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"),
        IoError, "{} must be an object with dtype, shape and data_offsets", what);
    SSHSDP_CHECK(e["dtype"].is_string(), IoError, "{}: dtype must be a string", what);
    Entry t{it.key(), e["dtype"].get<std::string>(), {}, 0, 0};
    SSHSDP_CHECK(t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16", IoError,
                 "{} has dtype {}; only F32, BF16 and F16 are supported", what, t.dtype);
    for (uint64_t d : Unsigneds(e["shape"], what + " shape")) {
      SSHSDP_CHECK(d < (uint64_t{1} << 40), IoError, "{}: shape dimension {} is too large", what,
                   d);
      t.shape.push_back(static_cast<int64_t>(d));
    }
    const std::vector<uint64_t> offsets = Unsigneds(e["data_offsets"], what + " data_offsets");
    SSHSDP_CHECK(offsets.size() == 2, IoError, "{}: data_offsets must be [begin, end], got {}",
                 what, e["data_offsets"].dump());
    t.begin = offsets[0];
    t.end = offsets[1];
    SSHSDP_CHECK(t.begin <= t.end && t.end <= data_size, IoError,
                 "{}: data [{}, {}) lies outside the {} data bytes (truncated file?)", what,
                 t.begin, t.end, data_size);
    const uint64_t es = t.dtype == "F32" ? 4 : 2;
    SSHSDP_CHECK(t.end - t.begin == NumElements(t.shape) * es, IoError,
                 "{} has {} bytes for shape {} of {}", what, t.end - t.begin, ShapeString(t.shape),
                 t.dtype);
    entries.push_back(std::move(t));
  }
  // The byte ranges tile the data section: sorted, each starts where the previous ended.
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  uint64_t at = 0;
  for (const Entry* e : order) {
    SSHSDP_CHECK(e->begin == at, IoError,
                 "{}: tensor '{}' data starts at byte {} of the data section, but the previous "
                 "tensor ends at {} ({} ranges; wrong header length or offsets?)",
                 path, e->name, e->begin, at, e->begin < at ? "overlapping" : "a gap between");
    at = e->end;
  }
  SSHSDP_CHECK(at == data_size, IoError,
               "{}: the tensors cover {} of the {} data bytes (wrong header length, or bytes "
               "appended to the file)",
               path, at, data_size);

  std::vector<SafetensorsEntry> out;
  for (const Entry& e : entries)
    out.push_back({e.name, e.dtype, e.shape, data_begin + e.begin, e.end - e.begin});
  return out;
}

void ReadSafetensorsElements(InFile& f, const SafetensorsEntry& e, uint64_t begin, uint64_t count,
                             float* out) {
  const uint64_t es = e.dtype == "F32" ? 4 : 2;
  SSHSDP_CHECK(begin + count <= e.bytes / es && begin + count >= begin, IoError,
               "{}: elements [{}, {}) of tensor '{}' lie outside its {}", f.path(), begin,
               begin + count, e.name, e.bytes / es);
  const uint64_t at = e.offset + begin * es;
  if (e.dtype == "F32") {
    f.ReadAt(out, count * 4, at);
    return;
  }
  std::vector<uint16_t> buf(count);
  f.ReadAt(buf.data(), count * 2, at);
  if (e.dtype == "BF16") {
    Bf16ToFloat(reinterpret_cast<const bf16*>(buf.data()), out, count);
    return;
  }
  for (uint64_t i = 0; i < count; ++i) out[i] = HalfToFloat(buf[i]);
}

std::map<std::string, SafeTensor> ReadSafetensors(const std::string& path,
                                                  std::map<std::string, std::string>* metadata) {
  const std::vector<SafetensorsEntry> index = ReadSafetensorsIndex(path, metadata);
  InFile f(path);
  std::map<std::string, SafeTensor> out;
  for (const SafetensorsEntry& e : index) {
    SafeTensor t{e.shape, std::vector<float>(NumElements(e.shape))};
    ReadSafetensorsElements(f, e, 0, t.data.size(), t.data.data());
    out.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace sshsdp
