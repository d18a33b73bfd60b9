// Sharded checkpoints (see checkpoint.h): rank files, manifest, atomic save protocol,
// resharding load, verification and consolidation.
#include "sshsdp/ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/crc32.h"
#include "sshsdp/ckpt/posix_file.h"
#include "sshsdp/layout/shard_chain.h"

static_assert(std::endian::native == std::endian::little,
              "rank files hold little-endian fp32 fields, written and read as they are in memory");

namespace sshsdp {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kFormatName = "sshsdp-checkpoint";
constexpr size_t kIoChunk = size_t{4} << 20;

std::string StepDirName(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string RankFileName(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }
std::string Hex(uint32_t v) { return fmt::format("0x{:08x}", v); }

// A step_<digits> name (complete checkpoint) -> its step; -1 otherwise.
int64_t ParseStepDir(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 56)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

bool IsTemporary(const std::string& name) {
  return name.size() > 9 && name.compare(0, 5, "step_") == 0 &&
         name.compare(name.size() - 4, 4, ".tmp") == 0;
}

// CRC-32 of a whole file, streamed.
uint32_t FileCrc(const std::string& path, uint64_t bytes, uint64_t* bytes_read) {
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

// ---- Failure agreement: every rank reports, every rank throws the same error ----------

// One rank's report: a few numbers plus an error (kind 0: none).
struct Report {
  uint64_t bytes = 0;
  uint32_t crc = 0;
  int kind = 0;  // 0 ok, 1 IoError, 2 ConfigError, 3 LayoutError, 4 other
  std::string message;
};
constexpr size_t kReportBytes = 1024;

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
std::vector<Report> Exchange(Communicator& world, const Report& mine) {
  std::vector<char> send(kReportBytes, 0), recv(kReportBytes * world.size());
  std::memcpy(send.data(), &mine.bytes, 8);
  std::memcpy(send.data() + 8, &mine.crc, 4);
  const int32_t kind = mine.kind;
  std::memcpy(send.data() + 12, &kind, 4);
  std::memcpy(send.data() + 16, mine.message.data(),
              std::min(mine.message.size(), kReportBytes - 17));
  world.AllGather(send.data(), recv.data(), kReportBytes, DType::kE4M3);  // raw bytes
  std::vector<Report> out(world.size());
  for (int r = 0; r < world.size(); ++r) {
    const char* p = recv.data() + r * kReportBytes;
    int32_t k = 0;
    std::memcpy(&out[r].bytes, p, 8);
    std::memcpy(&out[r].crc, p + 8, 4);
    std::memcpy(&k, p + 12, 4);
    out[r].kind = k;
    out[r].message = std::string(p + 16, strnlen(p + 16, kReportBytes - 16));
  }
  return out;
}

// Throws, on every rank alike, the lowest failing rank's error.
void ThrowIfAny(const std::vector<Report>& reports) {
  for (size_t r = 0; r < reports.size(); ++r) {
    const Report& e = reports[r];
    if (e.kind == 0) continue;
    const std::string msg =
        reports.size() > 1 ? fmt::format("{} (reported by rank {})", e.message, r) : e.message;
    switch (e.kind) {
      case 1:
        throw IoError(msg);
      case 2:
        throw ConfigError(msg);
      case 3:
        throw LayoutError(msg);
      default:
        throw Error(msg);
    }
  }
}

void Agree(Communicator& world, const Report& mine) { ThrowIfAny(Exchange(world, mine)); }

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

struct RankFilePlan {
  std::string prefix;             // 8-byte header length + JSON header (8-byte aligned)
  std::vector<uint64_t> offsets;  // absolute byte offset of each field's record
  uint64_t bytes = 0;
};

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
  uint64_t off = 0;
  std::vector<uint64_t> rel;
  for (const auto& f : fields) {
    const uint64_t bytes = f.chunk.size() * 4;
    h[RecordName(f)] = {
        {"dtype", "F32"}, {"shape", {f.chunk.size()}}, {"data_offsets", {off, off + bytes}}};
    rel.push_back(off);
    off += bytes;
  }
  std::string text = h.dump();
  while ((text.size() + 8) % 8) text.push_back(' ');
  RankFilePlan p;
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
    const char* p = reinterpret_cast<const char*>(f.data);
    size_t left = f.chunk.size() * 4;
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

// ---- Manifest ------------------------------------------------------------------------

ojson LayoutJson(const Topology& t) {
  return {{"world", t.world()},
          {"ranks_per_node", t.ranks_per_node()},
          {"sw", t.sw()},
          {"sg", t.sg()},
          {"so", t.so()}};
}

// Rank 0: the manifest of a save whose files were reported as `reports`.
ojson BuildManifest(Engine& engine, const std::vector<Engine::Zero1Field>& fields,
                    const CheckpointMeta& meta, const std::vector<int>& writers,
                    const std::vector<RankFilePlan>& plans, const std::vector<Report>& reports) {
  const Topology& topo = engine.topology();
  ojson m;
  m["format"] = kFormatName;
  m["format_version"] = kCheckpointFormatVersion;
  m["step"] = engine.step();
  m["layout"] = LayoutJson(topo);
  m["runtime_dtype"] = std::string(DTypeName(engine.config().weight_dtype));
  m["state_dtype"] = "F32";
  std::vector<std::string> names;
  for (const auto& f : fields)
    if (std::find(names.begin(), names.end(), f.field) == names.end()) names.push_back(f.field);
  m["fields"] = names;
  m["model"] = meta.model;
  m["run"] = meta.run;
  m["scalars"] = meta.scalars;
  ojson files = ojson::array();
  for (size_t i = 0; i < writers.size(); ++i) {
    const int r = writers[i];
    files.push_back({{"name", RankFileName(r)},
                     {"rank", r},
                     {"bytes", reports[r].bytes},
                     {"crc32", Hex(reports[r].crc)}});
  }
  m["files"] = files;

  // Shards: for every writer, every group, every fragment of its ZeRO-1 chunk.
  std::map<std::string, ojson> shards;  // tensor -> array
  for (size_t i = 0; i < writers.size(); ++i) {
    const int r = writers[i];
    for (size_t k = 0; k < fields.size();) {
      const Engine::Zero1Field& f0 = fields[k];
      size_t e = k;
      while (e < fields.size() && fields[e].group == f0.group) ++e;
      ShardChain chain(f0.layout->list, f0.chain->topology(), r);
      for (const Fragment& fr : chain.Fragments(Shard::kZero1)) {
        const FragmentSpan s = SpanOf(*f0.pieces, fr);  // dim-0 pieces: offset, padding cut
        if (s.length == 0) continue;
        ojson offs;
        for (size_t j = k; j < e; ++j)
          offs[fields[j].field] = plans[i].offsets[j] + s.shard_offset * 4;
        shards[f0.layout->update[s.update].name].push_back(
            {{"file", i}, {"range", {s.begin, s.end()}}, {"offsets", offs}});
      }
      k = e;
    }
  }
  ojson tensors = ojson::array();
  for (const UpdateParam& u : engine.UpdateParams()) {
    ojson s = shards[u.name];
    std::vector<ojson> v(s.begin(), s.end());
    std::sort(v.begin(), v.end(), [](const ojson& a, const ojson& b) {
      return a["range"][0].get<uint64_t>() < b["range"][0].get<uint64_t>();
    });
    tensors.push_back({{"name", u.name},
                       {"shape", u.shape},
                       {"group", u.group},
                       {"optimizer", OptimizerName(u.optimizer)},
                       {"shards", v}});
  }
  m["tensors"] = tensors;
  return m;
}

template <typename T>
T Get(const json& j, const char* key, const std::string& where) {
  SSHSDP_CHECK(j.is_object() && j.contains(key), IoError, "{}: missing '{}'", where, key);
  try {
    return j.at(key).get<T>();
  } catch (const std::exception& e) {
    throw IoError(fmt::format("{}: '{}' is malformed: {}", where, key, e.what()));
  }
}

std::string JsonValue(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Removes step_*.tmp leftovers of crashed saves and prunes.
void RemoveTemporaries(const std::string& root) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (IsTemporary(name) && e.is_directory()) fs::remove_all(e.path(), ec);
  }
}

// Rank 0 after a successful save of `step`: keep the newest `keep` (the one just saved first,
// then older steps newest first, then checkpoints of later steps from an abandoned history).
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
  for (size_t i = static_cast<size_t>(keep); i < order.size(); ++i) {
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

std::string CheckpointLayout::ToString() const {
  return fmt::format("W={} nodes={}x{} sw={} sg={} so={}", world,
                     world / std::max(1, ranks_per_node), ranks_per_node, sw, sg, so);
}

std::string Manifest::ManifestPath() const { return (fs::path(dir) / kManifestFile).string(); }
std::string Manifest::FilePath(int file) const {
  return (fs::path(dir) / files.at(file).name).string();
}
const CheckpointTensor* Manifest::Find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}
uint64_t Manifest::DataBytes() const {
  uint64_t b = 0;
  for (const auto& f : files) b += f.bytes;
  return b;
}

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
  const std::vector<Engine::Zero1Field> fields = engine.Zero1Fields();
  const std::string layout = topo.ToString();

  // 1. Rank 0 prepares an empty temporary directory (removing leftovers of crashed saves).
  Agree(world, Try([&](Report&) {
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

// ---- Listing and manifest ------------------------------------------------------------

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t step = ParseStepDir(e.path().filename().string());
    if (step < 0 || !e.is_directory()) continue;
    if (fs::exists(e.path() / kManifestFile)) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string ResolveCheckpoint(const std::string& path) {
  std::error_code ec;
  SSHSDP_CHECK(fs::exists(path, ec), IoError, "{}: no such checkpoint directory", path);
  if (fs::exists(fs::path(path) / kManifestFile, ec)) return path;
  SSHSDP_CHECK(fs::is_directory(path, ec), IoError, "{}: not a checkpoint directory", path);
  const fs::path latest = fs::path(path) / kLatestFile;
  if (fs::exists(latest, ec)) {
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    SSHSDP_CHECK(ParseStepDir(name) >= 0, IoError,
                 "{}: does not name a step directory (got '{}'); pass a step directory",
                 latest.string(), name);
    const fs::path dir = fs::path(path) / name;
    SSHSDP_CHECK(fs::exists(dir / kManifestFile, ec), IoError,
                 "{}: names {}, which is not a complete checkpoint (deleted?); pass one of the "
                 "step directories instead",
                 latest.string(), dir.string());
    return dir.string();
  }
  auto all = ListCheckpoints(path);
  if (!all.empty()) return all.back().second;
  int tmp = 0;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (IsTemporary(e.path().filename().string())) ++tmp;
  throw IoError(fmt::format(
      "{}: no complete checkpoint here (expected step_<N>/{} or a {} in this directory){}", path,
      kManifestFile, kManifestFile,
      tmp ? fmt::format("; {} incomplete save(s) (*.tmp) ignored", tmp) : std::string()));
}

std::string SealManifest(const ojson& manifest) {
  ojson m = manifest;
  m.erase("manifest_crc32");
  const std::string body = m.dump();
  m["manifest_crc32"] = Hex(Crc32(body.data(), body.size()));
  return m.dump(1);
}

namespace {

// The manifest's own CRC-32 (format version >= 2): over the compact JSON of the manifest,
// in file order, without "manifest_crc32".
void CheckManifestCrc(const std::string& text, const std::string& where) {
  ojson o = ojson::parse(text);
  SSHSDP_CHECK(o.contains("manifest_crc32") && o["manifest_crc32"].is_string(), IoError,
               "{}: 'manifest_crc32' is missing (the manifest was edited or is incomplete)", where);
  const std::string stored = o["manifest_crc32"].get<std::string>();
  o.erase("manifest_crc32");
  const std::string body = o.dump();
  const std::string actual = Hex(Crc32(body.data(), body.size()));
  SSHSDP_CHECK(stored == actual, IoError,
               "{}: manifest checksum mismatch (stored {}, computed {}): the manifest was "
               "edited or corrupted after it was written; restore it or use another checkpoint",
               where, stored, actual);
}

Manifest ParseManifest(const std::string& dir);

}  // namespace

Manifest ReadManifest(const std::string& dir) {
  // Any JSON type error (a number where a string belongs, ...) names the manifest.
  try {
    return ParseManifest(dir);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("{}: malformed manifest: {}",
                              (fs::path(dir) / kManifestFile).string(), e.what()));
  }
}

namespace {

Manifest ParseManifest(const std::string& dir) {
  Manifest m;
  m.dir = dir;
  const std::string where = m.ManifestPath();
  SSHSDP_CHECK(fs::is_regular_file(where), IoError, "{}: cannot open: {}", where,
               !fs::exists(dir)     ? "no such directory"
               : !fs::exists(where) ? "missing (an incomplete save?)"
                                    : "not a regular file");
  std::ifstream in(where, std::ios::binary);
  SSHSDP_CHECK(in.good(), IoError, "{}: cannot open: {}", where, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw IoError(fmt::format("{}: not valid JSON (corrupt or truncated): {}", where, e.what()));
  }
  SSHSDP_CHECK(j.is_object() && j.contains("format") && j["format"].is_string() &&
                   j["format"].get<std::string>() == kFormatName,
               IoError, "{}: not an sshsdp checkpoint manifest (\"format\" is not \"{}\")", where,
               kFormatName);
  m.format_version = Get<int>(j, "format_version", where);
  SSHSDP_CHECK(m.format_version <= kCheckpointFormatVersion, IoError,
               "{}: format version {} is newer than this build of sshsdp reads ({}); load it "
               "with a newer sshsdp",
               where, m.format_version, kCheckpointFormatVersion);
  SSHSDP_CHECK(m.format_version >= 1, IoError, "{}: invalid format version {}", where,
               m.format_version);
  if (m.format_version >= 2) CheckManifestCrc(text, where);
  m.step = Get<int64_t>(j, "step", where);
  const json& L = j.contains("layout") ? j["layout"] : json();
  const std::string lw = where + " layout";
  m.layout = {Get<int>(L, "world", lw), Get<int>(L, "ranks_per_node", lw), Get<int>(L, "sw", lw),
              Get<int>(L, "sg", lw), Get<int>(L, "so", lw)};
  SSHSDP_CHECK(m.step >= 0, IoError, "{}: step {} is negative", where, m.step);
  try {
    Topology check(m.layout.world, m.layout.ranks_per_node, m.layout.sw, m.layout.sg, m.layout.so);
  } catch (const LayoutError& e) {
    throw IoError(fmt::format("{}: the layout is not valid: {}", where, e.what()));
  }
  m.runtime_dtype = Get<std::string>(j, "runtime_dtype", where);
  SSHSDP_CHECK(Get<std::string>(j, "state_dtype", where) == "F32", IoError,
               "{}: state dtype {} is not supported (F32 only)", where, j["state_dtype"].dump());
  m.fields = Get<std::vector<std::string>>(j, "fields", where);
  m.meta.model = j.value("model", json::object());
  m.meta.run = j.value("run", json::object());
  m.meta.scalars = j.value("scalars", json::object());
  SSHSDP_CHECK(j.contains("files") && j["files"].is_array() && !j["files"].empty(), IoError,
               "{}: 'files' is missing or empty", where);
  for (const json& f : j["files"]) {
    CheckpointFile cf;
    cf.name = Get<std::string>(f, "name", where + " files[]");
    SSHSDP_CHECK(!cf.name.empty() && cf.name.find('/') == std::string::npos && cf.name[0] != '.',
                 IoError, "{}: file name '{}' is not a plain file name", where, cf.name);
    cf.rank = Get<int>(f, "rank", where + " " + cf.name);
    SSHSDP_CHECK(cf.rank >= 0 && cf.rank < m.layout.world, IoError,
                 "{}: {} is from rank {}, outside the saved world of {}", where, cf.name, cf.rank,
                 m.layout.world);
    for (const CheckpointFile& other : m.files)
      SSHSDP_CHECK(other.rank != cf.rank && other.name != cf.name, IoError,
                   "{}: rank {} / file {} is listed twice", where, cf.rank, cf.name);
    cf.bytes = Get<uint64_t>(f, "bytes", where + " " + cf.name);
    const std::string crc = Get<std::string>(f, "crc32", where + " " + cf.name);
    try {
      size_t pos = 0;
      cf.crc32 = static_cast<uint32_t>(std::stoul(crc, &pos, 16));
      SSHSDP_CHECK(pos == crc.size(), IoError, "");
    } catch (const std::exception&) {
      throw IoError(fmt::format("{}: crc32 '{}' of {} is not hexadecimal", where, crc, cf.name));
    }
    m.files.push_back(cf);
  }
  SSHSDP_CHECK(j.contains("tensors") && j["tensors"].is_array(), IoError, "{}: 'tensors' missing",
               where);
  for (const json& t : j["tensors"]) {
    CheckpointTensor ct;
    ct.name = Get<std::string>(t, "name", where + " tensors[]");
    const std::string tw = fmt::format("{} tensor '{}'", where, ct.name);
    ct.shape = Get<std::vector<int64_t>>(t, "shape", tw);
    ct.group = Get<int>(t, "group", tw);
    SSHSDP_CHECK(ct.group >= 0, IoError, "{}: group {} is negative", tw, ct.group);
    if (t.contains("optimizer")) ct.optimizer = Get<std::string>(t, "optimizer", tw);
    for (int64_t d : ct.shape) SSHSDP_CHECK(d > 0, IoError, "{}: non-positive dimension", tw);
    const uint64_t numel = NumElements(ct.shape);
    uint64_t next = 0;
    SSHSDP_CHECK(t.contains("shards") && t["shards"].is_array(), IoError, "{}: 'shards' missing",
                 tw);
    for (const json& s : t["shards"]) {
      CheckpointShard cs;
      cs.file = Get<int>(s, "file", tw);
      const auto range = Get<std::vector<uint64_t>>(s, "range", tw);
      SSHSDP_CHECK(range.size() == 2, IoError, "{}: a shard range is not [begin, end]", tw);
      cs.begin = range[0], cs.end = range[1];
      SSHSDP_CHECK(cs.file >= 0 && cs.file < static_cast<int>(m.files.size()), IoError,
                   "{}: shard refers to file #{}, the manifest lists {} files", tw, cs.file,
                   m.files.size());
      SSHSDP_CHECK(cs.begin == next && cs.end > cs.begin && cs.end <= numel, IoError,
                   "{}: shards do not tile its {} elements (shard [{}, {}) after element {})", tw,
                   numel, cs.begin, cs.end, next);
      next = cs.end;
      cs.offsets = Get<std::map<std::string, uint64_t>>(s, "offsets", tw);
      for (const std::string& f : m.fields) {
        auto it = cs.offsets.find(f);
        SSHSDP_CHECK(it != cs.offsets.end(), IoError, "{}: shard in {} lacks field '{}'", tw,
                     m.files[cs.file].name, f);
        SSHSDP_CHECK(it->second + (cs.end - cs.begin) * 4 <= m.files[cs.file].bytes, IoError,
                     "{}: field '{}' [{}, {}) lies beyond the {} bytes of {}", tw, f, cs.begin,
                     cs.end, m.files[cs.file].bytes, m.files[cs.file].name);
      }
      ct.shards.push_back(std::move(cs));
    }
    SSHSDP_CHECK(next == numel, IoError, "{}: shards cover {} of its {} elements", tw, next, numel);
    m.tensors.push_back(std::move(ct));
  }
  return m;
}

}  // namespace

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

std::map<std::string, SafeTensor> ReadConsolidated(const Manifest& m, const std::string& field) {
  SSHSDP_CHECK(std::find(m.fields.begin(), m.fields.end(), field) != m.fields.end(), ConfigError,
               "{}: no field '{}' (it holds {})", m.ManifestPath(), field,
               fmt::join(m.fields, ", "));
  std::vector<std::unique_ptr<InFile>> files(m.files.size());
  std::map<std::string, SafeTensor> out;
  for (const CheckpointTensor& t : m.tensors) {
    SafeTensor st{t.shape, std::vector<float>(NumElements(t.shape))};
    for (const CheckpointShard& s : t.shards) {
      if (!files[s.file]) files[s.file] = std::make_unique<InFile>(m.FilePath(s.file));
      files[s.file]->ReadAt(st.data.data() + s.begin, (s.end - s.begin) * 4, s.offsets.at(field));
    }
    out.emplace(t.name, std::move(st));
  }
  return out;
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
  const std::vector<Engine::Zero1Field> fields = engine.Zero1Fields();
  const std::vector<Report> agreed = Exchange(
      world, Try([&](Report& rep) {
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
            std::memset(f.data, 0, f.chunk.size() * 4);  // tail padding stays zero
            for (const Fragment& fr : f.chain->Fragments(Shard::kZero1)) {
              const FragmentSpan sp = SpanOf(*f.pieces, fr);  // dim-0 padding stays zero
              if (sp.length == 0) continue;
              const CheckpointTensor& t = *by_name.at(f.layout->update[sp.update].name);
              auto it =
                  std::upper_bound(t.shards.begin(), t.shards.end(), sp.begin,
                                   [](uint64_t v, const CheckpointShard& s) { return v < s.end; });
              uint64_t covered = 0;
              for (; it != t.shards.end() && it->begin < sp.end(); ++it) {
                const uint64_t lo = std::max<uint64_t>(it->begin, sp.begin);
                const uint64_t hi = std::min<uint64_t>(it->end, sp.end());
                if (!files[it->file])
                  files[it->file] = std::make_unique<InFile>(m.FilePath(it->file));
                files[it->file]->ReadAt(f.data + sp.shard_offset + (lo - sp.begin), (hi - lo) * 4,
                                        it->offsets.at(f.field) + (lo - it->begin) * 4);
                covered += hi - lo;
                res.bytes_read += (hi - lo) * 4;
              }
              SSHSDP_CHECK(covered == sp.length, IoError,
                           "{}: tensor '{}' elements [{}, {}) are not fully in the checkpoint",
                           m.ManifestPath(), t.name, sp.begin, sp.end());
            }
          }
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

// ---- Tensor names and shapes ---------------------------------------------------------

std::vector<TensorSpec> ModelTensors(const Model& model) {
  std::vector<TensorSpec> out;
  for (int g = 0; g < model.num_groups(); ++g)
    for (const RuntimeParamSpec& rp : model.GroupParams(g))
      for (const UpdatePart& p : rp.parts) out.push_back({p.name, p.shape});
  return out;
}

std::string DescribeTensorMismatch(const std::vector<TensorSpec>& want,
                                   const std::vector<TensorSpec>& have, const std::string& source,
                                   int max_listed) {
  std::map<std::string, const TensorSpec*> w, h;
  for (const auto& t : want) w[t.name] = &t;
  for (const auto& t : have) h[t.name] = &t;
  std::vector<std::string> lines;
  for (const auto& t : want) {
    auto it = h.find(t.name);
    if (it == h.end())
      lines.push_back(fmt::format("'{}' {} is missing in the file", t.name, ShapeString(t.shape)));
    else if (it->second->shape != t.shape)
      lines.push_back(fmt::format("'{}' has shape {} in the file, the model needs {}", t.name,
                                  ShapeString(it->second->shape), ShapeString(t.shape)));
  }
  for (const auto& t : have)
    if (!w.count(t.name))
      lines.push_back(fmt::format("'{}' {} in the file is not a parameter of this model", t.name,
                                  ShapeString(t.shape)));
  if (lines.empty()) return {};
  const size_t n = std::min<size_t>(lines.size(), static_cast<size_t>(std::max(max_listed, 1)));
  std::string s = fmt::format(
      "{}: does not match this model ({} parameters; the file has {}): {} mismatch{}, first {}:",
      source, want.size(), have.size(), lines.size(), lines.size() == 1 ? "" : "es", n);
  for (size_t i = 0; i < n; ++i) s += "\n  " + lines[i];
  return s;
}

std::map<std::string, std::vector<float>> ReadInitWeights(const std::string& path,
                                                          const std::vector<TensorSpec>& want) {
  auto tensors = ReadSafetensors(path);
  std::vector<TensorSpec> have;
  for (const auto& [name, t] : tensors) have.push_back({name, t.shape});
  const std::string mismatch = DescribeTensorMismatch(want, have, path);
  SSHSDP_CHECK(mismatch.empty(), ConfigError, "{}", mismatch);
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, t] : tensors) {
    // A NaN or Inf would train to a NaN loss from the first step: refuse it here.
    const auto bad =
        std::find_if(t.data.begin(), t.data.end(), [](float v) { return !std::isfinite(v); });
    SSHSDP_CHECK(bad == t.data.end(), ConfigError,
                 "{}: tensor '{}' holds a non-finite value ({} at element {}); initial weights "
                 "must be finite",
                 path, name, *bad, bad - t.data.begin());
    out[name] = std::move(t.data);
  }
  return out;
}

}  // namespace sshsdp
