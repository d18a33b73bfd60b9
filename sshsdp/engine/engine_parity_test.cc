// Engine parity (the paper's correctness method): multi-rank training for several steps
// equals single-process training of the same logical update — same model, same global
// batch per step, same initial weights — for every (sw, sg, so) layout valid at this world
// size, fp32 and bf16 runtime weights, several microbatches, including HSDP replicas and
// simulated nodes. The reference runs in the same process on a one-rank communicator with
// W·M microbatches. Also asserts the deterministic counters: fused gradient accumulation
// (0 add passes), 0 bytes copied on the weight and gradient paths, exact communicated bytes.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"
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

// Whether layout l has an outer reduction (replica reduce-scatter or HSDP all-reduce) and an
// outer all-gather.
bool HasOuterReduce(const Layout& l) { return l.so > l.sg || WorldSize() > l.so; }
bool HasOuterGather(const Layout& l) { return l.so > l.sw; }
// f(layout) for each standard layout at this world size with an outer phase, under its
// SCOPED_TRACE; the test is skipped, by name, where there is none (W = 1).
void ForOuterPhaseLayouts(const std::function<void(const Layout&)>& f) {
  const int W = WorldSize();
  std::vector<Layout> layouts;
  for (const Layout& l : LayoutsFor(W))
    if (HasOuterReduce(l) || HasOuterGather(l)) layouts.push_back(l);
  if (layouts.empty()) GTEST_SKIP() << "no layout at W=" << W << " has an outer phase";
  for (const Layout& l : layouts) {
    SCOPED_TRACE(Describe(W, l));
    f(l);
  }
}

void RunParity(const Layout& l, DType wdt, int M, bool reshard, bool prefetch,
               bool overlap_outer = true) {
  testing::ParityCase c;
  c.layout = l;
  c.make = testing::GptOf(TestGpt());
  c.cfg = BaseConfig(l, M, wdt);
  c.cfg.reshard_after_forward = reshard;
  c.cfg.prefetch = prefetch;
  c.cfg.overlap_outer = overlap_outer;
  c.ref_cfg = BaseConfig(testing::kOneRank, M * WorldSize(), wdt);
  c.tol = testing::AdamWTolerances(wdt);
  testing::ParityRun run(c);
  // Exact runtime bytes: per microbatch each group is gathered in forward and (except the
  // last, kept for backward) again in backward; each group's gradient is reduce-scattered.
  uint64_t ag_bytes = 0, rs_bytes = 0;
  const Model& model = run.model();
  const int n = model.num_groups();
  for (int g = 0; g < n; ++g) {
    GroupLayout L = BuildGroupLayout(g, model.GroupParams(g), wdt, l.so);
    uint64_t gathers = reshard ? (g + 1 < n ? 2 : 1) : 1;
    ag_bytes += gathers * (l.sw - 1) * (L.list.padded_numel() / l.sw) * DTypeSize(wdt);
    rs_bytes += static_cast<uint64_t>(l.sg - 1) * (L.list.padded_numel() / l.sg) * 4;
  }
  run.Run([&](const testing::StepDiff& d) {
    const StepCounters& c = d.dist.counters;
    EXPECT_EQ(c.add_passes, 0u);
    // Microbatches 2..M of every group accumulate inside the reduce-scatter (or backward).
    EXPECT_EQ(c.fused_accumulations, static_cast<uint64_t>((M - 1) * n));
    EXPECT_EQ(c.bytes_copied, 0u);
    EXPECT_EQ(c.runtime_comm.total(), M * (ag_bytes + rs_bytes));
    EXPECT_EQ(c.weight_preps, wdt == DType::kBF16 ? static_cast<uint64_t>(n) : 0u);
    // Overlapped outer phase: per group its outer reduction queued during backward and its
    // outer all-gather (from the last update) queued at its first gather of this step.
    const uint64_t outer =
        overlap_outer ? static_cast<uint64_t>(n) * (HasOuterReduce(l) + HasOuterGather(l)) : 0;
    EXPECT_EQ(c.outer_overlapped, outer);
  });
}

TEST(EngineParity, AllLayoutsFp32) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunParity(l, DType::kF32, 2, true, true);
  }
}

TEST(EngineParity, AllLayoutsBf16) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    RunParity(l, DType::kBF16, 3, true, true);
  }
}

TEST(EngineParity, KeepGatheredWeightsAndNoPrefetch) {
  const int W = WorldSize();
  auto layouts = LayoutsFor(W);
  SCOPED_TRACE(fmt::format("W={}", W));
  RunParity(layouts.front(), DType::kBF16, 2, /*reshard=*/false, /*prefetch=*/false);
}

TEST(EngineParity, OuterPhaseInUpdatePhase) {
  // overlap_outer off: the same collectives on the main thread in the update phase.
  ForOuterPhaseLayouts(
      [](const Layout& l) { RunParity(l, DType::kBF16, 2, true, true, /*overlap_outer=*/false); });
}

TEST(EngineParity, OuterPhaseOverlapChangesNoBit) {
  // The same collectives on the same data, only on another thread and at another time: the
  // overlapped outer phase against the update-phase one on the same world, bit for bit —
  // losses, norms, the outer bytes (the next step counts the deferred all-gather) and the
  // final main weights.
  ForOuterPhaseLayouts([](const Layout& l) {
    testing::ParityCase c;
    c.layout = l;
    c.make = testing::GptOf(TestGpt());
    c.cfg = BaseConfig(l, 2, DType::kBF16);
    c.ref_cfg = c.cfg;
    c.ref_cfg.overlap_outer = false;
    c.reference = testing::Reference::kSameWorld;
    c.tol = testing::kNoneCompared;  // compared bit for bit below
    testing::ParityRun run(c);
    run.Run([&](const testing::StepDiff& d) {
      EXPECT_EQ(d.dist.loss, d.ref.loss) << "step " << d.step;
      EXPECT_EQ(d.dist.grad_norm, d.ref.grad_norm) << "step " << d.step;
      EXPECT_GT(d.dist.counters.outer_overlapped, 0u);
      EXPECT_EQ(d.ref.counters.outer_overlapped, 0u);
      EXPECT_EQ(d.dist.counters.update_comm.total(), d.ref.counters.update_comm.total());
    });
    testing::ExpectWeightsBitEqual(run.engine(), run.ref());
  });
}

TEST(Engine, RejectsLayoutNotMatchingWorld) {
  auto world = MpiCommunicator::World(1);
  const int W = world->size();
  Gpt model(TestGpt());
  EngineConfig cfg = BaseConfig({1, 1, W + 1, 1}, 1, DType::kBF16);
  try {
    Engine e(model, *world, cfg);
    ADD_FAILURE() << "accepted so > world";
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("so={}", W + 1)), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sshsdp
