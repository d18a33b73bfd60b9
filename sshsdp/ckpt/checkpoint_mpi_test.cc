// Sharded checkpoints on real ranks (4 processes; sub-worlds of 1-4 ranks inside the job):
//  * resharding: a checkpoint saved at W=4 (sw, sg, so) = (2, 2, 4) loads at 8 other
//    layouts and world sizes (HSDP, pure ZeRO-1, W=3, W=1) with every field — main, m, v —
//    bit-identical (saved again and consolidated), and GatherMainWeights equal to it;
//  * resume: the same layout continues bit for bit (losses and weights); other layouts
//    continue within fp32 tolerance of the run that never stopped;
//  * errors: flipped byte, truncated file, missing rank file, newer format, different model
//    — every rank throws the same typed error naming the file, nobody hangs;
//  * saves: HSDP writes so files, keep-K pruning, stale *.tmp removal, same-step replace.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "sshsdp/base/crc32.h"
#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/presets.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Layout {
  int W, sw, sg, so;
};

GptConfig TestModel(int d_model = 24) {
  GptConfig c;
  c.vocab = 61;  // odd sizes: uneven shards, tensors split across ranks
  c.seq_len = 8;
  c.d_model = d_model;
  c.n_head = 3;
  c.n_layer = 2;
  return c;
}

json ModelJson(const GptConfig& c) {
  return {{"vocab", c.vocab},
          {"seq_len", c.seq_len},
          {"d_model", c.d_model},
          {"n_head", c.n_head},
          {"n_layer", c.n_layer}};
}

EngineConfig Config(const Layout& l, int batch, DType wdt) {
  EngineConfig cfg;
  cfg.sw = l.sw;
  cfg.sg = l.sg;
  cfg.so = l.so;
  cfg.ranks_per_node = l.W;
  cfg.batch_size = batch;
  cfg.seq_len = 8;
  cfg.weight_dtype = wdt;
  cfg.adamw.lr = 3e-3f;
  cfg.adamw.eps = 1e-6f;
  cfg.clip_norm = 0.5f;
  return cfg;
}

int32_t Tok(int64_t sample, int t, int vocab) {
  uint64_t x = static_cast<uint64_t>(sample) * 1000003u + static_cast<uint64_t>(t) * 7919u + 17;
  x ^= x >> 13;
  x *= 0x9E3779B97F4A7C15ull;
  return static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
}

// Global sample numbering independent of the layout: W·B samples per step.
BatchFn MakeBatch(const int64_t* step, int W, int rank, int B, int vocab) {
  return [=](int, int32_t* tok, int32_t* tgt) {
    for (int b = 0; b < B; ++b) {
      const int64_t sample = (*step * W + rank) * B + b;
      for (int t = 0; t < 8; ++t) {
        tok[b * 8 + t] = Tok(sample, t, vocab);
        tgt[b * 8 + t] = Tok(sample, t + 1, vocab);
      }
    }
  };
}

// The first n ranks of `world` (every rank must call; ranks >= n get a group they ignore).
std::unique_ptr<Communicator> FirstRanks(Communicator& world, int n) {
  return world.Split(world.rank() < n ? 0 : 1, world.rank());
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Trains `steps` steps from *step on, returning the losses.
std::vector<double> Train(Engine& e, int64_t* step, int steps, const BatchFn& batch) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i, ++*step) losses.push_back(e.Step(batch).loss);
  return losses;
}

class CheckpointMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = MpiCommunicator::World(4);
    if (world_->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  }
  void TearDown() override {
    if (dir_.empty()) return;
    world_->Barrier();
    if (world_->rank() == 0) fs::remove_all(dir_);
  }
  // One fresh directory for the whole job (named by rank 0's pid), removed after the test.
  std::string SharedDir(Communicator& world, const std::string& name) {
    int32_t pid = static_cast<int32_t>(::getpid()), all[64] = {};
    world.AllGather(&pid, all, 4, DType::kE4M3);
    const fs::path p =
        fs::temp_directory_path() / fmt::format("sshsdp_ckpt_mpi_{}_{}", all[0], name);
    if (world.rank() == 0) {
      fs::remove_all(p);
      fs::create_directories(p);
    }
    world.Barrier();
    dir_ = p.string();
    return dir_;
  }
  void ReshardEveryField(OptimizerKind opt, const std::string& name);
  std::unique_ptr<Communicator> world_;
  std::string dir_;
};

// Under Muon, each optimizer keeps only its own state: the shards of Muon tensors hold main and
// m, no v (format 3), and resharding moves the packed v of the AdamW tensors bit for bit.
TEST_F(CheckpointMpi, ReshardToAnyLayoutKeepsEveryFieldBitIdentical) {
  for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kMuon})
    ReshardEveryField(opt, OptimizerName(opt));
}

void CheckpointMpi::ReshardEveryField(OptimizerKind opt, const std::string& name) {
  SCOPED_TRACE(name);
  const std::string dir = SharedDir(*world_, "reshard_" + name);
  auto config = [&](const Layout& l, DType dt) {
    EngineConfig c = Config(l, 2, dt);
    c.optimizer = opt;
    return c;
  };
  const GptConfig gc = TestModel();
  const int r = world_->rank();
  CheckpointMeta meta{ModelJson(gc), {}, {{"data_position", 2}}};
  {
    Gpt model(gc);
    Engine a(model, *world_, config({4, 2, 2, 4}, DType::kBF16));
    a.InitWeights(3);
    int64_t step = 0;
    Train(a, &step, 2, MakeBatch(&step, 4, r, 2, gc.vocab));
    SaveResult s = SaveCheckpoint(a, *world_, dir + "/src", meta);
    EXPECT_EQ(s.files, 4);
    EXPECT_EQ(s.dir, dir + "/src/step_00000002");
  }
  const std::vector<Layout> targets = {{4, 1, 1, 4}, {4, 2, 2, 2}, {4, 4, 4, 4},
                                       {4, 1, 2, 4}, {2, 1, 1, 2}, {2, 2, 2, 2},
                                       {3, 1, 1, 3}, {3, 3, 3, 3}, {1, 1, 1, 1}};
  Manifest src;
  if (r == 0) {
    src = ReadManifest(dir + "/src/step_00000002");
    size_t muon = 0, adamw = 0;
    const auto v = ReadConsolidated(src, "v");
    for (const CheckpointTensor& t : src.tensors) {
      const bool has_v = t.shards.front().offsets.count("v") > 0;
      EXPECT_EQ(has_v, t.optimizer == "adamw") << t.name;
      EXPECT_EQ(v.count(t.name) > 0, has_v) << t.name;
      (t.optimizer == "muon" ? muon : adamw)++;
    }
    EXPECT_GT(adamw, 0u);
    EXPECT_EQ(muon > 0, opt == OptimizerKind::kMuon);
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const Layout& t = targets[i];
    SCOPED_TRACE(fmt::format("target W={} sw={} sg={} so={}", t.W, t.sw, t.sg, t.so));
    auto sub = FirstRanks(*world_, t.W);
    if (r < t.W) {
      Gpt model(gc);
      Engine b(model, *sub, config(t, DType::kF32));  // runtime dtype may change too
      LoadResult l = LoadCheckpoint(b, *sub, dir + "/src", ModelJson(gc));
      EXPECT_EQ(b.step(), 2);
      EXPECT_EQ(l.manifest.step, 2);
      EXPECT_FALSE(l.notes.empty());  // resharded and/or runtime dtype changed
      auto weights = b.GatherMainWeights();
      const std::string out = fmt::format("{}/t{}", dir, i);
      SaveCheckpoint(b, *sub, out, meta);
      if (r == 0) {
        const Manifest back = ReadManifest(ResolveCheckpoint(out));
        EXPECT_EQ(back.files.size(), static_cast<size_t>(t.so));
        for (const char* field : {"main", "m", "v"}) {
          auto x = ReadConsolidated(src, field), y = ReadConsolidated(back, field);
          ASSERT_EQ(x.size(), y.size());
          for (auto& [name, tx] : x) {
            EXPECT_EQ(tx.shape, y.at(name).shape) << name;
            EXPECT_TRUE(SameBits(tx.data, y.at(name).data)) << field << " of " << name;
            if (std::string(field) == "main") {
              EXPECT_TRUE(SameBits(tx.data, weights.at(name))) << "gathered " << name;
            }
          }
        }
      }
    }
    world_->Barrier();
  }
  if (r == 0) fs::remove_all(dir);
}

// Every shard layout of the flat buffers (sshsdp's flat chunks, FSDP2's dim-0 padded pieces,
// veScale's aligned blocks) saves and loads the same logical state: a checkpoint written from
// one layout and loaded into each other one gives bit-identical consolidated fields and
// gathered weights. (The dim-0 layout's members are pieces of update parameters: mapping
// them as whole parameters read past the end of the parameter list.)
TEST_F(CheckpointMpi, EveryShardLayoutSavesAndLoadsTheSameState) {
  const std::string dir = SharedDir(*world_, "shard_layouts");
  const GptConfig gc = TestModel();
  const int r = world_->rank();
  CheckpointMeta meta{ModelJson(gc), {}, {{"data_position", 2}}};
  // The presets that use each layout (flat, dim-0, aligned), with the switches it needs.
  const char* presets[] = {"sshsdp", "fsdp2", "vescale-fsdp"};
  for (const char* from : presets) {
    SCOPED_TRACE(fmt::format("saved from {}", from));
    const std::string src_root = fmt::format("{}/{}", dir, from);
    std::map<std::string, std::vector<float>> saved;
    {
      Gpt model(gc);
      EngineConfig c = Config({4, 2, 2, 4}, 2, DType::kF32);
      ApplyPreset(from, &c);
      Engine a(model, *world_, c);
      a.InitWeights(3);
      int64_t step = 0;
      Train(a, &step, 2, MakeBatch(&step, 4, r, 2, gc.vocab));
      SaveCheckpoint(a, *world_, src_root, meta);
      saved = a.GatherMainWeights();
    }
    Manifest src;
    if (r == 0) src = ReadManifest(ResolveCheckpoint(src_root));
    for (const char* to : presets) {
      SCOPED_TRACE(fmt::format("loaded into {}", to));
      Gpt model(gc);
      EngineConfig c = Config({4, 1, 2, 4}, 2, DType::kF32);
      ApplyPreset(to, &c);
      Engine b(model, *world_, c);
      LoadCheckpoint(b, *world_, src_root, ModelJson(gc));
      const auto got = b.GatherMainWeights();
      ASSERT_EQ(got.size(), saved.size());
      for (const auto& [name, w] : saved) EXPECT_TRUE(SameBits(w, got.at(name))) << name;
      const std::string out = fmt::format("{}/{}_to_{}", dir, from, to);
      SaveCheckpoint(b, *world_, out, meta);
      if (r == 0) {
        const Manifest back = ReadManifest(ResolveCheckpoint(out));
        for (const char* field : {"main", "m", "v"}) {
          auto x = ReadConsolidated(src, field), y = ReadConsolidated(back, field);
          ASSERT_EQ(x.size(), y.size());
          for (auto& [name, tx] : x)
            EXPECT_TRUE(SameBits(tx.data, y.at(name).data)) << field << " of " << name;
        }
      }
      world_->Barrier();
    }
  }
}

TEST_F(CheckpointMpi, ResumeIsExactAtTheSameLayoutAndWithinFp32ToleranceWhenResharded) {
  const std::string dir = SharedDir(*world_, "resume");
  const GptConfig gc = TestModel();
  const int r = world_->rank();
  const json mj = ModelJson(gc);
  std::vector<double> ref_loss;
  std::map<std::string, std::vector<float>> ref_w;
  {
    Gpt model(gc);
    Engine a(model, *world_, Config({4, 2, 2, 4}, 2, DType::kF32));
    a.InitWeights(5);
    int64_t step = 0;
    BatchFn batch = MakeBatch(&step, 4, r, 2, gc.vocab);
    Train(a, &step, 2, batch);
    SaveCheckpoint(a, *world_, dir, {mj, {}, {}});
    ref_loss = Train(a, &step, 3, batch);
    ref_w = a.GatherMainWeights();
  }
  // Same global batch (W·B = 8 samples per step) at every layout.
  const std::vector<std::pair<Layout, int>> runs = {
      {{4, 2, 2, 4}, 2}, {{4, 2, 2, 2}, 2}, {{2, 1, 1, 2}, 4}, {{1, 1, 1, 1}, 8}};
  for (const auto& [t, B] : runs) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} B={}", t.W, t.sw, t.sg, t.so, B));
    auto sub = FirstRanks(*world_, t.W);
    if (r < t.W) {
      Gpt model(gc);
      Engine b(model, *sub, Config(t, B, DType::kF32));
      LoadCheckpoint(b, *sub, dir, mj);
      int64_t step = b.step();
      ASSERT_EQ(step, 2);
      const std::vector<double> loss = Train(b, &step, 3, MakeBatch(&step, t.W, r, B, gc.vocab));
      auto w = b.GatherMainWeights();
      const bool same_layout = t.W == 4 && t.so == 4;
      for (size_t i = 0; i < loss.size(); ++i) {
        if (same_layout)
          EXPECT_EQ(loss[i], ref_loss[i]) << "step " << i;  // bit for bit
        else
          EXPECT_NEAR(loss[i], ref_loss[i], 1e-5 * ref_loss[i]) << "step " << i;
      }
      double worst = 0;
      for (auto& [name, v] : ref_w)
        for (size_t i = 0; i < v.size(); ++i)
          worst = std::max(worst, std::abs(static_cast<double>(v[i]) - w.at(name)[i]));
      if (same_layout)
        EXPECT_EQ(worst, 0.0);
      else
        EXPECT_LT(worst, 2e-5);
    }
    world_->Barrier();
  }
}

TEST_F(CheckpointMpi, BadCheckpointsFailOnEveryRankNamingTheFile) {
  const std::string dir = SharedDir(*world_, "errors");
  const GptConfig gc = TestModel();
  const json mj = ModelJson(gc);
  {
    Gpt model(gc);
    Engine a(model, *world_, Config({4, 2, 2, 4}, 2, DType::kBF16));
    a.InitWeights(1);
    SaveCheckpoint(a, *world_, dir + "/good", {mj, {}, {}});
  }
  const std::string good = dir + "/good/step_00000000";
  auto copy = [&](const std::string& name) {
    const std::string to = dir + "/" + name;
    fs::copy(good, to, fs::copy_options::recursive);
    return to;
  };
  if (world_->rank() == 0) {
    const std::string flip = copy("flip") + "/rank_00002.safetensors";
    std::fstream f(flip, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(2000);
    const char c = static_cast<char>(f.get() ^ 0x10);
    f.seekp(2000);
    f.put(c);
    f.close();
    const std::string trunc = copy("trunc") + "/rank_00001.safetensors";
    fs::resize_file(trunc, fs::file_size(trunc) - 100);
    fs::remove(copy("missing") + "/rank_00003.safetensors");
    const std::string newer = copy("newer") + "/" + kManifestFile;
    json j;
    std::ifstream(newer) >> j;
    j["format_version"] = kCheckpointFormatVersion + 1;
    std::ofstream(newer) << j.dump();
    const std::string later = copy("later") + "/" + kManifestFile;
    json k;
    std::ifstream(later) >> k;
    k["step"] = 5;  // a genuinely different (re-sealed) manifest on rank 1's path
    std::ofstream(later) << SealManifest(nlohmann::ordered_json(k));
    // Two same-shape tensors of one group with their names swapped, the manifest re-sealed:
    // every offset still lies inside its record, so only the model's order tells.
    const std::string swapped = copy("swapped") + "/" + kManifestFile;
    json w;
    std::ifstream(swapped) >> w;
    json& ts = w["tensors"];
    size_t a = ts.size(), b = ts.size();
    for (size_t i = 0; i < ts.size(); ++i) {
      if (ts[i]["name"] == "blocks.0.attn.q.h0") a = i;
      if (ts[i]["name"] == "blocks.0.attn.q.h1") b = i;
    }
    EXPECT_LT(std::max(a, b), ts.size()) << "the test model has no heads h0 and h1";
    if (std::max(a, b) < ts.size()) std::swap(ts[a]["name"], ts[b]["name"]);
    std::ofstream(swapped) << SealManifest(nlohmann::ordered_json(w));
    // The same two tensors' shards swapped, names and order kept: every check of the manifest
    // alone passes, only the rank files' own lists of their shards tell.
    const std::string moved = copy("moved") + "/" + kManifestFile;
    json v;
    std::ifstream(moved) >> v;
    json& vs = v["tensors"];
    if (std::max(a, b) < vs.size()) std::swap(vs[a]["shards"], vs[b]["shards"]);
    std::ofstream(moved) << SealManifest(nlohmann::ordered_json(v));
    // A NaN written into a main weight, the file's CRC-32 recomputed and the manifest re-sealed:
    // every checksum holds, the load refuses the value naming the tensor.
    const std::string nan = copy("nan") + "/" + kManifestFile;
    json n;
    std::ifstream(nan) >> n;
    const json& shard = n["tensors"][0]["shards"][0];
    const std::string file = fs::path(nan).parent_path().string() + "/" +
                             n["files"][shard["file"].get<int>()]["name"].get<std::string>();
    std::string bytes;
    {
      std::ifstream in(file, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const float q = std::nanf("");
    std::memcpy(bytes.data() + shard["offsets"]["main"].get<uint64_t>(), &q, 4);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    n["files"][shard["file"].get<int>()]["crc32"] =
        fmt::format("0x{:08x}", Crc32(bytes.data(), bytes.size()));
    std::ofstream(nan) << SealManifest(nlohmann::ordered_json(n));
  }
  world_->Barrier();
  struct Case {
    std::string path, type;
    std::vector<std::string> needles;
    GptConfig model;
  };
  const std::vector<Case> cases = {
      {dir + "/flip", "io", {"rank_00002.safetensors", "checksum mismatch"}, gc},
      {dir + "/trunc", "io", {"rank_00001.safetensors", "truncated"}, gc},
      {dir + "/missing", "io", {"rank_00003.safetensors", "missing"}, gc},
      {dir + "/newer", "io", {"manifest.json", "newer than this build"}, gc},
      {dir + "/swapped",
       "io",
       {"manifest.json", "'blocks.0.attn.q.h1' in the manifest but 'blocks.0.attn.q.h0'"},
       gc},
      {dir + "/nan",
       "io",
       {"rank_0000", "tensor '", "field 'main' holds nan at element 0, which train never saves"},
       gc},
      {dir + "/moved",
       "io",
       {"rank_0000", "tensor 'blocks.0.attn.q.h", "in the manifest but group",
        "in this file's header"},
       gc},
      {good,
       "config",
       {"manifest.json", "d_model 24 (checkpoint) vs 30 (this run)"},
       TestModel(30)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    Gpt model(c.model);
    Engine e(model, *world_, Config({4, 1, 1, 2}, 2, DType::kBF16));
    try {
      LoadCheckpoint(e, *world_, c.path, ModelJson(c.model));
      ADD_FAILURE() << "loaded a bad checkpoint";
    } catch (const Error& err) {
      const std::string what = err.what();
      EXPECT_EQ(c.type == "io", dynamic_cast<const IoError*>(&err) != nullptr) << what;
      EXPECT_EQ(c.type == "config", dynamic_cast<const ConfigError*>(&err) != nullptr) << what;
      for (const auto& n : c.needles) EXPECT_NE(what.find(n), std::string::npos) << what;
    }
    world_->Barrier();  // every rank got here: nobody was left waiting
  }

  // Ranks that do not see the same checkpoint (another file system, a root whose latest
  // step changed in between): every rank fails alike before reading state, nobody waits.
  const std::vector<std::pair<std::string, std::vector<std::string>>> split_views = {
      {dir + "/nowhere", {"nowhere", "reported by rank 1"}},
      {dir + "/later", {"ranks resolved different checkpoints", "rank 1: step 5"}},
  };
  for (const auto& [other, needles] : split_views) {
    SCOPED_TRACE(other);
    Gpt model(gc);
    Engine e(model, *world_, Config({4, 1, 1, 2}, 2, DType::kBF16));
    try {
      LoadCheckpoint(e, *world_, world_->rank() == 1 ? other : good, mj);
      ADD_FAILURE() << "loaded while ranks saw different checkpoints";
    } catch (const IoError& err) {
      for (const std::string& n : needles)
        EXPECT_NE(std::string(err.what()).find(n), std::string::npos) << err.what();
    }
    world_->Barrier();
  }

  // Muon's momentum lives in the same 'm' field AdamW uses: a Muon checkpoint resumed under
  // AdamW (or the reverse) is refused on every rank before any collective, naming a tensor.
  EngineConfig muon = Config({4, 2, 2, 4}, 2, DType::kBF16);
  muon.optimizer = OptimizerKind::kMuon;
  {
    Gpt model(gc);
    Engine a(model, *world_, muon);
    a.InitWeights(1);
    SaveCheckpoint(a, *world_, dir + "/muon", {mj, {}, {}});
  }
  for (const auto& [path, cfg] :
       {std::pair{dir + "/muon", Config({4, 1, 1, 2}, 2, DType::kBF16)}, std::pair{good, muon}}) {
    SCOPED_TRACE(path);
    Gpt model(gc);
    Engine e(model, *world_, cfg);
    try {
      LoadCheckpoint(e, *world_, path, mj);
      ADD_FAILURE() << "resumed under another optimizer";
    } catch (const ConfigError& err) {
      const std::string what = err.what();
      for (const char* n : {"blocks.0.attn.q.h0", "changed optimizer", "--optimizer"})
        EXPECT_NE(what.find(n), std::string::npos) << what;
    }
    world_->Barrier();
  }
  Gpt model(gc);
  Engine same(model, *world_, muon);
  EXPECT_NO_THROW(LoadCheckpoint(same, *world_, dir + "/muon/step_00000000", mj));
}

TEST_F(CheckpointMpi, SavesAreAtomicPrunedAndReplaceable) {
  const std::string dir = SharedDir(*world_, "prune");
  const GptConfig gc = TestModel();
  const int r = world_->rank();
  if (r == 0) fs::create_directories(dir + "/step_00000099.tmp/leftover");  // a crashed save
  world_->Barrier();
  Gpt model(gc);
  Engine a(model, *world_, Config({4, 2, 2, 2}, 2, DType::kBF16));  // HSDP: 2 replicas
  a.InitWeights(2);
  int64_t step = 0;
  BatchFn batch = MakeBatch(&step, 4, r, 2, gc.vocab);
  std::vector<std::string> pruned;
  for (int i = 0; i < 3; ++i) {
    Train(a, &step, 1, batch);
    SaveResult s = SaveCheckpoint(a, *world_, dir, {ModelJson(gc), {}, {}}, {.keep = 2});
    EXPECT_EQ(s.files, 2);  // so = 2 files: replica 1 holds copies
    pruned.insert(pruned.end(), s.pruned.begin(), s.pruned.end());
    EXPECT_GT(s.bytes, 0u);
  }
  if (r == 0) {
    EXPECT_FALSE(fs::exists(dir + "/step_00000099.tmp"));
    auto all = ListCheckpoints(dir);
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0].first, 2);
    EXPECT_EQ(all[1].first, 3);
    EXPECT_EQ(pruned, std::vector<std::string>{dir + "/step_00000001"});
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  // Saving the same step again replaces it; the result still loads.
  SaveCheckpoint(a, *world_, dir, {ModelJson(gc), {}, {}}, {.keep = 2});
  auto w = a.GatherMainWeights();
  Gpt model2(gc);
  Engine b(model2, *world_, Config({4, 2, 2, 4}, 2, DType::kBF16));
  LoadResult l = LoadCheckpoint(b, *world_, dir, ModelJson(gc));
  EXPECT_EQ(l.manifest.step, 3);
  auto wb = b.GatherMainWeights();
  for (auto& [name, v] : w) EXPECT_TRUE(SameBits(v, wb.at(name))) << name;
  if (r == 0) {
    EXPECT_EQ(ListCheckpoints(dir).size(), 2u);
  }
}

// The checkpoint with the best validation loss is kept out of --keep pruning: a run whose later
// states got worse keeps its best one besides the newest.
TEST_F(CheckpointMpi, PruningKeepsTheBestValidatedCheckpoint) {
  const std::string dir = SharedDir(*world_, "best");
  const GptConfig gc = TestModel();
  Gpt model(gc);
  Engine a(model, *world_, Config({4, 2, 2, 4}, 2, DType::kBF16));
  a.InitWeights(2);
  int64_t step = 0;
  BatchFn batch = MakeBatch(&step, 4, world_->rank(), 2, gc.vocab);
  const double val[] = {3.0, 1.5, 2.5, 2.0};  // step 2 is the best
  std::vector<std::string> pruned;
  for (double v : val) {
    Train(a, &step, 1, batch);
    CheckpointMeta meta{ModelJson(gc), {}, {{"val_loss", v}}};
    SaveResult s = SaveCheckpoint(a, *world_, dir, meta, {.keep = 1});
    pruned.insert(pruned.end(), s.pruned.begin(), s.pruned.end());
  }
  if (world_->rank() == 0) {
    std::vector<int64_t> steps;
    for (const auto& c : ListCheckpoints(dir)) steps.push_back(c.first);
    EXPECT_EQ(steps, (std::vector<int64_t>{2, 4}));  // the best and the newest
    EXPECT_EQ(pruned, (std::vector<std::string>{dir + "/step_00000001", dir + "/step_00000003"}));
  }
}

}  // namespace
}  // namespace sshsdp
