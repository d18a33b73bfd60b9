// The engine parity harness shared by the engine tests (parity, baselines, Muon, MoE, direct
// path, MXFP8): layouts per world size, the common test models and EngineConfig, and the
// paper's correctness method — run the distributed engine for N steps next to the same engine
// on a one-rank communicator with W·M microbatches (parity_data.h numbers the samples so both
// see the same global batch) and compare loss, gradient norm and every main weight per step.
//
//   testing::ParityCase c;
//   c.layout = l;
//   c.make = testing::GptOf(testing::TestGpt());
//   c.cfg = testing::BaseConfig(l, M, DType::kBF16);
//   c.ref_cfg = testing::BaseConfig(testing::kOneRank, M * W, DType::kBF16);
//   c.tol = testing::AdamWTolerances(DType::kBF16);
//   testing::ParityRun run(c);           // engines built, weights initialised
//   run.Run([&](const testing::StepDiff& d) { EXPECT_EQ(d.dist.counters.add_passes, 0u); });
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/comm/communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/testing/parity_data.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"

namespace sshsdp::testing {

// One (sw, sg, so) layout with `rpn` simulated ranks per node.
struct Layout {
  int sw, sg, so, rpn;
};

// The single-process reference's layout.
inline constexpr Layout kOneRank{1, 1, 1, 1};

// Layouts at world size W, by W; SSHSDP_TEST_LAYOUT="sw,sg,so,rpn" runs that one layout
// instead (for debugging a failure).
using LayoutTable = std::map<int, std::vector<Layout>>;
std::vector<Layout> LayoutsFrom(int W, const LayoutTable& table);

// The standard layouts of the parity tests (engine_parity, Muon, MoE): HSDP replicas, sw < sg,
// so > sg and simulated nodes, at W = 1, 2, 3, 4, 6, 8; none at other sizes.
std::vector<Layout> LayoutsFor(int W);

// "W=.. sw=.. sg=.. so=.. rpn=.." for SCOPED_TRACE.
std::string Describe(int W, const Layout& l);

// MPI_COMM_WORLD's size.
int WorldSize();

// The test GPT: vocab 61 (unpadded), T = 8, d = 24, 3 heads, 2 layers — odd sizes make buffers and
// shards uneven and cut heads of the packed QKV across shards.
GptConfig TestGpt();
// A MoE model on the test GPT's trunk: 4 experts of width 20, top-2.
MoeConfig TestMoe();

// The common engine configuration: microbatches of B = 2 samples of T = 8 tokens, AdamW
// lr 3e-3 eps 1e-6, clipping at 0.5 (active: exercises the sharded norm).
EngineConfig BaseConfig(const Layout& l, int M, DType wdt);
// BaseConfig with Muon (lr 0.02, weight decay 0.1) on matrices split into `unit`s, u in
// `u_dtype`; AdamW for the rest.
EngineConfig MuonEngineConfig(const Layout& l, int M, DType wdt, UnitRule unit, DType u_dtype);

using ModelFactory = std::function<std::unique_ptr<Model>()>;
ModelFactory GptOf(const GptConfig& c);
ModelFactory MoeOf(const MoeConfig& c);

// Per-step bounds: loss and gradient norm relative to the reference's, weights absolute (the
// largest element difference over every main weight). Negative: not compared.
struct Tolerances {
  double loss = 0, grad_norm = 0, weight = 0;
};
inline constexpr double kNotCompared = -1;
inline constexpr Tolerances kNoneCompared{kNotCompared, kNotCompared, kNotCompared};
// AdamW: fp32 differs from the reference only by summation order (~1e-7 relative). With bf16
// runtime weights, a main weight that differs in its last fp32 bits can round to the
// neighbouring bf16 value (2^-8 relative), so the bounds are wider — still far below the
// ~lr = 3e-3 error of a wrong update.
Tolerances AdamWTolerances(DType wdt);
// Muon: with fp32 weights and fp32 u (`exact`) the distributed run differs by fp32 summation
// order only (times Newton–Schulz's amplification of weak directions): ~1e-6. With bf16 u a
// rounding that differs somewhere in u moves v by ~1e-3 relative on weak directions (muon.h),
// and bf16 runtime weights can round to neighbouring bf16 values; the bound stays far below
// the ~lr·|v| ≈ 5e-3 of a wrong or missing fragment.
Tolerances MuonTolerances(bool exact);
// MXFP8 runtime weights (as tol_at): step 1 runs on identical weights (G is exact; only the
// loss/gradient summation order differs); later main weights differ in their last fp32 bits
// and can land on the neighbouring E4M3 code. Weights within 1e-3 (<< lr = 3e-3 per step).
Tolerances MxTolerances(int64_t step);

// The largest |a - b| over every element of every main weight, and where.
struct WeightDiff {
  double worst = 0;
  std::string param;
};
// Gathers both engines' main weights, asserts the same names and sizes, and expects the worst
// difference below `tol` (message: step and worst parameter).
WeightDiff ExpectWeightsNear(Engine& a, Engine& b, double tol, int64_t step);
// Gathers both engines' main weights and expects the same names, sizes and bits.
void ExpectWeightsBitEqual(Engine& a, Engine& b);
// The engine's gathered MXFP8 codes and S′ of every runtime weight of the groups that consume
// MX equal quantizing its own consolidated main weights unsharded (each update part on its own
// blocks) and relaying the scales out in `layout`; the other groups hold none. Returns how many
// runtime weights it checked.
size_t ExpectMxOfTheMainWeights(Engine& eng, const Model& model, ScaleLayout layout);

// What one step of the pair did.
struct StepDiff {
  int64_t step = 0;
  StepStats dist, ref;
  WeightDiff weights;  // filled only where weights are compared
};

// Against what the distributed engine is compared.
enum class Reference {
  kOneRank,    // the same engine on a one-rank communicator, with ref_cfg (W·M microbatches)
  kSameWorld,  // another engine on the same world and batches, with ref_cfg
};

struct ParityCase {
  Layout layout{};
  ModelFactory make;     // called twice: the distributed and the reference model
  EngineConfig cfg;      // the engine under test
  EngineConfig ref_cfg;  // the reference
  Reference reference = Reference::kOneRank;
  int vocab = 61;  // the models' vocabulary (TestGpt's): tokens of the batches
  int steps = 3;
  uint64_t seed = 7;  // InitWeights of both engines
  Tolerances tol;     // every step, unless tol_at is set
  std::function<Tolerances(int64_t step)> tol_at;
  std::string label;  // prefix of the SSHSDP_TEST_VERBOSE line
};

// Builds the world (layout.rpn ranks per node), the reference's communicator, both models and
// engines, and initialises both engines' weights with `seed`. Run() then steps both with the
// batches of parity_data.h, for `steps` steps; per step it expects loss and gradient norm
// within tolerance, calls `each_step` (batch() and step() still those of the step), then
// compares every main weight (SSHSDP_TEST_VERBOSE=1 prints the worst difference on rank 0).
class ParityRun {
 public:
  explicit ParityRun(const ParityCase& c);
  ParityRun(const ParityRun&) = delete;
  ParityRun& operator=(const ParityRun&) = delete;
  ~ParityRun();

  std::vector<StepDiff> Run(const std::function<void(const StepDiff&)>& each_step = {});

  Communicator& world() { return *world_; }
  int W() const { return W_; }
  int rank() const { return rank_; }
  Model& model() { return *model_; }
  Model& ref_model() { return *ref_model_; }
  template <class M>
  M& model_as() {
    return dynamic_cast<M&>(*model_);
  }
  Engine& engine() { return *eng_; }
  Engine& ref() { return *ref_; }
  const EngineConfig& cfg() const { return c_.cfg; }
  int64_t step() const { return step_; }
  // The distributed engine's batches (this rank's microbatches at step()).
  const BatchFn& batch() const { return batch_; }

 private:
  ParityCase c_;
  std::unique_ptr<Communicator> world_, self_;
  int W_ = 0, rank_ = 0;
  std::unique_ptr<Model> model_, ref_model_;
  std::unique_ptr<Engine> eng_, ref_;
  int64_t step_ = 0;
  BatchFn batch_, ref_batch_;
};

}  // namespace sshsdp::testing
