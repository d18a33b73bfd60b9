// Checkpoint internals shared by the checkpoint_*.cc files of sshsdp_ckpt: names, streamed
// CRCs, failure agreement across ranks, the rank-file plan and the manifest builder (see
// checkpoint.h). Not part of the installed API.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/engine/engine.h"

static_assert(std::endian::native == std::endian::little,
              "rank files hold little-endian fp32 fields, written and read as they are in memory");

namespace sshsdp::ckpt_internal {

inline constexpr size_t kIoChunk = size_t{4} << 20;

inline std::string StepDirName(int64_t step) { return fmt::format("step_{:08d}", step); }
inline std::string RankFileName(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }
inline std::string Hex(uint32_t v) { return fmt::format("0x{:08x}", v); }

// A step_*.tmp name: an incomplete save, or a checkpoint being replaced or pruned.
inline bool IsTemporary(const std::string& name) {
  return name.size() > 9 && name.compare(0, 5, "step_") == 0 &&
         name.compare(name.size() - 4, 4, ".tmp") == 0;
}

// CRC-32 of a whole file, streamed (checkpoint_verify.cc).
uint32_t FileCrc(const std::string& path, uint64_t bytes, uint64_t* bytes_read);

// ---- Failure agreement: every rank reports, every rank throws the same error ----------
// (checkpoint_agree.cc)

// One rank's report: a few numbers plus an error (kind 0: none).
struct Report {
  uint64_t bytes = 0;
  uint32_t crc = 0;
  int kind = 0;  // 0 ok, 1 IoError, 2 ConfigError, 3 LayoutError, 4 other
  std::string message;
};

template <typename F>
Report Try(F&& body) {
  Report r;
  try {
    body(r);
  } catch (const IoError& e) {
    r.kind = 1, r.message = e.what();
  } catch (const ConfigError& e) {
    r.kind = 2, r.message = e.what();
  } catch (const LayoutError& e) {
    r.kind = 3, r.message = e.what();
  } catch (const std::exception& e) {
    r.kind = 4, r.message = e.what();
  }
  return r;
}

// All-gathers every rank's report (a fixed-size record per rank). Collective.
std::vector<Report> Exchange(Communicator& world, const Report& mine);

// Throws, on every rank alike, the lowest failing rank's error.
void ThrowIfAny(const std::vector<Report>& reports);

// Exchange, then ThrowIfAny. Collective.
void Agree(Communicator& world, const Report& mine);

// ---- Rank file layout (a pure function of the fields, rank and step; checkpoint_save.cc) --

// How field f is stored on `rank` (dense over the chunk, or packed: Engine::StateLayout of
// that rank's fragments) and how many elements its record holds there.
Zero1Array FieldLayoutOn(const Engine::Zero1Field& f, int rank);
inline size_t RecordElems(const Zero1Array& a, const Range& chunk) {
  return a.packed ? a.stored() : chunk.size();
}

// One shard a rank file holds: elements [begin, end) of update parameter `tensor` (of
// `shape`), stored in
// the records of the fields listed in `at` as (index into the save's fields, element index
// inside that field's record). A field the tensor's optimizer does not keep is not listed.
struct ShardEntry {
  std::string tensor;
  std::vector<int64_t> shape;  // the whole tensor's
  int group = 0;
  uint64_t begin = 0, end = 0;
  std::vector<std::pair<size_t, uint64_t>> at;
};

// Every shard `rank`'s file holds, in record order: what the manifest lists for that file and
// what the file's own header lists (so a manifest whose entries were moved between same-shape
// tensors, or shifted, disagrees with the file it points into).
// stored[j] = FieldLayoutOn(fields[j], rank).
std::vector<ShardEntry> ShardsInFile(const std::vector<Engine::Zero1Field>& fields,
                                     const std::vector<Zero1Array>& stored, int rank);

struct RankFilePlan {
  std::string prefix;             // 8-byte header length + JSON header (8-byte aligned)
  std::vector<uint64_t> offsets;  // absolute byte offset of each field's record
  uint64_t bytes = 0;
  std::vector<ShardEntry> shards;  // ShardsInFile
};

// Rank 0: the manifest of a save whose files were reported as `reports`
// (checkpoint_manifest.cc).
nlohmann::ordered_json BuildManifest(Engine& engine, const std::vector<Engine::Zero1Field>& fields,
                                     const CheckpointMeta& meta, const std::vector<int>& writers,
                                     const std::vector<RankFilePlan>& plans,
                                     const std::vector<Report>& reports);

}  // namespace sshsdp::ckpt_internal
