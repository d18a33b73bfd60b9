// safetensors files: consolidated weights under stable per-parameter names, so runs can be
// compared from outside (PyTorch, numpy) and started from weights made elsewhere.
//
// Format (huggingface safetensors): 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32"|"BF16", "shape": [...], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {string: string}}, then the raw little-endian data. Writes go to a
// temporary file in the same directory, are flushed, then renamed over the target, so a
// crash never leaves a half-written file under the final name.
//
//   std::map<std::string, SafeTensor> t;
//   t["blocks.0.attn.q.h0"] = {{16, 64}, std::vector<float>(...)};
//   WriteSafetensors("weights.safetensors", t, {{"model", "gpt tiny"}});
//   auto back = ReadSafetensors("weights.safetensors");   // IoError names file and problem
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sshsdp/base/posix_file.h"

namespace sshsdp {

struct SafeTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;  // fp32 values (BF16 files are widened on read)
};

void WriteSafetensors(const std::string& path, const std::map<std::string, SafeTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// One tensor of a file: its dtype ("F32", "BF16", "F16"), shape, and the absolute byte offset
// and size of its data.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
// The header of a file, checked as ReadSafetensors checks it, without reading any tensor's
// data (a rank of a large model reads only the elements its shards need).
std::vector<SafetensorsEntry> ReadSafetensorsIndex(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);
// Elements [begin, begin + count) of e (row-major) as fp32, read from f (IoError outside it).
void ReadSafetensorsElements(InFile& f, const SafetensorsEntry& e, uint64_t begin, uint64_t count,
                             float* out);

// Reads F32, BF16 and F16 tensors (as fp32, exactly). Throws IoError naming the file and what is
// wrong (missing, truncated, bad header, unsupported dtype, offsets out of range or overlapping).
std::map<std::string, SafeTensor> ReadSafetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace sshsdp
