// BigramMlp (bigram_mlp.h) on several ranks held to the same engine on one rank (the paper's
// correctness method): AdamW and per-matrix Muon, every step's loss and every main weight, then
// a checkpoint the installed `sshsdp ckpt inspect` reads. Exits non-zero on a mismatch.
//
//   mpirun -np 3 build/bigram_mlp_check out/ckpt
#include <cstdio>
#include <memory>
#include <string>

#include "bigram_mlp.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"

namespace {

using namespace sshsdp;
using bigram::BigramMlp;
using bigram::V;

// Trains `steps` steps on W ranks next to the same engine on one rank with W·M microbatches
// (the same global batch), comparing loss and every main weight. Returns the number of
// mismatches.
// Weights within `weight_tol`: AdamW differs by fp32 summation order only (~1e-7); Muon's
// Newton–Schulz input u is bf16 (MuonConfig), so a rounding that differs somewhere moves v on
// weak directions (~1e-5 here) — far below the lr = 0.02 step of a wrong or missing fragment.
int TrainAndCheck(Communicator& world, const EngineConfig& base, const char* label,
                  double weight_tol, const std::string& ckpt_dir) {
  const int W = world.size(), rank = world.rank(), M = base.microbatches, B = base.batch_size;
  const int T = base.seq_len, steps = 8;
  SyntheticTokens data(V, /*seed=*/5);
  std::unique_ptr<Backend> cpu = MakeCpuBackend();  // the model computes where the engine runs
  BigramMlp model(*cpu), ref_model(*cpu);
  EngineConfig cfg = base;
  cfg.backend = cpu.get();
  cfg.sw = cfg.sg = cfg.so = W;  // fully sharded
  Engine engine(model, world, cfg);
  std::unique_ptr<Communicator> self = world.Split(rank, 0);
  EngineConfig ref_cfg = cfg;
  ref_cfg.sw = ref_cfg.sg = ref_cfg.so = 1;
  ref_cfg.microbatches = M * W;
  Engine ref(ref_model, *self, ref_cfg);
  engine.InitWeights(1);
  ref.InitWeights(1);
  int bad = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const StepStats st = engine.Step([&](int mb, int32_t* tok, int32_t* tgt) {
      data.Batch(SampleIndex(s, mb, M, rank, W, 0, B), B, T, tok, tgt);
    });
    const StepStats rs = ref.Step([&](int mb, int32_t* tok, int32_t* tgt) {
      data.Batch(SampleIndex(s, mb, M * W, 0, 1, 0, B), B, T, tok, tgt);
    });
    const auto a = engine.GatherMainWeights(), b = ref.GatherMainWeights();
    double worst = 0;
    for (const auto& [name, v] : a)
      for (size_t i = 0; i < v.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs(v[i] - b.at(name)[i])));
    const bool ok = std::abs(st.loss - rs.loss) <= 1e-5 * rs.loss && worst <= weight_tol;
    bad += !ok;
    if (rank == 0 && (s == 0 || s + 1 == steps || !ok))
      std::printf("%s step %lld: loss %.6f (one rank %.6f), worst weight difference %.2e%s\n",
                  label, static_cast<long long>(s + 1), st.loss, rs.loss, worst,
                  ok ? "" : "  MISMATCH");
  }
  PrepareCheckpointRoot(ckpt_dir);
  const SaveResult saved = SaveCheckpoint(engine, world, ckpt_dir, {});
  if (rank == 0)
    std::printf("%s: saved %s (%d files, %llu bytes)\n", label, saved.dir.c_str(), saved.files,
                static_cast<unsigned long long>(saved.bytes));
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  return RunMpiMain(argc, argv, [&] {
    const std::string root = argc > 1 ? argv[1] : "out/custom_model";
    auto world = MpiCommunicator::World(WorldSize());  // one node
    EngineConfig cfg;
    cfg.microbatches = 2;
    cfg.batch_size = 4;
    cfg.seq_len = 16;
    cfg.weight_dtype = DType::kF32;
    cfg.adamw.lr = 1e-2f;
    int bad = TrainAndCheck(*world, cfg, "adamw", 2e-5, root + "/adamw");
    cfg.optimizer = OptimizerKind::kMuon;  // matrices; AdamW for the gain and the tables
    cfg.muon_unit = UnitRule::kMatrix;     // mlp.in as one [2h, d] unit
    bad += TrainAndCheck(*world, cfg, "muon per matrix", 2e-4, root + "/muon");
    if (world->rank() == 0)
      std::printf("%s on %d ranks\n", bad == 0 ? "OK: matches the one-rank reference" : "FAILED",
                  world->size());
    return bad == 0 ? 0 : 1;
  });
}
