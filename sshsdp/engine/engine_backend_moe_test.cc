// The engine training the MoE GPT (models/moe.h) on a backend it is handed: per-expert Muon
// next to AdamW, packed [E, out, in] expert weights, every (sw, sg, so) layout of this world.
//
// Handed a CPU backend, the run equals the engine training MoeGpt on their own CPU backends on
// the same ranks and batches BIT FOR BIT (losses, gradient norms, every main weight), fp32 and
// bf16 runtime weights and MXFP8 experts (their codes and scales too), AdamW and Muon per
// expert, both group structures (MoeConfig::expert_group), with the same communication bytes.
// On the deferred guarded backend (memory the host cannot touch, ops queued like a GPU stream;
// the direct path over the shared-memory stand-in device on several ranks, the outer phase
// staged) it is bit for bit the CPU run on the same path — every access of the model and the
// engine to backend memory goes through the backend, and every hand-off synchronizes. With
// SSHSDP_TEST_BACKEND=cuda (ctest's engine_backend_moe_test_cuda_np*, label gpu, skipped
// without one) the same comparison runs on this rank's GPU within the optimizers' tolerances.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/testing/guarded_backend.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/testing/shm_device_memory.h"
#include "sshsdp/device/cuda_direct_memory.h"
#include "sshsdp/device/testing/device_mpi_test.h"
#include "sshsdp/engine/testing/parity_harness.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {
namespace {

using testing::Describe;
using testing::Layout;
using testing::WorldSize;

// Two MoE blocks of 4 SwiGLU experts (width 20: ZeRO-1 boundaries fall inside expert
// matrices), top-2 softmax, a shared expert; attention fp32 as on the backends.
MoeConfig TestModel() {
  MoeConfig c = testing::TestMoe();
  c.shared_expert = true;
  c.d_shared = 12;
  c.trunk.bf16_attention = false;
  return c;
}

// 16 experts, top-1: with 16 tokens a microbatch some experts get none, so their gradient
// slices must be written as zeros (sg > 1 recycles gradient blocks, never clears them).
MoeConfig IdleExpertsModel() {
  MoeConfig c = TestModel();
  c.n_expert = 16;
  c.top_k = 1;
  return c;
}

// Sigmoid gating without renormalisation, GELU experts, block 0 dense, expert groups.
MoeConfig TestModelVariant() {
  MoeConfig c = TestModel();
  c.gating = Gating::kSigmoid;
  c.renormalize = false;
  c.expert_mlp = ExpertMlp::kGelu;
  c.shared_expert = false;
  c.moe_every = 2;
  c.expert_group = true;
  return c;
}

struct Case {
  MoeConfig model = TestModel();
  DType wdt = DType::kF32;
  bool muon = false;
  Backend* backend = nullptr;
  DirectDeviceMemory* direct = nullptr;
  bool exact = true;  // bit for bit (the CPU's ops underneath); else the optimizers' tolerances
  int steps = 2;
};

std::string Name(const Case& k) {
  return fmt::format("{} {} {}{}", DTypeName(k.wdt), k.muon ? "muon per expert" : "adamw",
                     k.model.expert_group ? "expert groups" : "one group per block",
                     k.direct ? " direct path" : "");
}

// The engine on k.backend training MoeGpt on it against the engine on its own CPU backend
// training MoeGpt on its own, on the same ranks, batches and communication path.
void RunOnBackend(const Case& k, const Layout& l) {
  testing::ParityCase c;
  c.layout = l;
  int made = 0;
  c.make = [&made, &k]() -> std::unique_ptr<Model> {
    if (made++ == 0) return std::make_unique<MoeGpt>(k.model, *k.backend);
    return std::make_unique<MoeGpt>(k.model);
  };
  c.cfg = k.muon ? testing::MuonEngineConfig(l, 2, k.wdt, UnitRule::kHead, DType::kBF16)
                 : testing::BaseConfig(l, 2, k.wdt);
  c.cfg.scale_layout = ScaleLayout::kRowMajor;  // MXFP8: what the device reads
  c.ref_cfg = c.cfg;
  c.cfg.backend = k.backend;
  if (k.direct) {
    c.cfg.comm_path = CommPath::kDirect;
    c.cfg.direct_device = k.direct;
    c.ref_cfg.comm_path = CommPath::kDirect;  // the direct path reduces in its own order
  }
  c.reference = testing::Reference::kSameWorld;
  if (k.exact) {
    c.tol = {0, 0, testing::kNotCompared};  // the weights: bit for bit, below
  } else if (k.wdt == DType::kE4M3) {
    c.tol_at = testing::MxTolerances;
  } else if (k.muon) {
    c.tol = testing::MuonTolerances(false);
  } else {
    c.tol = testing::AdamWTolerances(k.wdt);
  }
  c.steps = k.steps;
  testing::ParityRun run(c);
  auto* model = dynamic_cast<MoeGpt*>(&run.model());
  ASSERT_NE(model, nullptr);
  run.Run([&](const testing::StepDiff& d) {
    const StepCounters &a = d.dist.counters, &b = d.ref.counters;
    EXPECT_EQ(a.runtime_comm.total(), b.runtime_comm.total());
    EXPECT_EQ(a.update_comm.total(), b.update_comm.total());
    EXPECT_EQ(a.update_p2p.total(), b.update_p2p.total());
    EXPECT_EQ(a.add_passes, 0u);
    EXPECT_EQ(a.bytes_copied, 0u);
    if (k.exact) testing::ExpectWeightsBitEqual(run.engine(), run.ref());
  });
  if (k.model.n_expert == IdleExpertsModel().n_expert) {  // the last microbatch's routing
    int idle = 0;
    for (int64_t n : model->ExpertTokens(0)) idle += n == 0;
    EXPECT_GT(idle, 0) << "16 experts, top-1: some expert must get no tokens";
  }
  if (k.wdt != DType::kE4M3) return;
  // The gathered codes and S′ are the engine's own main weights quantized unsharded.
  EXPECT_GT(testing::ExpectMxOfTheMainWeights(run.engine(), run.model(), ScaleLayout::kRowMajor),
            0u);
  // Only the expert groups (routed and shared experts) are MX, and their codes and row-major scales
  // are the host's.
  const auto mine = run.engine().GatherMxWeights(), theirs = run.ref().GatherMxWeights();
  ASSERT_EQ(mine.size(), theirs.size());
  EXPECT_FALSE(mine.empty());
  for (const auto& [name, w] : mine) {
    EXPECT_TRUE(name.find(".moe.w") != std::string::npos ||
                name.find(".moe.shared.w") != std::string::npos)
        << name << " is MX outside the experts";
    if (!k.exact) continue;
    EXPECT_EQ(w.codes, theirs.at(name).codes) << name;
    EXPECT_EQ(w.scales, theirs.at(name).scales) << name;
  }
}

TEST(EngineBackendMoe, HandedCpuBackendEqualsItsOwnBitForBit) {
  const int W = WorldSize();
  std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  int i = 0;
  for (const Layout& l : testing::LayoutsFor(W))
    for (bool muon : {false, true}) {
      Case k;
      k.wdt = muon ? DType::kBF16 : DType::kF32;  // bf16 weights with Muon's bf16 u
      k.muon = muon;
      k.backend = cpu.get();
      // The variant (expert groups, a dense block, sigmoid / GELU) and the idle experts in
      // turn.
      const int which = i++ % 3;
      if (which == 1) k.model = TestModelVariant();
      if (which == 2) k.model = IdleExpertsModel();
      SCOPED_TRACE(Describe(W, l) + " " + Name(k) + (which == 2 ? " 16 experts top-1" : ""));
      RunOnBackend(k, l);
    }
}

// MXFP8 experts (expert groups; the router, attention, dense blocks, embeddings and head stay
// bf16): the CPU backend dequantizes the same codes with the same row-major scales.
TEST(EngineBackendMoe, Mxfp8ExpertsOnTheCpuBackendBitForBit) {
  const int W = WorldSize();
  std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  int i = 0;
  for (const Layout& l : testing::LayoutsFor(W)) {
    Case k;
    k.wdt = DType::kE4M3;
    k.muon = i++ % 2 == 1;
    k.backend = cpu.get();
    k.model = k.muon ? TestModelVariant() : TestModel();
    k.model.expert_group = true;
    SCOPED_TRACE(Describe(W, l) + " " + Name(k));
    RunOnBackend(k, l);
  }
}

// On guarded memory (the direct path's shared-memory stand-in device on several ranks).
void RunOnGuardedDevice(const Layout& l, bool muon, DType wdt) {
  testing::ShmDeviceMemory shm;
  testing::GuardedBackend device(WorldSize() > 1 ? &shm : nullptr, /*deferred=*/true);
  Case k;
  k.wdt = wdt;
  k.muon = muon;
  k.backend = &device;
  k.direct = WorldSize() > 1 ? &shm : nullptr;
  k.steps = 3;
  if (muon) k.model = TestModelVariant();
  if (wdt == DType::kE4M3) k.model.expert_group = true;
  SCOPED_TRACE(Name(k));
  RunOnBackend(k, l);
  EXPECT_GT(device.calls(), 100);
}

TEST(EngineBackendMoe, OneRankOnGuardedDeviceMemory) {
  if (WorldSize() != 1) GTEST_SKIP() << "one rank (the guard is per process)";
  RunOnGuardedDevice(testing::kOneRank, /*muon=*/false, DType::kF32);
  RunOnGuardedDevice(testing::kOneRank, /*muon=*/true, DType::kBF16);
  RunOnGuardedDevice(testing::kOneRank, /*muon=*/true, DType::kE4M3);
}

TEST(EngineBackendMoe, EveryLayoutOnGuardedDeviceMemory) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  for (const Layout& l : testing::LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    const DType wdts[] = {DType::kF32, DType::kBF16, DType::kE4M3};
    RunOnGuardedDevice(l, /*muon=*/l.so % 2 == 1, wdts[(l.sw + l.so) % 3]);
  }
}

// MXFP8 without expert groups (the router would be FP8 too), and scales the device cannot read,
// are refused by name before any collective.
TEST(EngineBackendMoe, RefusesWhatTheDeviceCannotRunByName) {
  std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  auto world = MpiCommunicator::World(WorldSize());
  EngineConfig cfg = testing::BaseConfig(testing::LayoutsFor(WorldSize()).front(), 1, DType::kE4M3);
  cfg.scale_layout = ScaleLayout::kRowMajor;
  cfg.backend = cpu.get();
  MoeGpt one_group(TestModel(), *cpu);
  try {
    Engine engine(one_group, *world, cfg);
    ADD_FAILURE() << "MXFP8 accepted without expert groups";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MoeConfig::expert_group"), std::string::npos) << e.what();
  }
  // A device whose dequantize reads row-major scales only (the CPU backend reads them all).
  testing::ShmDeviceMemory shm;
  testing::GuardedBackend device(WorldSize() > 1 ? &shm : nullptr, /*deferred=*/true);
  if (WorldSize() > 1) {
    cfg.comm_path = CommPath::kDirect;
    cfg.direct_device = &shm;
  }
  cfg.backend = &device;
  MoeConfig m = TestModel();
  m.expert_group = true;
  MoeGpt model(m, device);
  cfg.scale_layout = ScaleLayout::kCublasSwizzle;
  try {
    Engine engine(model, *world, cfg);
    ADD_FAILURE() << "cublas_swizzle scales accepted on a row-major device";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--scale-layout row_major"), std::string::npos)
        << e.what();
  }
}

TEST(EngineBackendMoe, OnTheCudaBackend) {
  std::string skip;
  std::unique_ptr<Backend> gpu = testing::TestGpuOrSkip(&skip);
  if (!gpu) GTEST_SKIP() << skip;
  const int W = WorldSize();
  for (int run = 0; run < 3; ++run) {
    Case k;
    k.muon = run == 1;
    k.wdt = run == 2 ? DType::kE4M3 : DType::kF32;
    k.backend = gpu.get();
    k.exact = false;
    k.steps = 3;
    if (k.muon) k.model = TestModelVariant();
    if (run == 2) k.model.expert_group = true;
    SCOPED_TRACE(Name(k));
    if (W == 1) {
      RunOnBackend(k, testing::kOneRank);
      continue;
    }
    std::unique_ptr<DirectDeviceMemory> ipc = MakeCudaDirectMemory(*gpu);
    k.direct = ipc.get();
    RunOnBackend(k, Layout{W, W, W, W});
    k.direct = nullptr;
    RunOnBackend(k, Layout{1, 1, W, W});
  }
}

}  // namespace
}  // namespace sshsdp
