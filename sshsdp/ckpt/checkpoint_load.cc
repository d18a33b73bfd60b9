// Checkpoint load: agreed checks, then every rank reads its ZeRO-1 chunk from whichever
// files hold it (resharding), and single-process consolidation (see checkpoint.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "sshsdp/base/error.h"
#include "sshsdp/base/posix_file.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/checkpoint_internal.h"
#include "sshsdp/layout/shard_chain.h"
#include "sshsdp/layout/tensor_list.h"

namespace sshsdp {

using json = nlohmann::json;

using ckpt_internal::Agree;
using ckpt_internal::Exchange;
using ckpt_internal::Report;
using ckpt_internal::ThrowIfAny;
using ckpt_internal::Try;

namespace {

// A save lists the update parameters in the model's order, each with its runtime group: the
// same names in another order, or in another group, mean an edited manifest (two same-shape
// tensors' names swapped would load each one's values into the other). Refused by name.
void CheckModelOrder(const Manifest& m, const std::vector<UpdateParam>& params) {
  for (size_t i = 0; i < params.size() && i < m.tensors.size(); ++i) {
    const CheckpointTensor& t = m.tensors[i];
    SSHSDP_CHECK(t.name == params[i].name, IoError,
                 "{}: tensor {} is '{}' in the manifest but '{}' in the model's order (a save "
                 "lists them in model order): the manifest was edited, or saved by a build that "
                 "ordered this model differently; use an unedited checkpoint of this build",
                 m.ManifestPath(), i, t.name, params[i].name);
    SSHSDP_CHECK(t.group == params[i].group, IoError,
                 "{}: tensor '{}' is in runtime group {} in the manifest but {} in the model: the "
                 "manifest was edited, or saved by a build that grouped this model differently",
                 m.ManifestPath(), t.name, t.group, params[i].group);
  }
}

std::string JsonValue(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

// ---- Load ----------------------------------------------------------------------------

LoadResult LoadCheckpoint(Engine& engine, Communicator& world, const std::string& path,
                          const nlohmann::json& model) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rank = world.rank(), W = world.size();
  LoadResult res;

  // Everything decidable from the manifest and file sizes, agreed before any other collective:
  // a rank that sees another file system (node-local disk, a stale NFS cache, a root whose
  // latest checkpoint changed between ranks) fails every rank alike instead of leaving the
  // others waiting, and all ranks must have resolved the same step.
  const Manifest& m = res.manifest;
  std::set<std::string> used;
  std::vector<Engine::Zero1Field> fields;
  struct ReleaseMirrors {  // a backend's host copies of its state, however the load ends
    Engine& e;
    ~ReleaseMirrors() { e.ReleaseZero1Mirrors(); }
  } release{engine};
  const std::vector<Report> agreed = Exchange(
      world, Try([&](Report& rep) {
        fields = engine.Zero1Fields(/*read_state=*/false);  // a backend's host mirrors
        res.manifest = ReadManifest(ResolveCheckpoint(path));
        const std::vector<std::string> diffs = JsonDifferences(m.meta.model, model);
        SSHSDP_CHECK(diffs.empty(), ConfigError,
                     "{}: the checkpoint holds a different model: {}; build the model it was saved "
                     "with",
                     m.ManifestPath(), fmt::join(diffs, ", "));
        std::vector<TensorSpec> want, have;
        for (const UpdateParam& u : engine.UpdateParams()) want.push_back({u.name, u.shape});
        for (const CheckpointTensor& t : m.tensors) have.push_back({t.name, t.shape});
        const std::string mismatch = DescribeTensorMismatch(want, have, m.ManifestPath());
        SSHSDP_CHECK(mismatch.empty(), ConfigError, "{}", mismatch);
        CheckModelOrder(m, engine.UpdateParams());
        // The same fields (m, v) mean different states under AdamW and Muon: a parameter must be
        // resumed by the optimizer that saved it.
        std::map<std::string, std::string> saved_optimizer;
        for (const CheckpointTensor& t : m.tensors) saved_optimizer[t.name] = t.optimizer;
        std::vector<std::string> moved;
        for (const UpdateParam& u : engine.UpdateParams()) {
          const std::string& saved = saved_optimizer[u.name];
          if (!saved.empty() && saved != OptimizerName(u.optimizer))
            moved.push_back(fmt::format("'{}' was updated by {} in the checkpoint, by {} here",
                                        u.name, saved, OptimizerName(u.optimizer)));
        }
        SSHSDP_CHECK(
            moved.empty(), ConfigError,
            "{}: {} parameter(s) changed optimizer, e.g. {}; resume with the optimizer options "
            "the checkpoint was saved with (--optimizer, --muon-unit and unit overrides)",
            m.ManifestPath(), moved.size(), moved.empty() ? "" : moved.front());
        for (const auto& f : fields) {
          SSHSDP_CHECK(std::find(m.fields.begin(), m.fields.end(), f.field) != m.fields.end(),
                       ConfigError,
                       "{}: the checkpoint has no '{}' state (it holds {}); it was saved with a "
                       "different optimizer",
                       m.ManifestPath(), f.field, fmt::join(m.fields, ", "));
          used.insert(f.field);
        }
        for (int i = 0; i < static_cast<int>(m.files.size()); ++i) {
          const std::string e = CheckFileSize(m, i);
          SSHSDP_CHECK(e.empty(), IoError, "{}", e);
        }
        rep.bytes = static_cast<uint64_t>(m.step);
      }));
  ThrowIfAny(agreed);
  for (int r = 1; r < W; ++r)
    SSHSDP_CHECK(agreed[r].bytes == agreed[0].bytes, IoError,
                 "{}: ranks resolved different checkpoints (rank 0: step {}, rank {}: step {}); "
                 "pass one step directory, not a root another job is still saving into",
                 path, agreed[0].bytes, r, agreed[r].bytes);

  // Checksums: file i verified by rank i mod W; then every rank knows every file is good.
  Agree(world, Try([&](Report&) {
          for (int i = rank; i < static_cast<int>(m.files.size()); i += W) {
            const std::string e = CheckFileContents(m, i, &res.bytes_read);
            SSHSDP_CHECK(e.empty(), IoError, "{}", e);
          }
        }));

  // Each ZeRO-1 fragment of this rank, from whichever files hold its elements.
  Agree(world, Try([&](Report&) {
          std::map<std::string, const CheckpointTensor*> by_name;
          for (const auto& t : m.tensors) by_name[t.name] = &t;
          std::vector<std::unique_ptr<InFile>> files(m.files.size());
          for (const Engine::Zero1Field& f : fields) {
            // Tail padding stays zero; a packed field holds only its optimizer's elements.
            const size_t bytes = (f.data.packed ? f.data.stored() : f.chunk.size()) * 4;
            if (bytes > 0) std::memset(f.data.data, 0, bytes);  // an empty field may have no data
            for (const Fragment& fr : f.chain->Fragments(Shard::kZero1)) {
              const FragmentSpan sp = SpanOf(*f.pieces, fr);  // dim-0 padding stays zero
              if (sp.length == 0) continue;
              const CheckpointTensor& t = *by_name.at(f.layout->update[sp.update].name);
              auto it =
                  std::upper_bound(t.shards.begin(), t.shards.end(), sp.begin,
                                   [](uint64_t v, const CheckpointShard& s) { return v < s.end; });
              float* dst = f.data.At(sp.shard_offset);
              if (dst == nullptr) continue;  // this parameter's optimizer keeps no such field
              uint64_t covered = 0;
              for (; it != t.shards.end() && it->begin < sp.end(); ++it) {
                const uint64_t lo = std::max<uint64_t>(it->begin, sp.begin);
                const uint64_t hi = std::min<uint64_t>(it->end, sp.end());
                auto off = it->offsets.find(f.field);
                SSHSDP_CHECK(off != it->offsets.end(), IoError,
                             "{}: tensor '{}' has no '{}' state in the checkpoint (saved by {})",
                             m.ManifestPath(), t.name, f.field,
                             t.optimizer.empty() ? "another optimizer" : t.optimizer);
                if (!files[it->file])
                  files[it->file] = std::make_unique<InFile>(m.FilePath(it->file));
                files[it->file]->ReadAt(dst + (lo - sp.begin), (hi - lo) * 4,
                                        off->second + (lo - it->begin) * 4);
                covered += hi - lo;
                res.bytes_read += (hi - lo) * 4;
              }
              SSHSDP_CHECK(covered == sp.length, IoError,
                           "{}: tensor '{}' elements [{}, {}) are not fully in the checkpoint",
                           m.ManifestPath(), t.name, sp.begin, sp.end());
              // train saves only finite states: one here was written by other means.
              const float* bad =
                  std::find_if(dst, dst + sp.length, [](float v) { return !std::isfinite(v); });
              if (bad != dst + sp.length) {
                const uint64_t e = sp.begin + static_cast<uint64_t>(bad - dst);
                const auto in = std::upper_bound(
                    t.shards.begin(), t.shards.end(), e,
                    [](uint64_t v, const CheckpointShard& s) { return v < s.end; });
                throw IoError(fmt::format(
                    "{}: tensor '{}' field '{}' holds {} at element {}, which train never saves "
                    "(the file was edited or corrupted before its checksum was recomputed); use "
                    "another checkpoint",
                    m.FilePath(in->file), t.name, f.field, *bad, e));
              }
            }
          }
          engine.UploadZero1Mirrors();  // on a backend: the state into its memory, agreed
        }));
  engine.RestoreState(m.step);  // collective: G + outer all-gather

  const Topology& topo = engine.topology();
  const CheckpointLayout now{topo.world(), topo.ranks_per_node(), topo.sw(), topo.sg(), topo.so()};
  if (now.ToString() != m.layout.ToString())
    res.notes.push_back(
        fmt::format("resharded from {} to {}", m.layout.ToString(), now.ToString()));
  const std::string dt(DTypeName(engine.config().weight_dtype));
  if (dt != m.runtime_dtype)
    res.notes.push_back(fmt::format("runtime weights {} (checkpoint) -> {}", m.runtime_dtype, dt));
  for (const std::string& f : m.fields)
    if (!used.count(f))
      res.notes.push_back(fmt::format("checkpoint state '{}' is not used by this run", f));
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

std::vector<std::string> JsonDifferences(const nlohmann::json& saved, const nlohmann::json& now) {
  std::set<std::string> keys;
  for (const json* j : {&saved, &now})
    if (j->is_object())
      for (auto it = j->begin(); it != j->end(); ++it) keys.insert(it.key());
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    const bool a = saved.is_object() && saved.contains(k), b = now.is_object() && now.contains(k);
    if (a && b && saved[k] == now[k]) continue;
    out.push_back(fmt::format("{} {} (checkpoint) vs {} (this run)", k,
                              a ? JsonValue(saved[k]) : "absent",
                              b ? JsonValue(now[k]) : "absent"));
  }
  return out;
}

std::map<std::string, SafeTensor> ReadConsolidated(const Manifest& m, const std::string& field) {
  SSHSDP_CHECK(std::find(m.fields.begin(), m.fields.end(), field) != m.fields.end(), ConfigError,
               "{}: no field '{}' (it holds {})", m.ManifestPath(), field,
               fmt::join(m.fields, ", "));
  std::vector<std::unique_ptr<InFile>> files(m.files.size());
  std::map<std::string, SafeTensor> out;
  for (const CheckpointTensor& t : m.tensors) {
    // A tensor whose optimizer keeps no such field (Muon: no "v") is left out.
    if (std::any_of(t.shards.begin(), t.shards.end(),
                    [&](const CheckpointShard& s) { return !s.offsets.count(field); }))
      continue;
    SafeTensor st{t.shape, std::vector<float>(NumElements(t.shape))};
    for (const CheckpointShard& s : t.shards) {
      if (!files[s.file]) files[s.file] = std::make_unique<InFile>(m.FilePath(s.file));
      files[s.file]->ReadAt(st.data.data() + s.begin, (s.end - s.begin) * 4, s.offsets.at(field));
    }
    out.emplace(t.name, std::move(st));
  }
  return out;
}

}  // namespace sshsdp
