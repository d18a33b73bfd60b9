// The engine training BackendGptModel (models/backend_gpt_model.h: the GPT's kernels on a
// device backend, here the CPU backend) equals the single-process reference of the same
// logical update with the host Gpt, at every (sw, sg, so) layout of this world size, fp32,
// two microbatches: the model side of the engine on a GPU, run through the engine's real
// schedule (gathers, views of W′ and G′, fused accumulation, reduce-scatters, the update).
#include <gtest/gtest.h>

#include <memory>

#include "sshsdp/base/error.h"
#include "sshsdp/device/backend.h"
#include "sshsdp/engine/testing/parity_harness.h"
#include "sshsdp/models/backend_gpt_model.h"
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

TEST(EngineBackendGpt, AllLayoutsFp32MatchTheHostGptReference) {
  const int W = WorldSize();
  for (const Layout& l : LayoutsFor(W)) {
    SCOPED_TRACE(Describe(W, l));
    testing::ParityCase c;
    c.layout = l;
    int made = 0;  // the first model is the engine's under test, the second the reference's
    c.make = [&made]() -> std::unique_ptr<Model> {
      if (made++ == 0) return std::make_unique<BackendGptModel>(Cpu(), TestGpt());
      return std::make_unique<Gpt>(TestGpt());
    };
    c.cfg = BaseConfig(l, 2, DType::kF32);
    c.ref_cfg = BaseConfig(testing::kOneRank, 2 * W, DType::kF32);
    c.tol = testing::AdamWTolerances(DType::kF32);
    testing::ParityRun run(c);
    EXPECT_NE(dynamic_cast<BackendGptModel*>(&run.model()), nullptr);
    run.Run([&](const testing::StepDiff& d) {
      EXPECT_EQ(d.dist.counters.add_passes, 0u);
      EXPECT_EQ(d.dist.counters.bytes_copied, 0u);
    });
  }
}

TEST(EngineBackendGpt, RefusesBf16ViewsByName) {
  BackendGptModel model(Cpu(), TestGpt());
  std::vector<int32_t> tokens(2 * 8, 1);
  model.SetBatch(tokens.data(), tokens.data(), 2, 8);
  std::vector<uint16_t> w(1 << 16);
  try {
    model.Forward(0, {{w.data(), DType::kBF16}, {w.data(), DType::kBF16}});
    ADD_FAILURE() << "bf16 weights accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--weight-dtype fp32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.Forward(2, {}), PlanError);  // out of order
}

}  // namespace
}  // namespace sshsdp
