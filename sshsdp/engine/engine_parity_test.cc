// Engine parity (the paper's correctness method): multi-rank training for several steps
// equals single-process training of the same logical update — same model, same global
// batch per step, same initial weights — for every (sw, sg, so) layout valid at this world
// size, fp32 and bf16 runtime weights, several microbatches, including HSDP replicas and
// simulated nodes. The reference runs in the same process on a one-rank communicator with
// W·M microbatches. Also asserts the deterministic counters: fused gradient accumulation
// (0 add passes), 0 bytes copied on the weight and gradient paths, exact communicated bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/testing/parity_data.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {
namespace {

using testing::MakeBatch;

struct Layout {
  int sw, sg, so, rpn;
};

std::vector<Layout> LayoutsFor(int W) {
  // SSHSDP_TEST_LAYOUT="sw,sg,so,rpn" runs one layout (for debugging a failure).
  if (const char* e = std::getenv("SSHSDP_TEST_LAYOUT")) {
    Layout l{};
    if (std::sscanf(e, "%d,%d,%d,%d", &l.sw, &l.sg, &l.so, &l.rpn) == 4) return {l};
  }
  switch (W) {
    case 1:
      return {{1, 1, 1, 1}};
    case 2:
      return {{2, 2, 2, 2}, {1, 1, 2, 1}};
    case 3:
      return {{3, 3, 3, 3}, {1, 1, 3, 3}};
    case 4:
      return {{2, 2, 4, 2}, {1, 2, 4, 4}, {4, 4, 4, 4}, {2, 2, 2, 2}};
    case 6:
      return {{2, 2, 6, 2}, {3, 3, 3, 3}};
    case 8:
      return {{2, 4, 8, 4}, {2, 2, 4, 2}};
    default:
      return {};
  }
}

GptConfig TestModel() {
  GptConfig c;
  c.vocab = 61;  // odd sizes make buffers and shards uneven
  c.seq_len = 8;
  c.d_model = 24;
  c.n_head = 3;
  c.n_layer = 2;
  return c;
}

EngineConfig BaseConfig(const Layout& l, int M, DType wdt) {
  EngineConfig cfg;
  cfg.sw = l.sw;
  cfg.sg = l.sg;
  cfg.so = l.so;
  cfg.ranks_per_node = l.rpn;
  cfg.microbatches = M;
  cfg.batch_size = 2;
  cfg.seq_len = 8;
  cfg.weight_dtype = wdt;
  cfg.adamw.lr = 3e-3f;
  cfg.adamw.eps = 1e-6f;
  cfg.clip_norm = 0.5f;  // active: exercises the sharded norm
  return cfg;
}

void RunParity(const Layout& l, DType wdt, int M, bool reshard, bool prefetch) {
  auto world = MpiCommunicator::World(l.rpn);
  const int W = world->size(), r = world->rank();
  auto self = world->Split(r, 0);
  const GptConfig gc = TestModel();
  Gpt model(gc), ref_model(gc);
  EngineConfig cfg = BaseConfig(l, M, wdt);
  cfg.reshard_after_forward = reshard;
  cfg.prefetch = prefetch;
  Engine eng(model, *world, cfg);
  EngineConfig rcfg = BaseConfig({1, 1, 1, 1}, M * W, wdt);
  Engine ref(ref_model, *self, rcfg);
  eng.InitWeights(7);
  ref.InitWeights(7);
  int64_t step = 0;
  BatchFn batch = MakeBatch(&step, M, W, r, cfg.batch_size, cfg.seq_len, gc.vocab);
  BatchFn rbatch = MakeBatch(&step, M * W, 1, 0, cfg.batch_size, cfg.seq_len, gc.vocab);
  // Exact runtime bytes: per microbatch each group is gathered in forward and (except the
  // last, kept for backward) again in backward; each group's gradient is reduce-scattered.
  uint64_t ag_bytes = 0, rs_bytes = 0;
  const int n = model.num_groups();
  for (int g = 0; g < n; ++g) {
    GroupLayout L = BuildGroupLayout(g, model.GroupParams(g), wdt, l.so);
    uint64_t gathers = reshard ? (g + 1 < n ? 2 : 1) : 1;
    ag_bytes += gathers * (l.sw - 1) * (L.list.padded_numel() / l.sw) * DTypeSize(wdt);
    rs_bytes += static_cast<uint64_t>(l.sg - 1) * (L.list.padded_numel() / l.sg) * 4;
  }
  // fp32 differs from the reference only by summation order (~1e-7 relative). With bf16
  // runtime weights, a main weight that differs in its last fp32 bits can round to the
  // neighbouring bf16 value (2^-8 relative), so tolerances are wider — still far below the
  // ~lr = 3e-3 error of a wrong update.
  const bool f32 = wdt == DType::kF32;
  const double loss_tol = f32 ? 1e-5 : 2e-4, norm_tol = f32 ? 1e-4 : 2e-3,
               weight_tol = f32 ? 2e-5 : 3e-4;
  for (; step < 3; ++step) {
    StepStats a = eng.Step(batch);
    StepStats b = ref.Step(rbatch);
    EXPECT_NEAR(a.loss, b.loss, loss_tol * std::abs(b.loss)) << "step " << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, norm_tol * b.grad_norm) << "step " << step;
    EXPECT_EQ(a.counters.add_passes, 0u);
    // Microbatches 2..M of every group accumulate inside the reduce-scatter (or backward).
    EXPECT_EQ(a.counters.fused_accumulations, static_cast<uint64_t>((M - 1) * n));
    EXPECT_EQ(a.counters.bytes_copied, 0u);
    EXPECT_EQ(a.counters.runtime_comm.total(), M * (ag_bytes + rs_bytes));
    EXPECT_EQ(a.counters.weight_preps, wdt == DType::kBF16 ? static_cast<uint64_t>(n) : 0u);
    auto wa = eng.GatherMainWeights();
    auto wb = ref.GatherMainWeights();
    ASSERT_EQ(wa.size(), wb.size());
    double worst = 0;
    std::string worst_name;
    for (auto& [name, va] : wa) {
      const auto& vb = wb.at(name);
      ASSERT_EQ(va.size(), vb.size()) << name;
      for (size_t i = 0; i < va.size(); ++i) {
        double d = std::abs(double(va[i]) - vb[i]);
        if (d > worst) worst = d, worst_name = name;
      }
    }
    EXPECT_LT(worst, weight_tol) << "step " << step << " worst param " << worst_name;
  }
}

TEST(EngineParity, AllLayoutsFp32) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunParity(l, DType::kF32, 2, true, true);
  }
}

TEST(EngineParity, AllLayoutsBf16) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn));
    RunParity(l, DType::kBF16, 3, true, true);
  }
}

TEST(EngineParity, KeepGatheredWeightsAndNoPrefetch) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  auto layouts = LayoutsFor(W);
  SCOPED_TRACE(fmt::format("W={}", W));
  RunParity(layouts.front(), DType::kBF16, 2, /*reshard=*/false, /*prefetch=*/false);
}

TEST(Engine, RejectsLayoutNotMatchingWorld) {
  auto world = MpiCommunicator::World(1);
  const int W = world->size();
  Gpt model(TestModel());
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
