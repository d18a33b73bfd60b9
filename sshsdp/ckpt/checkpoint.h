// Sharded checkpoints: every rank saves its ZeRO-1 state, any layout loads it back.
//
// Why: long runs die and move between cluster shapes. A checkpoint must (1) let the same run
// continue bit for bit, (2) load at any other (W; sw, sg, so) — including one process — with
// identical logical tensors, and (3) never be lost to a crash in the middle of a save.
//
// On disk, one directory per saved step under a root D:
//   D/step_00000100/manifest.json            written last, by rank 0
//   D/step_00000100/rank_00000.safetensors   one per rank of HSDP replica 0 (so files)
//   ...
// A rank file is a valid safetensors file: one 1-D F32 tensor "group<g>.<field>" per
// runtime group and ZeRO-1 field (main, m, v, ...) holding the rank's whole ZeRO-1 chunk of
// that group's flat buffer (tail padding included). The manifest is the source of truth for
// loading: format version, step, the saving layout, runtime dtype, model config, run
// options, named scalars (data position, seed; the place for future RNG / stochastic-
// rounding counters), per update parameter its shape and which file holds which element
// range at which byte offset for every field, and every file's size and CRC-32. Loading
// never recomputes the saving layout, so it works from any layout.
//
// A save is atomic: all ranks write into D/step_00000100.tmp, fsync, agree; rank 0 checks
// every file's size, writes and fsyncs the manifest, renames the directory to its final
// name, fsyncs D, and only then prunes old checkpoints (each renamed to *.tmp before it is
// deleted). A checkpoint directory without ".tmp" and with a manifest is complete; a crash
// at any moment leaves the previous one intact, and *.tmp leftovers are ignored by loads
// and removed by the next save.
//
// Errors name the file and the problem (IoError: missing, truncated, checksum mismatch,
// newer format; ConfigError: different model, another optimizer, missing optimizer state).
// Whatever can be checked from the manifest and file sizes is checked on every rank and
// agreed in one exchange before any other collective, together with the resolved step (ranks
// that see different file systems or different latest checkpoints fail alike); checksums
// (spread over ranks) and reads are followed by an agreement step, so no rank waits for a
// failed peer.
//
//   CheckpointMeta meta;  meta.model = {{"type", "gpt"}, {"d_model", 64}};
//   meta.scalars = {{"data_position", engine.step()}};
//   SaveResult s = SaveCheckpoint(engine, *world, "ckpt", meta, {.keep = 3});  // collective
//   LoadResult l = LoadCheckpoint(engine, *world, "ckpt", meta.model);  // latest; collective
//   Manifest m = ReadManifest(ResolveCheckpoint("ckpt"));       // single process, no MPI
//   VerifyCheckpointFiles(m);                                   // IoError on a bad file
//   auto weights = ReadConsolidated(m, "main");                 // name -> full fp32 tensor
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sshsdp/ckpt/safetensors.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/params/model.h"

namespace sshsdp {

// Manifests with a larger version are refused (IoError naming both versions). Version 2 adds
// "manifest_crc32", a CRC-32 of the manifest itself (its compact JSON without that key), so
// an edited offset or two swapped file entries are refused; version 1 manifests still load.
// Version 3 stores each optimizer's own state only: a tensor's shards hold "main" and the
// fields its optimizer keeps (Muon parameters have no "v"); older checkpoints still load.
// Version 4 rank files list their own shards (tensor, range, element in each field's record)
// in their safetensors metadata, and a load requires the manifest to agree with them.
inline constexpr int kCheckpointFormatVersion = 4;
inline constexpr const char* kManifestFile = "manifest.json";

// What a checkpoint holds besides the engine's ZeRO-1 arrays and step.
struct CheckpointMeta {
  // Model architecture: on load, every key must be equal (ConfigError lists what differs).
  nlohmann::json model = nlohmann::json::object();
  // How the run was launched (batch size, seed, lr...): differences are reported on load
  // (LoadResult::notes), never refused.
  nlohmann::json run = nlohmann::json::object();
  // Named state needed to continue bit for bit beyond the engine's arrays: data position,
  // seeds, and (when they exist) RNG / stochastic-rounding counters such as "sr_seed".
  // Stored verbatim; the caller reads back what it wrote.
  nlohmann::json scalars = nlohmann::json::object();
};

struct CheckpointLayout {
  int world = 1, ranks_per_node = 1, sw = 1, sg = 1, so = 1;
  std::string ToString() const;  // "W=4 nodes=1x4 sw=2 sg=2 so=4"
};

// Elements [begin, end) of one tensor in one rank file; offsets[field] is the byte offset
// in that file of element `begin` of the field's values (fp32, consecutive).
struct CheckpointShard {
  int file = 0;
  uint64_t begin = 0, end = 0;
  std::map<std::string, uint64_t> offsets;
};

struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  int group = 0;
  std::string optimizer;                // "adamw" | "muon" ("" in checkpoints before it)
  std::vector<CheckpointShard> shards;  // sorted by begin, partitioning [0, numel)
};

struct CheckpointFile {
  std::string name;  // file name inside the checkpoint directory
  int rank = 0;      // the saving rank
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct Manifest {
  std::string dir;  // the directory it was read from
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;
  CheckpointLayout layout;
  std::string runtime_dtype;        // of the saving run ("bf16", "fp32")
  std::vector<std::string> fields;  // ZeRO-1 fields, fp32 each: "main", "m", "v", ...
  CheckpointMeta meta;
  std::vector<CheckpointTensor> tensors;  // update parameters, model order
  std::vector<CheckpointFile> files;

  std::string ManifestPath() const;
  std::string FilePath(int file) const;
  uint64_t DataBytes() const;  // sum of the rank files
};

// Test-only fault injection: "RANK:PHASE[:STEP]" kills rank RANK with SIGKILL when its save
// (of step STEP, or of any step) reaches PHASE. Phases, in save order:
//   begin           after the temporary directory exists
//   mid-file        after writing half of the rank's file (no fsync)
//   after-file      after the rank's file is written and fsynced
//   before-manifest rank 0: every file verified, manifest not written
//   before-rename   rank 0: manifest written and fsynced, directory not renamed
//   after-rename    rank 0: checkpoint complete, old checkpoints not pruned
//   mid-prune       rank 0: after renaming the first pruned checkpoint away
std::vector<std::string> CheckpointFaultPhases();

struct SaveOptions {
  int keep = 0;       // keep the last `keep` complete checkpoints in the root (0: all)
  std::string fault;  // see CheckpointFaultPhases
};

struct SaveResult {
  std::string dir;     // final checkpoint directory
  uint64_t bytes = 0;  // rank files + manifest
  int files = 0;
  double seconds = 0;               // wall time of the whole collective save, as seen by this rank
  std::vector<std::string> pruned;  // directories removed (rank 0)
};

// Creates `root` if needed and checks that it is a writable directory (IoError naming it).
// Call it at startup on every rank, so a bad checkpoint directory fails before training
// rather than at the first save.
void PrepareCheckpointRoot(const std::string& root);

// Exclusive hold of a checkpoint root by one job, for as long as the object lives (rank 0
// takes it at start-up): root/.lock, flock'ed, holding the owner's pid and host. A second job
// on the same root gets IoError naming the holder, before it trains or writes anything.
class CheckpointRootLock {
 public:
  explicit CheckpointRootLock(const std::string& root);
  ~CheckpointRootLock();
  CheckpointRootLock(const CheckpointRootLock&) = delete;
  CheckpointRootLock& operator=(const CheckpointRootLock&) = delete;

 private:
  int fd_ = -1;
};

// root/latest: the step directory of the last completed save, replaced atomically after each
// one. `--resume ROOT` continues from it, so after a roll-back into the same root the
// abandoned run's higher-numbered checkpoints are not picked up.
inline constexpr const char* kLatestFile = "latest";

// Saves the engine's ZeRO-1 state at engine.step() into root/step_<step>. Collective over
// `world` (the engine's world). Throws on every rank if any rank fails (the previous
// checkpoints stay as they were). An existing checkpoint of the same step is replaced.
SaveResult SaveCheckpoint(Engine& engine, Communicator& world, const std::string& root,
                          const CheckpointMeta& meta, const SaveOptions& options = {});

struct LoadResult {
  Manifest manifest;
  uint64_t bytes_read = 0;  // by this rank, checksums included
  double seconds = 0;
  std::vector<std::string> notes;  // resharding, run-option and dtype differences
};

// Loads `path` (a checkpoint root: its latest complete checkpoint; or one step directory)
// into the engine at the engine's own layout, then calls engine.RestoreState(step).
// `model` must equal the manifest's model config. Collective over `world`.
LoadResult LoadCheckpoint(Engine& engine, Communicator& world, const std::string& path,
                          const nlohmann::json& model);

// ---- Single process (no MPI): inspection, verification, export -------------------------

// Complete checkpoints under `root` (step_<digits> directories with a manifest), by step.
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& root);
// A step directory (has a manifest) or a root: the checkpoint root/latest names, or (roots
// written before that record) the highest complete step. IoError naming the path when there
// is none, or when latest names a checkpoint that is gone.
std::string ResolveCheckpoint(const std::string& path);
// The manifest text to write: `manifest` with its "manifest_crc32" added.
std::string SealManifest(const nlohmann::ordered_json& manifest);

// Parses and validates a manifest (structure, ranges, offsets within file sizes, format
// version). IoError naming the manifest and the problem.
Manifest ReadManifest(const std::string& dir);
// "" when file `i` exists with the manifest's size, else the problem (naming the file).
std::string CheckFileSize(const Manifest& m, int file);
// "" when file `i` has the manifest's size and CRC-32, else the problem. Adds bytes read.
std::string CheckFileContents(const Manifest& m, int file, uint64_t* bytes_read = nullptr);
// Checks every file; throws IoError with the first problem.
void VerifyCheckpointFiles(const Manifest& m);
// Full tensors of one field (e.g. "main": the consolidated fp32 weights), by name; tensors
// whose optimizer keeps no such field (Muon parameters: no "v") are left out.
std::map<std::string, SafeTensor> ReadConsolidated(const Manifest& m, const std::string& field);
// Human-readable summary (what `sshsdp ckpt inspect` prints before verifying).
std::string DescribeCheckpoint(const Manifest& m);

// "key A (checkpoint) vs B (this run)" for every top-level key whose value differs between
// two JSON objects (absent keys included), in key order.
std::vector<std::string> JsonDifferences(const nlohmann::json& saved, const nlohmann::json& now);

// ---- Tensor names and shapes ------------------------------------------------------------

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
// Update parameters of a model (names and shapes), model order.
std::vector<TensorSpec> ModelTensors(const Model& model);
// "" when `have` (from `source`) has exactly the names and shapes of `want`, else a
// message listing the number of mismatches and the first `max_listed` of them.
std::string DescribeTensorMismatch(const std::vector<TensorSpec>& want,
                                   const std::vector<TensorSpec>& have, const std::string& source,
                                   int max_listed = 5);
// Reads initial weights from a safetensors file (F32 or BF16) and checks they are exactly
// the model's update parameters: ConfigError naming the file and the first mismatches.
std::map<std::string, std::vector<float>> ReadInitWeights(const std::string& path,
                                                          const std::vector<TensorSpec>& want);

}  // namespace sshsdp
