// MXFP8 runtime weights with the engine on a device backend (issue 19: "keep MXFP8 as the stored
// and communicated format and dequantize for the GEMM on sm_90"). G quantizes the ZeRO-1 main
// weights on the backend band by band (mx_weights.h), the codes move as the weights do (E4M3,
// one byte), S stays on the host and gathers over MPI, Tw relays it out row-major and S′ goes to
// the backend, where Gpt dequantizes each weight for its GEMMs
// (Backend::MxDequantizeRows).
//
//  * On the CPU backend (host memory, MPI's collectives) at every (sw, sg, so) layout of this
//    world size: the same losses, gradient norms, main weights, codes and scales as the host
//    engine training the host Gpt with MXFP8 weights on the same ranks — bit for bit — and the
//    same communication, G and Tw counters (AdamW, and Muon per head).
//  * On a backend whose memory faults when the host touches it and whose ops queue like a GPU
//    stream (testing/guarded_backend.h): one rank; and on several every layout with the
//    runtime groups on the direct path over the shared-memory stand-in device (the outer phase
//    staged through the host). There the gathered codes and S′ equal quantizing the engine's own
//    consolidated main weights unsharded, and training is bit for bit the host engine's on the
//    same ranks and path.
//  * MXFP8 on the direct path in host memory (S on MPI groups of its own there too): the host
//    engine against the collective path (one step), the CPU backend against the host engine
//    (bit for bit); ② with it is refused by name.
//  * On a GPU (SSHSDP_TEST_BACKEND=cuda): the same comparison as on guarded memory.
//  * What is refused, by name: another scale layout on a device; MXFP8 views without row-major
//    scales in the model.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/testing/guarded_backend.h"
#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/testing/shm_device_memory.h"
#include "sshsdp/device/cuda_direct_memory.h"
#include "sshsdp/device/testing/device_mpi_test.h"
#include "sshsdp/engine/plan.h"
#include "sshsdp/engine/testing/parity_harness.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/numerics/mx.h"
#include "sshsdp/numerics/scale_layout.h"
#include "sshsdp/update/update_unit.h"

namespace sshsdp {
namespace {

using testing::Describe;
using testing::Layout;
using testing::TestGpt;
using testing::WorldSize;

constexpr bool kDeferred = true;

// TestGpt with a vocabulary whose bf16 embedding table (1000 x 24 x 2 bytes) is larger than an
// MXFP8 block (~7,000 one-byte codes): buffers sized by the blocks' dtype would be too small
// for the groups that stay bf16.
constexpr int kVocab = 1000;
GptConfig MxGpt() {
  GptConfig c = TestGpt();
  c.vocab = kVocab;
  return c;
}

// The host Gpt the backend's is compared with: attention in fp32, as the backends' attention.
GptConfig HostReferenceGpt() {
  GptConfig c = MxGpt();
  c.bf16_attention = false;
  return c;
}

EngineConfig MxConfig(const Layout& l, bool muon) {
  EngineConfig c =
      muon ? testing::MuonEngineConfig(l, 2, DType::kE4M3, UnitRule::kHead, DType::kBF16)
           : testing::BaseConfig(l, 2, DType::kE4M3);
  c.scale_layout = ScaleLayout::kRowMajor;
  return c;
}

// The engine's gathered codes and S′ of every MXFP8 runtime weight equal quantizing its own
// consolidated main weights unsharded and relaying their scales out row-major.
void ExpectCodesOfTheMainWeights(Engine& eng, const Model& model) {
  EXPECT_GT(testing::ExpectMxOfTheMainWeights(eng, model, ScaleLayout::kRowMajor), 0u);
}

TEST(EngineMxOnBackend, CpuBackendEqualsTheHostEngineBitForBit) {
  const int W = WorldSize();
  std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  for (bool muon : {false, true})
    for (const Layout& l : testing::LayoutsFor(W)) {
      SCOPED_TRACE(Describe(W, l) + (muon ? " muon" : " adamw"));
      testing::ParityCase c;
      c.layout = l;
      int made = 0;
      c.make = [&made, &cpu]() -> std::unique_ptr<Model> {
        if (made++ == 0) return std::make_unique<Gpt>(HostReferenceGpt(), *cpu);
        return std::make_unique<Gpt>(HostReferenceGpt());
      };
      c.cfg = MxConfig(l, muon);
      c.cfg.backend = cpu.get();
      c.ref_cfg = MxConfig(l, muon);
      c.reference = testing::Reference::kSameWorld;
      c.vocab = kVocab;
      c.tol = {0, 0, testing::kNotCompared};  // the weights: bit for bit, below
      c.steps = 2;
      testing::ParityRun run(c);
      run.Run([&](const testing::StepDiff& d) {
        const StepCounters &a = d.dist.counters, &b = d.ref.counters;
        EXPECT_EQ(a.runtime_comm.total(), b.runtime_comm.total());
        EXPECT_EQ(a.update_comm.total(), b.update_comm.total());
        EXPECT_EQ(a.weight_preps, b.weight_preps);
        EXPECT_EQ(a.scale_relayouts, b.scale_relayouts);
        EXPECT_GT(a.scale_relayouts, 0u);
        EXPECT_EQ(a.mx_split_bands, b.mx_split_bands);
        EXPECT_EQ(a.mx_p2p_bytes, b.mx_p2p_bytes);
        testing::ExpectWeightsBitEqual(run.engine(), run.ref());
      });
      const auto mine = run.engine().GatherMxWeights(), theirs = run.ref().GatherMxWeights();
      EXPECT_FALSE(mine.empty());
      ASSERT_EQ(mine.size(), theirs.size());
      for (const auto& [name, w] : mine) {
        EXPECT_EQ(w.codes, theirs.at(name).codes) << name;
        EXPECT_EQ(w.scales, theirs.at(name).scales) << name;
      }
      // The plan of a backend run (built without one) accounts what the engine allocated
      // there: S′ and the band scales on the backend, the executors' roots kept between steps.
      const RunPlan plan = PlanRun(run.model(), run.W(), c.cfg);
      const auto& used = run.engine().memory().by_category();
      for (const char* cat : {"scales", "update_temporaries", "weights", "optimizer_state"}) {
        const auto it = plan.ranks[run.rank()].memory.find(cat);
        EXPECT_EQ(it == plan.ranks[run.rank()].memory.end() ? 0 : it->second,
                  used.count(cat) ? used.at(cat).peak : 0)
            << cat;
      }
    }
}

// What the outer phase stages per step (engine_backend_gpt_test.cc's StagedBytesPerStep) with
// MXFP8 blocks: their codes are one byte, the embedding and head groups bf16.
uint64_t StagedBytesPerStep(Engine& e, int num_groups) {
  const Topology& t = e.topology();
  const uint64_t r = t.so() / t.sg(), a = t.so() / t.sw(), h = t.world() / t.so();
  uint64_t bytes = 0;
  for (const Engine::Zero1Field& f : e.Zero1Fields())
    if (f.field == "main") {
      const uint64_t c = f.chunk.size();
      const uint64_t code = f.group == 0 || f.group == num_groups - 1 ? 2 : 1;
      if (r > 1) bytes += (r + 1) * c * 4;
      if (a > 1) bytes += a * c * code;
      if (h > 1) bytes += 2 * c * 4;
    }
  e.ReleaseZero1Mirrors();
  return bytes;
}

// The engine on `device` (with the runtime groups on the direct path over `direct` on several
// ranks) against the host engine on the same ranks and batches.
void RunOnDevice(Backend& device, DirectDeviceMemory* direct, const Layout& l, bool muon,
                 bool exact) {
  const int W = WorldSize();
  testing::ParityCase c;
  c.layout = l;
  int made = 0;
  c.make = [&made, &device]() -> std::unique_ptr<Model> {
    if (made++ == 0) return std::make_unique<Gpt>(HostReferenceGpt(), device);
    return std::make_unique<Gpt>(HostReferenceGpt());
  };
  c.cfg = MxConfig(l, muon);
  c.cfg.backend = &device;
  if (direct) {
    c.cfg.comm_path = CommPath::kDirect;
    c.cfg.direct_device = direct;
  }
  c.ref_cfg = MxConfig(l, muon);
  // The host engine on the same path: the direct path reduces in its own order, which the host
  // engine's direct path shares (against the collective path, a tiny gradient of the bf16
  // embedding whose sign flips moves AdamW's step by ~lr).
  if (direct) c.ref_cfg.comm_path = CommPath::kDirect;
  c.reference = testing::Reference::kSameWorld;
  c.vocab = kVocab;
  if (exact) {  // the CPU's ops underneath, the same reduction order: bit for bit
    c.tol = {0, 0, testing::kNotCompared};
  } else {  // a GPU sums in its own order
    c.tol_at = testing::MxTolerances;
  }
  c.steps = 3;
  testing::ParityRun run(c);
  ExpectCodesOfTheMainWeights(run.engine(), run.model());
  const uint64_t staged = W > 1 ? StagedBytesPerStep(run.engine(), run.model().num_groups()) : 0;
  run.Run([&](const testing::StepDiff& d) {
    EXPECT_EQ(d.dist.counters.staged_bytes, staged);
    EXPECT_EQ(d.dist.counters.runtime_comm.total(), d.ref.counters.runtime_comm.total());
    EXPECT_EQ(d.dist.counters.mx_p2p_bytes, d.ref.counters.mx_p2p_bytes);
    EXPECT_EQ(d.dist.counters.scale_relayouts, d.ref.counters.scale_relayouts);
    if (exact) testing::ExpectWeightsBitEqual(run.engine(), run.ref());
  });
  ExpectCodesOfTheMainWeights(run.engine(), run.model());
}

// On guarded memory (the direct path's shared-memory stand-in on several ranks).
void RunOnGuardedDevice(const Layout& l, bool muon) {
  testing::ShmDeviceMemory shm;
  testing::GuardedBackend device(WorldSize() > 1 ? &shm : nullptr, kDeferred);
  RunOnDevice(device, WorldSize() > 1 ? &shm : nullptr, l, muon, /*exact=*/true);
  EXPECT_GT(device.calls(), 100);
}

TEST(EngineMxOnBackend, OneRankOnGuardedDeviceMemory) {
  if (WorldSize() != 1) GTEST_SKIP() << "one rank (the guard is per process)";
  for (bool muon : {false, true}) {
    SCOPED_TRACE(muon ? "muon" : "adamw");
    RunOnGuardedDevice(testing::kOneRank, muon);
  }
}

TEST(EngineMxOnBackend, EveryLayoutOnGuardedDeviceMemory) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  for (const Layout& l : testing::LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunOnGuardedDevice(l, /*muon=*/l.so % 2 == 1);
  }
}

// S has MPI groups of its own off the collective path too: MXFP8 on the direct path (ZeroSM),
// on the host engine and on the CPU backend, against the host engine's collective path, every
// layout.
TEST(EngineMxOnBackend, HostMemoryOnTheDirectPath) {
  const int W = WorldSize();
  if (W == 1) GTEST_SKIP() << "several ranks";
  std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  for (Backend* b : {static_cast<Backend*>(nullptr), cpu.get()})
    for (const Layout& l : testing::LayoutsFor(W)) {
      SCOPED_TRACE(Describe(W, l) + (b ? " backend cpu" : " host engine"));
      testing::ParityCase c;
      c.layout = l;
      int made = 0;
      c.make = [&made, b]() -> std::unique_ptr<Model> {
        if (made++ == 0 && b) return std::make_unique<Gpt>(HostReferenceGpt(), *b);
        return std::make_unique<Gpt>(HostReferenceGpt());
      };
      c.cfg = MxConfig(l, /*muon=*/false);
      c.cfg.backend = b;
      c.cfg.comm_path = CommPath::kDirect;
      c.ref_cfg = MxConfig(l, false);
      c.reference = testing::Reference::kSameWorld;
      c.vocab = kVocab;
      if (b) {  // the CPU backend against the host engine, both on the direct path
        c.ref_cfg.comm_path = CommPath::kDirect;
        c.tol = {0, 0, testing::kNotCompared};
        c.steps = 2;
      } else {  // against the collective path, which sums in another order: one step (an
        // AdamW step on a tiny gradient whose sign flips would move a weight by ~lr)
        c.tol = {1e-5, 1e-4, testing::kNotCompared};
        c.steps = 1;
      }
      testing::ParityRun run(c);
      ExpectCodesOfTheMainWeights(run.engine(), run.model());
      run.Run([&](const testing::StepDiff& d) {
        EXPECT_EQ(d.dist.counters.runtime_comm.total(), d.ref.counters.runtime_comm.total());
        EXPECT_EQ(d.dist.counters.update_comm.total(), d.ref.counters.update_comm.total());
        if (b) testing::ExpectWeightsBitEqual(run.engine(), run.ref());
      });
    }
}

// With SSHSDP_TEST_BACKEND=cuda (scripts/gpu_check.sh; ctest's engine_backend_mx_test_cuda_np*,
// label gpu, skipped without one): this rank's GPU, several ranks sharing it over CUDA IPC —
// plain ZeRO-3, and ZeRO-1 across the ranks with the outer phase staged.
TEST(EngineMxOnBackend, OnTheCudaBackend) {
  std::string skip;
  std::unique_ptr<Backend> gpu = testing::TestGpuOrSkip(&skip);
  if (!gpu) GTEST_SKIP() << skip;
  const int W = WorldSize();
  for (bool muon : {false, true}) {
    SCOPED_TRACE(muon ? "muon" : "adamw");
    if (W == 1) {
      RunOnDevice(*gpu, nullptr, testing::kOneRank, muon, false);
      continue;
    }
    std::unique_ptr<DirectDeviceMemory> ipc = MakeCudaDirectMemory(*gpu);
    RunOnDevice(*gpu, ipc.get(), Layout{W, W, W, W}, muon, false);
    RunOnDevice(*gpu, nullptr, Layout{1, 1, W, W}, muon, false);
  }
}

// --mx-gemm bf16 (GptConfig::mx_gemm = kBF16): MXFP8 blocks dequantized to bf16 run the
// model's bf16 path — forward, loss and every gradient bit for bit those of bf16 weights holding
// the dequantized values — and differ from the fp32 GEMMs (so the switch is not a no-op).
TEST(EngineMxOnBackend, Bf16GemmsEqualBf16WeightsHoldingTheDequantizedValues) {
  std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  GptConfig c16 = HostReferenceGpt();
  c16.mx_gemm = DType::kBF16;
  Gpt mx(c16, *cpu), ref(HostReferenceGpt(), *cpu), f32(HostReferenceGpt(), *cpu);
  const int B = 2, T = 8, n = mx.num_groups();
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    tokens[i] = (i * 7 + 3) % kVocab;
    targets[i] = (i * 5 + 1) % kVocab;
  }
  for (Gpt* m : {&mx, &ref, &f32}) m->SetBatch(tokens.data(), targets.data(), B, T);
  std::vector<std::vector<uint8_t>> bytes;  // every view's storage
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<TensorRef>> w_mx(n), w_ref(n), g_mx(n), g_ref(n), g_f32(n);
  uint32_t seed = 1;
  auto next = [&seed] { return seed = seed * 1664525u + 1013904223u; };
  for (int g = 0; g < n; ++g)
    for (const RuntimeParamSpec& rp : mx.GroupParams(g)) {
      int64_t rows = 0, cols = 0;
      MatrixView(rp.shape, &rows, &cols);
      const size_t count = static_cast<size_t>(rows * cols);
      std::vector<float> values(count);
      std::vector<uint16_t> b16(count);
      if (g > 0 && g + 1 < n) {  // an MXFP8 block weight: codes, per-row scales 2^-9..2^-6
        auto& q = bytes.emplace_back(count);
        for (uint8_t& c : q) {  // every code but NaN's (S.1111.111)
          c = static_cast<uint8_t>(next() >> 24);
          if ((c & 0x7F) == 0x7F) c = 0x7E;
        }
        auto& s = bytes.emplace_back(static_cast<size_t>(rows * MxBlocks(cols)));
        for (uint8_t& c : s) c = static_cast<uint8_t>(118 + (next() >> 30));
        MxDequantizeActivation(q.data(), s.data(), rows, cols, values.data());
        w_mx[g].push_back({q.data(), DType::kE4M3, s.data(), ScaleLayout::kRowMajor});
      } else {
        for (float& v : values) v = 0.02f * (static_cast<float>(next() >> 8) / 16777216.0f - 0.5f);
      }
      for (size_t i = 0; i < count; ++i) b16[i] = FloatToBf16(values[i]).bits;
      auto& r = bytes.emplace_back(count * 2);
      std::memcpy(r.data(), b16.data(), count * 2);
      w_ref[g].push_back({r.data(), DType::kBF16});
      if (g == 0 || g + 1 == n) w_mx[g].push_back(w_ref[g].back());
      for (auto* gv : {&g_mx[g], &g_ref[g], &g_f32[g]})
        gv->push_back({grads.emplace_back(count).data(), DType::kF32});
    }
  for (int g = 0; g < n; ++g) {
    mx.Forward(g, w_mx[g]);
    ref.Forward(g, w_ref[g]);
    f32.Forward(g, w_mx[g]);
  }
  EXPECT_EQ(mx.Loss(), ref.Loss());
  EXPECT_NE(mx.Loss(), f32.Loss());
  for (int g = n - 1; g >= 0; --g) {
    mx.Backward(g, w_mx[g], g_mx[g], GradWrite::kOverwrite);
    ref.Backward(g, w_ref[g], g_ref[g], GradWrite::kOverwrite);
    f32.Backward(g, w_mx[g], g_f32[g], GradWrite::kOverwrite);
    for (size_t i = 0; i < g_mx[g].size(); ++i)
      EXPECT_EQ(std::memcmp(g_mx[g][i].data, g_ref[g][i].data,
                            static_cast<size_t>(NumElements(mx.GroupParams(g)[i].shape)) * 4),
                0)
          << "group " << g << " view " << i;
  }
  GptConfig e4m3 = HostReferenceGpt();
  e4m3.mx_gemm = DType::kE4M3;
  EXPECT_THROW(Gpt(e4m3, *cpu), ConfigError);
}

TEST(EngineMxOnBackend, RefusesWhatTheDevicePathCannotReadByName) {
  auto world = MpiCommunicator::World(WorldSize());
  testing::GuardedBackend device;
  Gpt model(HostReferenceGpt(), device);
  EngineConfig cfg = MxConfig(testing::LayoutsFor(WorldSize()).front(), false);
  cfg.backend = &device;
  cfg.scale_layout = ScaleLayout::kCublasSwizzle;
  try {
    Engine e(model, *world, cfg);
    ADD_FAILURE() << "accepted cublas_swizzle scales on a device";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--scale-layout row_major"), std::string::npos)
        << e.what();
  }
  // ② gathers fp32 shards into transient (unregistered) buffers: collective path only.
  Gpt host(HostReferenceGpt());
  EngineConfig every = MxConfig(testing::LayoutsFor(WorldSize()).front(), false);
  every.redundancies.cast_every_gather = true;
  every.comm_path = CommPath::kDirect;
  try {
    Engine e(host, *world, every);
    ADD_FAILURE() << "accepted ② with MXFP8 on the direct path";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("runs on the collective comm path, got direct"),
              std::string::npos)
        << e.what();
  }
  // The model: MXFP8 views need scales, and a backend without every Tw layout (the device
  // here) reads row_major ones only; the CPU reads them all.
  std::unique_ptr<Backend> cpu = MakeBackend("cpu");
  Gpt host_model(HostReferenceGpt(), *cpu);
  EXPECT_FALSE(model.ReadsScaleLayout(ScaleLayout::kCublasSwizzle));
  EXPECT_TRUE(model.ReadsScaleLayout(ScaleLayout::kRowMajor));
  EXPECT_TRUE(host_model.ReadsScaleLayout(ScaleLayout::kCublasSwizzle));
  std::vector<int32_t> tokens(2 * 8, 1);
  host_model.SetBatch(tokens.data(), tokens.data(), 2, 8);
  std::vector<float> embed(kVocab * 24);
  host_model.Forward(0, {{embed.data(), DType::kF32}, {embed.data(), DType::kF32}});
  std::vector<uint8_t> codes(1 << 12);
  std::vector<TensorRef> v(6, TensorRef{codes.data(), DType::kE4M3, nullptr});
  EXPECT_THROW(host_model.Forward(1, v), PlanError);  // no scales
}

}  // namespace
}  // namespace sshsdp
