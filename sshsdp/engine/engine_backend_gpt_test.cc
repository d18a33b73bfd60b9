// The engine training Gpt on a backend it is handed (models/gpt.h: every op a backend op, here
// the CPU backend) equals the single-process reference of the same logical update with the
// host Gpt, at every (sw, sg, so) layout of this world size, fp32,
// two microbatches: the model side of the engine on a GPU, run through the engine's real
// schedule (gathers, views of W′ and G′, fused accumulation, reduce-scatters, the update).
//
// Then the engine itself on a backend (EngineConfig::backend): its roots, transient blocks,
// G, fills, norms and AdamW in the backend's memory and ops. On one rank with a backend whose
// memory faults when the host touches it (testing/guarded_backend.h), so any engine access
// that bypasses the backend kills the test; on several ranks as plain ZeRO-3 on the direct
// path with shared memory standing in for the device (comm/testing/shm_device_memory.h).
// The CPU backend (host memory) on several ranks runs over MPI without the direct path.
// With SSHSDP_TEST_BACKEND=cuda, EngineOnBackend.OnTheCudaBackend runs the same comparison on
// this rank's GPU (several ranks sharing one GPU over CUDA IPC; and over NCCL on one rank or
// one GPU per rank): ctest's *_cuda entries, label gpu, skipped without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/testing/guarded_backend.h"
#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/testing/shm_device_memory.h"
#include "sshsdp/device/cuda_direct_memory.h"
#include "sshsdp/device/nccl_communicator.h"
#include "sshsdp/device/testing/device_mpi_test.h"
#include "sshsdp/engine/testing/parity_harness.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {
namespace {

using testing::BaseConfig;
using testing::Describe;
using testing::Layout;
using testing::LayoutsFor;
using testing::TestGpt;
using testing::WorldSize;

Backend& Cpu() {
  static std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  return *cpu;
}

// The Gpt every backend runs here, and the host reference: attention fp32 whatever the weights,
// as the backends without bf16 attention (GptConfig::bf16_attention = false), so the CPU, the
// guarded test backend and CUDA compute one function.
GptConfig HostReferenceGpt() {
  GptConfig c = TestGpt();
  c.bf16_attention = false;
  return c;
}

// fp32 runtime weights, and bf16 ones: the engine on the CPU backend it is handed.
TEST(EngineBackendGpt, AllLayoutsMatchTheHostGptReference) {
  const int W = WorldSize();
  for (DType wdt : {DType::kF32, DType::kBF16})
    for (const Layout& l : LayoutsFor(W)) {
      SCOPED_TRACE(Describe(W, l) + " " + std::string(DTypeName(wdt)));
      testing::ParityCase c;
      c.layout = l;
      int made = 0;  // the first model is the engine's under test, the second the reference's
      c.make = [&made]() -> std::unique_ptr<Model> {
        if (made++ == 0) return std::make_unique<Gpt>(HostReferenceGpt(), Cpu());
        return std::make_unique<Gpt>(HostReferenceGpt());
      };
      c.cfg = BaseConfig(l, 2, wdt);
      c.ref_cfg = BaseConfig(testing::kOneRank, 2 * W, wdt);
      c.tol = testing::AdamWTolerances(wdt);
      testing::ParityRun run(c);
      EXPECT_NE(dynamic_cast<Gpt*>(&run.model()), nullptr);
      run.Run([&](const testing::StepDiff& d) {
        EXPECT_EQ(d.dist.counters.add_passes, 0u);
        EXPECT_EQ(d.dist.counters.bytes_copied, 0u);
      });
    }
}

// The guarded test backends queue their ops as a GPU stream does (testing/guarded_backend.h), so
// a hand-off without the engine's synchronization reads stale memory here as on a GPU.
constexpr bool kDeferred = true;

// What the outer phase stages through host memory per step on a device without NCCL
// (StagedCommunicator): per group of ZeRO-1 chunk c, with a replica reduce-scatter group of r
// members (so / sg), an all-gather group of a (so / sw) and an HSDP group of h (W / so):
// r·c·4 out and c·4 back; a·c·e around the all-gather (own shard out, the others' back); 2·c·4
// around HSDP's all-reduce.
uint64_t StagedBytesPerStep(Engine& e, DType wdt) {
  const Topology& t = e.topology();
  const uint64_t r = t.so() / t.sg(), a = t.so() / t.sw(), h = t.world() / t.so();
  uint64_t bytes = 0;
  for (const Engine::Zero1Field& f : e.Zero1Fields())
    if (f.field == "main") {
      const uint64_t c = f.chunk.size();
      if (r > 1) bytes += (r + 1) * c * 4;
      if (a > 1) bytes += a * c * DTypeSize(wdt);
      if (h > 1) bytes += 2 * c * 4;
    }
  e.ReleaseZero1Mirrors();
  return bytes;
}

// The compute stream's hand-offs per step (Engine::SubmitComm, SyncBackend): one event per
// communication-thread task that moves backend memory — each ZeRO-3 gather, each group's
// reduce-scatter per microbatch (none when sg = 1 fuses accumulation into backward) and, with
// overlap_outer, each outer collective — and no wait of the compute thread but for an outer
// phase run on it (its reduce-scatter / HSDP all-reduce, and its all-gather, per group).
void ExpectHandOffs(Engine& e, const StepCounters& c, int M, bool overlap) {
  const Topology& t = e.topology();
  const uint64_t r = t.so() / t.sg(), a = t.so() / t.sw(), h = t.world() / t.so();
  uint64_t n = 0;
  for (const Engine::Zero1Field& f : e.Zero1Fields(/*read_state=*/false))
    n += f.field == "main" ? 1 : 0;
  e.ReleaseZero1Mirrors();
  const uint64_t rs = t.sg() > 1 ? n * M : 0;
  const uint64_t outer = overlap ? n * ((r > 1) + (h > 1) + (a > 1)) : 0;
  EXPECT_EQ(c.backend_events, c.gathers + rs + outer);
  EXPECT_EQ(c.backend_waits, overlap ? 0 : n * ((r > 1 || h > 1) + (a > 1)));
}

// Which optimizer the engine on a backend runs: AdamW everywhere, or Muon per head (AdamW for
// the rest) with its Newton–Schulz input u in fp32 (exact tolerances) or bf16 (the paper's).
struct Optimizer {
  OptimizerKind kind = OptimizerKind::kAdamW;
  DType u_dtype = DType::kF32;
};
constexpr Optimizer kAdamW{};
constexpr Optimizer kMuonF32{OptimizerKind::kMuon, DType::kF32};
constexpr Optimizer kMuonBf16{OptimizerKind::kMuon, DType::kBF16};

// The engine on `backend`, training Gpt on it, against the host Gpt's one-rank
// reference on the host engine: losses, norms and main weights within the optimizer's fp32
// tolerances. Muon: the bytes of split units' fragments are the host path's (staged through
// host memory, counted alike).
void RunOnBackend(Backend& backend, const Layout& l, DType wdt, DirectDeviceMemory* direct,
                  int steps, Optimizer opt = kAdamW, bool nccl = false, bool overlap_outer = true) {
  testing::ParityCase c;
  c.layout = l;
  int made = 0;
  c.make = [&made, &backend]() -> std::unique_ptr<Model> {
    if (made++ == 0) return std::make_unique<Gpt>(HostReferenceGpt(), backend);
    return std::make_unique<Gpt>(HostReferenceGpt());
  };
  const int W = WorldSize();
  if (opt.kind == OptimizerKind::kMuon) {
    c.cfg = testing::MuonEngineConfig(l, 2, wdt, UnitRule::kHead, opt.u_dtype);
    c.ref_cfg =
        testing::MuonEngineConfig(testing::kOneRank, 2 * W, wdt, UnitRule::kHead, opt.u_dtype);
    c.tol = testing::MuonTolerances(wdt == DType::kF32 && opt.u_dtype == DType::kF32);
  } else {
    c.cfg = BaseConfig(l, 2, wdt);
    c.ref_cfg = BaseConfig(testing::kOneRank, 2 * W, wdt);
    c.tol = testing::AdamWTolerances(wdt);
  }
  // A GPU's exp, tanh and sums differ from the CPU's in their last bits (the CPU backend is the
  // host's kernels, bit for bit). With bf16 activations one such bit can flip a rounding (2^-8
  // relative), and AdamW's first steps (eps 1e-6) turn a changed near-zero gradient into up to
  // 2·lr on that element: seen at 5.6e-4 (AdamW) to 7.7e-3 (wte beside Muon) on the CPU emulation
  // of CUDA. Weights are bounded at 1.5e-2 there; a wrong or missing update still shows in the
  // next steps' losses and gradient norms, held at bf16's bounds.
  if (wdt == DType::kBF16 && backend.name().starts_with("cuda")) c.tol.weight = 1.5e-2;
  c.cfg.backend = &backend;
  if (direct) {
    c.cfg.comm_path = CommPath::kDirect;
    c.cfg.direct_device = direct;
  }
  if (nccl) c.cfg.comm_path = CommPath::kNccl;
  c.cfg.overlap_outer = overlap_outer;
  c.steps = steps;
  testing::ParityRun run(c);
  const uint64_t staged = backend.host_memory() || nccl ? 0 : StagedBytesPerStep(run.engine(), wdt);
  uint64_t last_p2p = 0;
  run.Run([&](const testing::StepDiff& d) {
    EXPECT_EQ(d.dist.counters.add_passes, 0u);
    EXPECT_EQ(d.dist.counters.bytes_copied, 0u);
    EXPECT_EQ(d.dist.counters.staged_bytes, staged);
    ExpectHandOffs(run.engine(), d.dist.counters, 2, overlap_outer);
    last_p2p = d.dist.counters.update_p2p.total();
  });
  if (opt.kind == OptimizerKind::kMuon) {
    const UpdatePlan* plan = run.engine().structured_update().plan(OptimizerKind::kMuon);
    ASSERT_NE(plan, nullptr);
    // On a device the update's temporaries stay allocated between steps, and accounted; on
    // host memory they live only while the update runs.
    const uint64_t temps = run.engine().structured_update().temporary_bytes();
    EXPECT_GT(temps, 0u);
    EXPECT_EQ(run.engine().memory().current(kUpdateTemporaries),
              backend.host_memory() ? 0u : temps);
    // What the point-to-point communicator moved (the staged host buffers) is the plan's.
    EXPECT_EQ(last_p2p, plan->BytesSent(std::max(0, WorldRankOrMinusOne())));
  }
}

TEST(EngineOnBackend, HostNeverTouchesBackendMemoryOnOneRank) {
  if (WorldSize() != 1) GTEST_SKIP() << "one rank (the guard is per process, no comm thread work)";
  testing::GuardedBackend guarded(nullptr, kDeferred);
  RunOnBackend(guarded, testing::kOneRank, DType::kF32, nullptr, 3);
  EXPECT_GT(guarded.calls(), 100);  // the model, G, norms and AdamW all went through it
}

// The compute handle's host waits in a steady step (the third) at M microbatches, on one rank.
int64_t HostWaitsPerStep(int M) {
  testing::GuardedBackend guarded(nullptr, kDeferred);
  testing::ParityCase c;
  c.layout = testing::kOneRank;
  int made = 0;
  c.make = [&made, &guarded]() -> std::unique_ptr<Model> {
    if (made++ == 0) return std::make_unique<Gpt>(HostReferenceGpt(), guarded);
    return std::make_unique<Gpt>(HostReferenceGpt());
  };
  c.cfg = BaseConfig(testing::kOneRank, M, DType::kF32);
  c.ref_cfg = BaseConfig(testing::kOneRank, M, DType::kF32);
  c.tol = testing::AdamWTolerances(DType::kF32);
  c.cfg.backend = &guarded;
  c.steps = 3;
  testing::ParityRun run(c);
  std::vector<int64_t> at;
  run.Run([&](const testing::StepDiff&) { at.push_back(guarded.host_waits()); });
  return at.size() == 3 ? at[2] - at[1] : -1;
}

// A microbatch costs the host no wait for the device: its tokens are uploaded behind the queued
// work (Backend::Upload) and its loss stays on the device until the step reads all of them at
// once (Model::KeepLoss / TakeLosses). So a step of 4 microbatches waits as often as one of 1.
TEST(EngineOnBackend, HostWaitsPerStepDoNotGrowWithMicrobatches) {
  if (WorldSize() != 1) GTEST_SKIP() << "one rank (the guard is per process)";
  const int64_t one = HostWaitsPerStep(1), four = HostWaitsPerStep(4);
  EXPECT_GT(one, 0);
  EXPECT_EQ(four, one);
}

// bf16 runtime weights: G casts the main weights to bf16 on the backend, the model widens
// gains and tables and takes bf16 products there (GemmBf16).
TEST(EngineOnBackend, Bf16WeightsOnOneRankNeverTouchedByTheHost) {
  if (WorldSize() != 1) GTEST_SKIP() << "one rank (the guard is per process)";
  for (Optimizer opt : {kAdamW, kMuonBf16}) {
    SCOPED_TRACE(opt.kind == OptimizerKind::kAdamW ? "adamw" : "muon");
    testing::GuardedBackend guarded(nullptr, kDeferred);
    RunOnBackend(guarded, testing::kOneRank, DType::kBF16, nullptr, 3, opt);
  }
}

TEST(EngineOnBackend, MuonPerHeadOnOneRankNeverTouchedByTheHost) {
  if (WorldSize() != 1) GTEST_SKIP() << "one rank (the guard is per process)";
  for (Optimizer opt : {kMuonF32, kMuonBf16}) {
    SCOPED_TRACE(DTypeName(opt.u_dtype));
    testing::GuardedBackend guarded(nullptr, kDeferred);
    RunOnBackend(guarded, testing::kOneRank, DType::kF32, nullptr, 3, opt);
  }
}

TEST(EngineOnBackend, PlainZero3OnTheDirectPathWithDeviceMemory) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  testing::ShmDeviceMemory shm;
  testing::GuardedBackend on_shm(&shm,
                                 kDeferred);  // the CPU backend's ops on the stand-in's memory
  RunOnBackend(on_shm, Layout{W, W, W, W}, DType::kF32, &shm, 3);
}

// The CPU backend's memory is host memory (Backend::host_memory): several ranks run on MPI's
// collectives, no direct path needed (what `sshsdp train --backend cpu` runs).
TEST(EngineOnBackend, PlainZero3OverMpiWithTheCpuBackend) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  for (Optimizer opt : {kAdamW, kMuonBf16}) {
    SCOPED_TRACE(opt.kind == OptimizerKind::kAdamW ? "adamw" : "muon");
    std::unique_ptr<Backend> cpu = MakeBackend("cpu");
    RunOnBackend(*cpu, Layout{W, W, W, W}, DType::kF32, nullptr, 2, opt);
  }
}

// Every (sw, sg, so) layout of this world size with the CPU backend over MPI: the outer phase
// (the replica group's reduce-scatter and all-gather, HSDP's all-reduce) on backend memory.
TEST(EngineOnBackend, EveryLayoutOverMpiWithTheCpuBackend) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  for (const Layout& l : testing::LayoutsFor(W)) {  // bf16 with Muon (fp32 with AdamW: below)
    SCOPED_TRACE(Describe(W, l));
    RunOnBackend(*cpu, l, DType::kBF16, nullptr, 2, kMuonBf16);
  }
}

// The outer phase on device memory, staged through the host: layouts whose runtime groups move
// nothing (sw = sg = 1) — ZeRO-1 over the world, HSDP with a ZeRO-1 replica, plain DDP — on the
// guarded backend, where MPI handed the device's G′ᶻ², Gᶻ¹ or Wᶻ³ would fault; then every
// layout of this world size with the runtime groups on the direct path over the shared-memory
// stand-in device.
TEST(EngineOnBackend, OuterPhaseStagedOnGuardedDeviceMemory) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  std::vector<Layout> layouts = {{1, 1, W, W}, {1, 1, 1, W}};
  if (W % 2 == 0) layouts.push_back({1, 1, 2, W});
  for (const Layout& l : layouts)
    for (DType wdt : {DType::kF32, DType::kBF16}) {  // bf16 with the outer phase not overlapped
      const bool overlap = wdt == DType::kF32;
      SCOPED_TRACE(Describe(W, l) + " " + std::string(DTypeName(wdt)) +
                   (overlap ? "" : " overlap_outer=false"));
      testing::GuardedBackend guarded(nullptr, kDeferred);
      RunOnBackend(guarded, l, wdt, nullptr, 2, overlap ? kAdamW : kMuonBf16, false, overlap);
    }
}

TEST(EngineOnBackend, EveryLayoutOnTheDirectPathWithDeviceMemory) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  for (const Layout& l : testing::LayoutsFor(W)) {  // fp32 with AdamW (bf16 with Muon: above)
    SCOPED_TRACE(Describe(W, l));
    testing::ShmDeviceMemory shm;
    testing::GuardedBackend on_shm(&shm, kDeferred);
    RunOnBackend(on_shm, l, DType::kF32, &shm, 2, kAdamW);
  }
}

// Muon per head with heads cut by the ZeRO-3 shard boundaries: split units' u fragments travel
// to their execution rank and v back, staged through the host, Newton–Schulz on the backend.
TEST(EngineOnBackend, MuonPerHeadPlainZero3WithDeviceMemory) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  for (Optimizer opt : {kMuonF32, kMuonBf16}) {
    SCOPED_TRACE(DTypeName(opt.u_dtype));
    testing::ShmDeviceMemory shm;
    testing::GuardedBackend on_shm(&shm, kDeferred);
    RunOnBackend(on_shm, Layout{W, W, W, W}, DType::kF32, &shm, 3, opt);
  }
}

// bf16 runtime weights on several ranks: the all-gathers move bf16 device buffers.
TEST(EngineOnBackend, Bf16WeightsPlainZero3WithDeviceMemory) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  for (Optimizer opt : {kAdamW, kMuonBf16}) {
    SCOPED_TRACE(opt.kind == OptimizerKind::kAdamW ? "adamw" : "muon");
    testing::ShmDeviceMemory shm;
    testing::GuardedBackend on_shm(&shm, kDeferred);
    RunOnBackend(on_shm, Layout{W, W, W, W}, DType::kBF16, &shm, 3, opt);
  }
}

// A checkpoint's state through the host mirrors: saved (Zero1Fields, every field copied out) and
// restored (written into the load mirrors, UploadZero1Mirrors, RestoreState), as the checkpoint
// writer and loader do.
std::vector<std::vector<float>> SaveState(Engine& e) {
  std::vector<std::vector<float>> out;
  for (const Engine::Zero1Field& f : e.Zero1Fields()) {
    const size_t n = f.data.packed ? f.data.stored() : f.chunk.size();
    out.emplace_back(f.data.data, f.data.data + n);
  }
  e.ReleaseZero1Mirrors();
  return out;
}

void RestoreState(Engine& e, const std::vector<std::vector<float>>& saved, int64_t step) {
  std::vector<Engine::Zero1Field> fields = e.Zero1Fields(/*read_state=*/false);
  ASSERT_EQ(fields.size(), saved.size());
  for (size_t i = 0; i < fields.size(); ++i)
    std::copy(saved[i].begin(), saved[i].end(), fields[i].data.data);
  e.UploadZero1Mirrors();
  e.RestoreState(step);
}

// The engine's state paths on memory the host cannot touch, whose ops queue like a GPU stream's:
// an evaluation between steps (its forward runs the deferred outer all-gathers), a checkpoint
// saved and restored through the host mirrors after a step it must undo, and consolidated
// weights out and back in (GatherMainWeights / LoadMainWeights) — against the same engine on
// the CPU backend, bit for bit (the same CPU ops underneath): one rank, and on several the
// outer phase staged (sw = sg = 1, ZeRO-1 across the world); Muon per head and AdamW.
TEST(EngineOnBackend, StatePathsOnDeferredGuardedMemoryMatchTheCpuBackend) {
  const int W = WorldSize();
  auto world = MpiCommunicator::World(W);
  const int rank = world->rank();
  const Layout l = W == 1 ? testing::kOneRank : Layout{1, 1, W, W};
  auto batch = [rank](int step) {
    return BatchFn([=](int mb, int32_t* tokens, int32_t* targets) {
      for (int i = 0; i < 2 * 8; ++i) {
        tokens[i] = (rank * 13 + step * 7 + mb * 5 + i * 3) % 61;
        targets[i] = (tokens[i] * 3 + 1) % 61;
      }
    });
  };
  for (DType wdt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(Describe(W, l) + " " + std::string(DTypeName(wdt)));
    testing::GuardedBackend guarded(nullptr, kDeferred);
    std::unique_ptr<Backend> cpu = MakeBackend("cpu");
    Gpt model_a(HostReferenceGpt(), guarded), model_b(HostReferenceGpt(), *cpu);
    EngineConfig ca = testing::MuonEngineConfig(l, 2, wdt, UnitRule::kHead, DType::kBF16);
    EngineConfig cb = ca;
    ca.backend = &guarded;
    cb.backend = cpu.get();
    Engine a(model_a, *world, ca), b(model_b, *world, cb);
    a.InitWeights(7);
    b.InitWeights(7);
    // Every step stages one step's outer phase, wherever its all-gather ran (an evaluation's
    // forward carries it into the next step's count, as a restore or load re-arms it).
    const uint64_t staged = StagedBytesPerStep(a, wdt);
    EXPECT_EQ(staged > 0, W > 1);
    auto step_both = [&](int s) {
      const StepStats x = a.Step(batch(s)), y = b.Step(batch(s));
      EXPECT_EQ(x.loss, y.loss) << "step " << s;
      EXPECT_EQ(x.grad_norm, y.grad_norm) << "step " << s;
      EXPECT_EQ(x.counters.staged_bytes, staged) << "step " << s;
      ExpectHandOffs(a, x.counters, 2, ca.overlap_outer);  // step 2: the evaluation's gathers
    };
    step_both(1);
    EXPECT_EQ(a.Evaluate(batch(100), 2), b.Evaluate(batch(100), 2));
    step_both(2);
    const std::vector<std::vector<float>> saved = SaveState(a);
    const double lost = a.Step(batch(3)).loss;  // undone by the restore
    EXPECT_TRUE(std::isfinite(lost));
    RestoreState(a, saved, 2);
    step_both(3);
    testing::ExpectWeightsBitEqual(a, b);
    // Loading weights also zeroes the optimizer state and the step (--init-weights): both.
    const std::map<std::string, std::vector<float>> w = b.GatherMainWeights();
    a.LoadMainWeights(w);
    b.LoadMainWeights(w);
    step_both(4);
    testing::ExpectWeightsBitEqual(a, b);
    EXPECT_TRUE(a.StateIsFinite());
  }
}

TEST(EngineOnBackend, OnTheCudaBackend) {
  std::string skip;
  std::unique_ptr<Backend> gpu = testing::TestGpuOrSkip(&skip);
  if (!gpu) GTEST_SKIP() << skip;
  // A head wider than the CUDA attention kernels take is refused when the model is built,
  // before an engine (and any collective) exists.
  GptConfig wide = TestGpt();
  wide.n_head = 1;
  wide.d_model = 288;
  try {
    Gpt refused(wide, *gpu);
    ADD_FAILURE() << "a 288-wide head was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("head widths up to 256, this model's is 288"),
              std::string::npos)
        << e.what();
  }
  const int W = WorldSize();
  for (DType wdt : {DType::kF32, DType::kBF16})
    for (Optimizer opt : {kAdamW, kMuonF32, kMuonBf16}) {
      SCOPED_TRACE(
          fmt::format("{} weights, {}", DTypeName(wdt),
                      opt.kind == OptimizerKind::kAdamW ? "adamw" : DTypeName(opt.u_dtype)));
      if (W == 1) {
        RunOnBackend(*gpu, testing::kOneRank, wdt, nullptr, 3, opt);
      } else {
        std::unique_ptr<DirectDeviceMemory> ipc = MakeCudaDirectMemory(*gpu);
        RunOnBackend(*gpu, Layout{W, W, W, W}, wdt, ipc.get(), 3, opt);
      }
    }
  // The outer phase on the GPU, staged through host memory: ZeRO-1 across the ranks and DDP
  // (sw = sg = 1: no runtime collective, so ranks may share the GPU without CUDA IPC).
  if (W > 1)
    for (const Layout& l : {Layout{1, 1, W, W}, Layout{1, 1, 1, W}}) {
      SCOPED_TRACE("outer phase staged, " + Describe(W, l));
      RunOnBackend(*gpu, l, DType::kBF16, nullptr, 3, kMuonBf16);
    }
  // The runtime collectives over NCCL: one rank, or one GPU per rank (NCCL < 2.30 refuses
  // ranks sharing a GPU, which the direct path above covers).
  const bool nccl = NcclCompiled() && !NcclVersion().starts_with("not loaded");
  if (nccl && (W == 1 || CudaDeviceCount() >= W)) {
    SCOPED_TRACE("comm_path=nccl");
    RunOnBackend(*gpu, W == 1 ? testing::kOneRank : Layout{W, W, W, W}, DType::kBF16, nullptr, 3,
                 kMuonBf16, /*nccl=*/true);
  }
}

TEST(EngineOnBackend, RefusesWhatIsNotBuiltByName) {
  auto world = MpiCommunicator::World(WorldSize());
  const int W = WorldSize();
  Gpt model(HostReferenceGpt(), Cpu());
  testing::GuardedBackend device;  // not host memory, like a GPU's
  auto refused = [&](EngineConfig cfg, const std::string& what, Backend* b = &Cpu()) {
    cfg.backend = b;
    try {
      Engine e(model, *world, cfg);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  EngineConfig bf16_reduce = BaseConfig(testing::LayoutsFor(W).front(), 1, DType::kF32);
  bf16_reduce.reduce = ReduceMode::kBf16Fp32;
  refused(bf16_reduce, "--reduce fp32", &device);  // host memory reduces in bf16 too
  EngineConfig nccl = BaseConfig(testing::LayoutsFor(W).front(), 1, DType::kF32);
  nccl.comm_path = CommPath::kNccl;
  refused(nccl, "--comm-path nccl moves device buffers");  // the CPU backend: host memory
  try {                                                    // and the engine's own one
    Gpt host_model(TestGpt());
    Engine e(host_model, *world, nccl);
    ADD_FAILURE() << "the engine's own CPU backend accepted comm_path=nccl";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("backend cpu (host memory)"), std::string::npos)
        << e.what();
  }
  if (W > 1) {
    refused(BaseConfig(Layout{W, W, W, W}, 1, DType::kF32), "comm_path=direct", &device);
    // The runtime ZeRO-2 group moves device memory every microbatch (sw = 1 < sg).
    refused(BaseConfig(Layout{1, W, W, W}, 1, DType::kF32), "ZeRO-3 / ZeRO-2 groups", &device);
  }
}

TEST(EngineBackendGpt, RefusesMixedViewsByName) {
  Gpt model(HostReferenceGpt(), Cpu());
  std::vector<int32_t> tokens(2 * 8, 1);
  model.SetBatch(tokens.data(), tokens.data(), 2, 8);
  std::vector<uint16_t> w(1 << 16);
  auto refused = [&](const std::vector<TensorRef>& v, const std::string& what) {
    try {
      model.Forward(0, v);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const PlanError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // The embeddings stay bf16 under MXFP8 (engine_backend_mx_test refuses blocks without S′).
  refused({{w.data(), DType::kE4M3}, {w.data(), DType::kE4M3}}, "must be non-null fp32 or bf16");
  refused({{w.data(), DType::kBF16}, {w.data(), DType::kF32}}, "in one dtype");
  EXPECT_THROW(model.Forward(2, {}), PlanError);  // out of order
}

}  // namespace
}  // namespace sshsdp
