// Checkpoint save: rank files, the atomic save protocol (write, agree, manifest last,
// rename, prune), fault injection and the root lock (see checkpoint.h).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>

#include "sshsdp/base/error.h"
#include "sshsdp/base/posix_file.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/ckpt/checkpoint_internal.h"
#include "sshsdp/layout/shard_chain.h"

namespace sshsdp {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

using ckpt_internal::Agree;
using ckpt_internal::BuildManifest;
using ckpt_internal::Exchange;
using ckpt_internal::FieldLayoutOn;
using ckpt_internal::FileCrc;
using ckpt_internal::Hex;
using ckpt_internal::IsTemporary;
using ckpt_internal::kIoChunk;
using ckpt_internal::RankFileName;
using ckpt_internal::RankFilePlan;
using ckpt_internal::RecordElems;
using ckpt_internal::Report;
using ckpt_internal::ShardEntry;
using ckpt_internal::ShardsInFile;
using ckpt_internal::StepDirName;
using ckpt_internal::ThrowIfAny;
using ckpt_internal::Try;

Zero1Array ckpt_internal::FieldLayoutOn(const Engine::Zero1Field& f, int rank) {
  if (!f.data.packed) return {};  // dense: the same on every rank
  const ShardChain chain(f.layout->list, f.chain->topology(), rank);
  return Engine::StateLayout(*f.layout, *f.pieces, chain.Fragments(Shard::kZero1)).at(f.field);
}

std::vector<ckpt_internal::ShardEntry> ckpt_internal::ShardsInFile(
    const std::vector<Engine::Zero1Field>& fields, const std::vector<Zero1Array>& stored,
    int rank) {
  std::vector<ShardEntry> out;
  for (size_t k = 0; k < fields.size();) {  // the fields of one group are consecutive
    const Engine::Zero1Field& f0 = fields[k];
    size_t e = k;
    while (e < fields.size() && fields[e].group == f0.group) ++e;
    const ShardChain chain(f0.layout->list, f0.chain->topology(), rank);
    for (const Fragment& fr : chain.Fragments(Shard::kZero1)) {
      const FragmentSpan s = SpanOf(*f0.pieces, fr);  // dim-0 pieces: offset, padding cut
      if (s.length == 0) continue;
      const UpdateParam& u = f0.layout->update[s.update];
      ShardEntry entry{u.name, u.shape, f0.group, s.begin, s.end(), {}};
      for (size_t j = k; j < e; ++j) {
        const size_t at = stored[j].Index(s.shard_offset);
        if (at != Zero1Array::kNotStored) entry.at.emplace_back(j, at);
      }
      out.push_back(std::move(entry));
    }
    k = e;
  }
  return out;
}

namespace {

// ---- Fault injection (tests kill ranks at chosen moments of a save) --------------------

struct Fault {
  int rank = -1;
  std::string phase;
  int64_t step = -1;  // -1: any step
};

Fault ParseFault(const std::string& spec) {
  Fault f;
  if (spec.empty()) return f;
  const auto phases = CheckpointFaultPhases();
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  bool ok = parts.size() == 2 || parts.size() == 3;
  try {
    if (ok) f.rank = std::stoi(parts[0]);
    if (ok && parts.size() == 3) f.step = std::stoll(parts[2]);
  } catch (const std::exception&) {
    ok = false;
  }
  if (ok) f.phase = parts[1];
  SSHSDP_CHECK(ok && std::find(phases.begin(), phases.end(), f.phase) != phases.end(), ConfigError,
               "checkpoint fault '{}': expected RANK:PHASE[:STEP] with PHASE one of {}", spec,
               fmt::join(phases, ", "));
  return f;
}

void MaybeDie(const Fault& f, int rank, int64_t step, const char* phase) {
  if (f.rank != rank || f.phase != phase || (f.step >= 0 && f.step != step)) return;
  std::fprintf(stderr, "sshsdp: fault injection: killing rank %d at '%s' of the step %lld save\n",
               rank, phase, static_cast<long long>(step));
  std::fflush(stderr);
  std::fflush(stdout);
  std::raise(SIGKILL);
}

// ---- Rank file layout (a pure function of the fields, rank and step) ------------------

std::string RecordName(const Engine::Zero1Field& f) {
  return fmt::format("group{}.{}", f.group, f.field);
}

RankFilePlan PlanRankFile(const std::vector<Engine::Zero1Field>& fields, int rank, int64_t step,
                          const std::string& layout) {
  ojson h;
  h["__metadata__"] = {{"format", "sshsdp-checkpoint-shard"},
                       {"format_version", std::to_string(kCheckpointFormatVersion)},
                       {"rank", std::to_string(rank)},
                       {"step", std::to_string(step)},
                       {"layout", layout}};
  std::vector<Zero1Array> stored;  // how `rank` stores each field (packed: its runs)
  for (const auto& f : fields) stored.push_back(FieldLayoutOn(f, rank));
  RankFilePlan p;
  p.shards = ShardsInFile(fields, stored, rank);
  // [tensor, shape, group, begin, end, {field: element in its record}]
  ojson listed = ojson::array();
  for (const ShardEntry& s : p.shards) {
    ojson at = ojson::object();
    for (const auto& [j, i] : s.at) at[fields[j].field] = i;
    listed.push_back({s.tensor, s.shape, s.group, s.begin, s.end, at});
  }
  h["__metadata__"]["shards"] = listed.dump();  // safetensors metadata values are strings
  uint64_t off = 0;
  std::vector<uint64_t> rel;
  for (size_t j = 0; j < fields.size(); ++j) {
    const Engine::Zero1Field& f = fields[j];
    const size_t elems = RecordElems(stored[j], f.chunk);
    const uint64_t bytes = elems * 4;
    h[RecordName(f)] = {{"dtype", "F32"}, {"shape", {elems}}, {"data_offsets", {off, off + bytes}}};
    rel.push_back(off);
    off += bytes;
  }
  std::string text = h.dump();
  while ((text.size() + 8) % 8) text.push_back(' ');
  const uint64_t n = text.size();
  p.prefix.assign(reinterpret_cast<const char*>(&n), 8);
  p.prefix += text;
  for (uint64_t r : rel) p.offsets.push_back(p.prefix.size() + r);
  p.bytes = p.prefix.size() + off;
  return p;
}

// Writes this rank's file; returns (bytes, crc) after reading it back.
void WriteRankFile(const std::string& path, const std::vector<Engine::Zero1Field>& fields,
                   const RankFilePlan& plan, const Fault& fault, int rank, int64_t step,
                   Report& rep) {
  OutFile out(path);
  out.Write(plan.prefix.data(), plan.prefix.size());
  const uint64_t half = plan.bytes / 2;
  for (const auto& f : fields) {
    const char* p = reinterpret_cast<const char*>(f.data.data);
    size_t left = RecordElems(f.data, f.chunk) * 4;
    while (left > 0) {
      size_t n = std::min(left, kIoChunk);
      if (out.written() < half) n = std::min<size_t>(n, half - out.written());
      out.Write(p, n);
      p += n;
      left -= n;
      if (out.written() >= half) MaybeDie(fault, rank, step, "mid-file");
    }
  }
  SSHSDP_CHECK(out.written() == plan.bytes, IoError, "{}: wrote {} bytes, planned {}", path,
               out.written(), plan.bytes);
  out.SyncAndClose();
  // Read back what the filesystem holds: a silent write error shows up here, not at load.
  const uint32_t back = FileCrc(path, plan.bytes, nullptr);
  SSHSDP_CHECK(back == out.crc(), IoError,
               "{}: read-back CRC-32 {} differs from the written data's {} (storage error)", path,
               Hex(back), Hex(out.crc()));
  rep.bytes = plan.bytes;
  rep.crc = out.crc();
}

// Removes step_*.tmp leftovers of crashed saves and prunes.
void RemoveTemporaries(const std::string& root) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (IsTemporary(name) && e.is_directory()) fs::remove_all(e.path(), ec);
  }
}

// The checkpoint whose manifest records the lowest validation loss ("val_loss": one taken at
// its own step), "" when none does. A manifest that cannot be read is passed over.
std::string BestValidated(const std::vector<std::pair<int64_t, std::string>>& all) {
  std::string best;
  double lowest = std::numeric_limits<double>::infinity();
  for (const auto& [s, dir] : all) {
    try {
      const Manifest m = ReadManifest(dir);
      const auto it = m.meta.scalars.find("val_loss");
      if (it == m.meta.scalars.end() || !it->is_number()) continue;
      const double v = it->get<double>();
      if (v < lowest) lowest = v, best = dir;
    } catch (const Error&) {
    }
  }
  return best;
}

// Rank 0 after a successful save of `step`: keep the newest `keep` (the one just saved first,
// then older steps newest first, then checkpoints of later steps from an abandoned history),
// and the one with the best validation loss besides (a run that diverged later must not
// prune its best state away).
std::vector<std::string> Prune(const std::string& root, int64_t step, int keep,
                               const Fault& fault) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  auto all = ListCheckpoints(root);
  std::vector<std::pair<int64_t, std::string>> order;
  std::vector<std::pair<int64_t, std::string>> older, later;
  for (auto& c : all) {
    if (c.first == step)
      order.push_back(c);
    else
      (c.first < step ? older : later).push_back(c);
  }
  std::reverse(older.begin(), older.end());
  std::reverse(later.begin(), later.end());
  order.insert(order.end(), older.begin(), older.end());
  order.insert(order.end(), later.begin(), later.end());
  const std::string best = order.size() > static_cast<size_t>(keep) ? BestValidated(all) : "";
  for (size_t i = static_cast<size_t>(keep); i < order.size(); ++i) {
    if (order[i].second == best) continue;
    // Rename first (atomic): a crash mid-delete leaves a *.tmp that loads ignore.
    const std::string gone = order[i].second + ".pruned.tmp";
    std::error_code ec;
    fs::rename(order[i].second, gone, ec);
    SSHSDP_CHECK(!ec, IoError, "{}: cannot move away for pruning: {}", order[i].second,
                 ec.message());
    MaybeDie(fault, 0, step, "mid-prune");
    fs::remove_all(gone, ec);
    removed.push_back(order[i].second);
  }
  return removed;
}

// Moves the completed temporary directory to its final name (replacing an existing
// checkpoint of the same step atomically when the filesystem can exchange names).
void Publish(const std::string& tmp, const std::string& final_dir) {
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(tmp, ec);  // now holds the replaced checkpoint
      return;
    }
#endif
    const std::string old = final_dir + ".replaced.tmp";
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    SSHSDP_CHECK(!ec, IoError, "{}: cannot move the existing checkpoint away: {}", final_dir,
                 ec.message());
    fs::rename(tmp, final_dir, ec);
    SSHSDP_CHECK(!ec, IoError, "{}: cannot rename to {}: {}", tmp, final_dir, ec.message());
    fs::remove_all(old, ec);
    return;
  }
  fs::rename(tmp, final_dir, ec);
  SSHSDP_CHECK(!ec, IoError, "{}: cannot rename to {}: {}", tmp, final_dir, ec.message());
}

}  // namespace

std::vector<std::string> CheckpointFaultPhases() {
  return {"begin",         "mid-file",     "after-file", "before-manifest",
          "before-rename", "after-rename", "mid-prune"};
}

void PrepareCheckpointRoot(const std::string& root) {
  std::error_code ec;
  fs::create_directories(root, ec);  // several ranks at once: an existing directory is fine
  SSHSDP_CHECK(fs::is_directory(root), IoError, "{}: cannot create the checkpoint directory: {}",
               root, ec ? ec.message() : "a file of that name exists");
  SSHSDP_CHECK(::access(root.c_str(), W_OK | X_OK) == 0, IoError,
               "{}: checkpoint directory is not writable: {}", root, std::strerror(errno));
}

CheckpointRootLock::CheckpointRootLock(const std::string& root) {
  const std::string path = (fs::path(root) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  SSHSDP_CHECK(fd_ >= 0, IoError, "{}: cannot create the lock file: {}", path,
               std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {};
    [[maybe_unused]] ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    SSHSDP_CHECK(err != EWOULDBLOCK, IoError,
                 "{}: checkpoint directory is in use by another job ({}); give this job its own "
                 "--ckpt-dir, or wait for that job to end",
                 root, std::string(holder).empty() ? "holder unknown" : std::string(holder));
    throw IoError(fmt::format("{}: cannot lock {}: {}", root, path, std::strerror(err)));
  }
  char host[128] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = fmt::format("pid {} on {}", ::getpid(), host);
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] ssize_t n = ::pwrite(fd_, me.data(), me.size(), 0);
  }
}

CheckpointRootLock::~CheckpointRootLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

// ---- Save ----------------------------------------------------------------------------

SaveResult SaveCheckpoint(Engine& engine, Communicator& world, const std::string& root,
                          const CheckpointMeta& meta, const SaveOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rank = world.rank(), W = world.size();
  const Topology& topo = engine.topology();
  SSHSDP_CHECK(topo.world() == W, ConfigError,
               "SaveCheckpoint: the communicator has {} ranks, the engine's layout {}", W,
               topo.ToString());
  const Fault fault = ParseFault(options.fault);  // same on every rank: throws before collectives
  const int64_t step = engine.step();
  const std::string final_dir = (fs::path(root) / StepDirName(step)).string();
  const std::string tmp_dir = final_dir + ".tmp";
  // On a backend the state is copied to host mirrors (which may fail on one rank: inside the
  // agreement), released however the save ends.
  std::vector<Engine::Zero1Field> fields;
  struct ReleaseMirrors {
    Engine& e;
    ~ReleaseMirrors() { e.ReleaseZero1Mirrors(); }
  } release{engine};
  const std::string layout = topo.ToString();

  // 1. Rank 0 prepares an empty temporary directory (removing leftovers of crashed saves).
  Agree(world, Try([&](Report&) {
          fields = engine.Zero1Fields();
          if (rank != 0) return;
          std::error_code ec;
          fs::create_directories(root, ec);
          SSHSDP_CHECK(!ec && fs::is_directory(root), IoError,
                       "{}: cannot create the checkpoint directory: {}", root, ec.message());
          RemoveTemporaries(root);
          fs::create_directory(tmp_dir, ec);
          SSHSDP_CHECK(!ec, IoError, "{}: cannot create: {}", tmp_dir, ec.message());
          FsyncDir(root);
        }));
  MaybeDie(fault, rank, step, "begin");

  // 2. Every rank of HSDP replica 0 writes, fsyncs and reads back its ZeRO-1 chunk.
  const bool writer = topo.Coord(rank).d == 0;
  const Report mine = Try([&](Report& rep) {
    if (!writer) return;
    const RankFilePlan plan = PlanRankFile(fields, rank, step, layout);
    WriteRankFile((fs::path(tmp_dir) / RankFileName(rank)).string(), fields, plan, fault, rank,
                  step, rep);
    MaybeDie(fault, rank, step, "after-file");
  });
  const std::vector<Report> reports = Exchange(world, mine);
  ThrowIfAny(reports);

  // 3. Rank 0 checks every file, writes the manifest last, publishes, prunes.
  SaveResult res;
  res.dir = final_dir;
  std::vector<int> writers;
  for (int r = 0; r < W; ++r)
    if (topo.Coord(r).d == 0) writers.push_back(r);
  res.files = static_cast<int>(writers.size());
  for (int r : writers) res.bytes += reports[r].bytes;
  Report done = Try([&](Report& rep) {
    if (rank != 0) return;
    std::vector<RankFilePlan> plans;
    for (int r : writers) {
      plans.push_back(PlanRankFile(fields, r, step, layout));
      const std::string path = (fs::path(tmp_dir) / RankFileName(r)).string();
      std::error_code ec;
      const uint64_t size = fs::file_size(path, ec);
      SSHSDP_CHECK(!ec, IoError, "{}: missing after rank {} wrote it: {}", path, r, ec.message());
      SSHSDP_CHECK(size == plans.back().bytes && size == reports[r].bytes, IoError,
                   "{}: {} bytes on disk, rank {} wrote {}, the layout needs {}", path, size, r,
                   reports[r].bytes, plans.back().bytes);
    }
    MaybeDie(fault, rank, step, "before-manifest");
    const std::string text =
        SealManifest(BuildManifest(engine, fields, meta, writers, plans, reports));
    {
      OutFile mf((fs::path(tmp_dir) / kManifestFile).string());
      mf.Write(text.data(), text.size());
      mf.SyncAndClose();
      rep.bytes = text.size();
    }
    FsyncDir(tmp_dir);
    MaybeDie(fault, rank, step, "before-rename");
    Publish(tmp_dir, final_dir);
    FsyncDir(root);
    {  // root/latest names it (atomically replaced)
      const std::string latest = (fs::path(root) / kLatestFile).string();
      const std::string name = StepDirName(step) + "\n";
      OutFile lf(latest + ".tmp");
      lf.Write(name.data(), name.size());
      lf.SyncAndClose();
      RenameInto(latest + ".tmp", latest);
    }
    MaybeDie(fault, rank, step, "after-rename");
    try {
      res.pruned = Prune(root, step, options.keep, fault);
    } catch (const Error& e) {  // the new checkpoint is complete: warn, do not fail the run
      std::fprintf(stderr, "sshsdp: warning: saved %s but could not prune old checkpoints: %s\n",
                   final_dir.c_str(), e.what());
    }
  });
  const std::vector<Report> final_reports = Exchange(world, done);
  ThrowIfAny(final_reports);
  res.bytes += final_reports[0].bytes;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace sshsdp
