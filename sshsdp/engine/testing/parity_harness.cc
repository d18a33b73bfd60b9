#include "sshsdp/engine/testing/parity_harness.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/numerics/mx.h"
#include "sshsdp/numerics/scale_layout.h"
#include "sshsdp/update/update_unit.h"

namespace sshsdp::testing {

std::vector<Layout> LayoutsFrom(int W, const LayoutTable& table) {
  if (const char* e = std::getenv("SSHSDP_TEST_LAYOUT")) {
    Layout l{};
    if (std::sscanf(e, "%d,%d,%d,%d", &l.sw, &l.sg, &l.so, &l.rpn) == 4) return {l};
  }
  auto it = table.find(W);
  return it == table.end() ? std::vector<Layout>{} : it->second;
}

std::vector<Layout> LayoutsFor(int W) {
  static const LayoutTable kTable = {
      {1, {{1, 1, 1, 1}}},
      {2, {{2, 2, 2, 2}, {1, 1, 2, 1}}},
      {3, {{3, 3, 3, 3}, {1, 1, 3, 3}}},
      {4, {{2, 2, 4, 2}, {1, 2, 4, 4}, {4, 4, 4, 4}, {2, 2, 2, 2}}},
      {6, {{2, 2, 6, 2}, {3, 3, 3, 3}}},
      {8, {{2, 4, 8, 4}, {2, 2, 4, 2}}},
  };
  return LayoutsFrom(W, kTable);
}

std::string Describe(int W, const Layout& l) {
  return fmt::format("W={} sw={} sg={} so={} rpn={}", W, l.sw, l.sg, l.so, l.rpn);
}

int WorldSize() {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  return W;
}

GptConfig TestGpt() {
  GptConfig c;
  c.vocab = 61;
  c.vocab_multiple = 1;  // no padding: the odd table sizes stay odd
  c.seq_len = 8;
  c.d_model = 24;
  c.n_head = 3;
  c.n_layer = 2;
  return c;
}

MoeConfig TestMoe() {
  MoeConfig c;
  c.trunk = TestGpt();
  c.n_expert = 4;
  c.top_k = 2;
  c.d_expert = 20;
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
  cfg.clip_norm = 0.5f;
  return cfg;
}

EngineConfig MuonEngineConfig(const Layout& l, int M, DType wdt, UnitRule unit, DType u_dtype) {
  EngineConfig cfg = BaseConfig(l, M, wdt);
  cfg.optimizer = OptimizerKind::kMuon;
  cfg.muon_unit = unit;
  cfg.muon.lr = 0.02f;
  cfg.muon.weight_decay = 0.1f;
  cfg.muon.u_dtype = u_dtype;
  return cfg;
}

ModelFactory GptOf(const GptConfig& c) {
  return [c] { return std::make_unique<Gpt>(c); };
}

ModelFactory MoeOf(const MoeConfig& c) {
  return [c] { return std::make_unique<MoeGpt>(c); };
}

Tolerances AdamWTolerances(DType wdt) {
  const bool f32 = wdt == DType::kF32;
  return f32 ? Tolerances{1e-5, 1e-4, 2e-5} : Tolerances{2e-4, 2e-3, 3e-4};
}

Tolerances MuonTolerances(bool exact) {
  return exact ? Tolerances{1e-6, 1e-5, 5e-6} : Tolerances{1e-3, 1e-2, 2e-3};
}

Tolerances MxTolerances(int64_t step) {
  return step == 0 ? Tolerances{1e-5, 1e-4, 1e-3} : Tolerances{2e-3, 2e-2, 1e-3};
}

namespace {

// The worst element difference; a fatal failure where names or sizes differ.
void WorstDifference(const std::map<std::string, std::vector<float>>& wa,
                     const std::map<std::string, std::vector<float>>& wb, WeightDiff* out) {
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, va] : wa) {
    auto it = wb.find(name);
    ASSERT_NE(it, wb.end()) << name;
    const std::vector<float>& vb = it->second;
    ASSERT_EQ(va.size(), vb.size()) << name;
    for (size_t i = 0; i < va.size(); ++i) {
      double d = std::abs(double(va[i]) - vb[i]);
      if (d > out->worst) out->worst = d, out->param = name;
    }
  }
}

}  // namespace

WeightDiff ExpectWeightsNear(Engine& a, Engine& b, double tol, int64_t step) {
  WeightDiff d;
  auto wa = a.GatherMainWeights();
  auto wb = b.GatherMainWeights();
  const bool failed_before = ::testing::Test::HasFatalFailure();
  WorstDifference(wa, wb, &d);
  if (!failed_before && ::testing::Test::HasFatalFailure()) return d;
  EXPECT_LT(d.worst, tol) << "step " << step << " worst param " << d.param;
  return d;
}

void ExpectWeightsBitEqual(Engine& a, Engine& b) {
  const auto wa = a.GatherMainWeights(), wb = b.GatherMainWeights();
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, w] : wa) {
    ASSERT_EQ(wb.count(name), 1u) << name;
    ASSERT_EQ(wb.at(name).size(), w.size()) << name;
    EXPECT_EQ(std::memcmp(w.data(), wb.at(name).data(), w.size() * sizeof(float)), 0) << name;
  }
}

size_t ExpectMxOfTheMainWeights(Engine& eng, const Model& model, ScaleLayout layout) {
  const auto main = eng.GatherMainWeights();
  const auto mx = eng.GatherMxWeights();
  size_t checked = 0;
  for (int g = 0; g < model.num_groups(); ++g) {
    if (!model.GroupConsumesMx(g)) continue;
    for (const RuntimeParamSpec& rp : model.GroupParams(g)) {
      EXPECT_EQ(mx.count(rp.name), 1u) << rp.name;
      if (mx.count(rp.name) == 0) continue;
      // Each update part quantized on its own 32x32 blocks, codes in part order; the parts'
      // scale grids relaid out together for the packed operand.
      std::vector<uint8_t> codes;
      std::vector<std::vector<uint8_t>> grids;
      std::vector<MxScaleGrid> parts;
      for (const UpdatePart& part : rp.parts) {
        int64_t rows = 0, cols = 0;
        MatrixView(part.shape, &rows, &cols);
        const std::vector<float>& w = main.at(part.name);
        std::vector<uint8_t> q(w.size());
        grids.emplace_back(MxWeightScaleCount(rows, cols));
        MxQuantizeWeight(w.data(), rows, cols, q.data(), grids.back().data());
        codes.insert(codes.end(), q.begin(), q.end());
        parts.push_back({nullptr, rows, cols, 32});
      }
      for (size_t i = 0; i < parts.size(); ++i) parts[i].scales = grids[i].data();
      std::vector<uint8_t> s(ScaleLayoutBytes(layout, PackedScales(parts, MxOperand::kAsStored)));
      RelayoutPackedScales(parts, MxOperand::kAsStored, layout, s.data(), s.size());
      EXPECT_EQ(mx.at(rp.name).codes, codes) << rp.name;
      EXPECT_EQ(mx.at(rp.name).scales, s) << rp.name << " layout " << ScaleLayoutName(layout);
      ++checked;
    }
  }
  EXPECT_EQ(mx.size(), checked);  // the groups that consume no MX (embeddings, head) hold none
  return checked;
}

ParityRun::ParityRun(const ParityCase& c) : c_(c) {
  world_ = MpiCommunicator::World(c_.layout.rpn);
  W_ = world_->size();
  rank_ = world_->rank();
  const bool one_rank = c_.reference == Reference::kOneRank;
  if (one_rank) self_ = world_->Split(rank_, 0);
  model_ = c_.make();
  ref_model_ = c_.make();
  eng_ = std::make_unique<Engine>(*model_, *world_, c_.cfg);
  const EngineConfig& cfg = c_.cfg;
  const int M = cfg.microbatches;
  batch_ = MakeBatch(&step_, M, W_, rank_, cfg.batch_size, cfg.seq_len, c_.vocab);
  if (one_rank) {
    ref_ = std::make_unique<Engine>(*ref_model_, *self_, c_.ref_cfg);
    ref_batch_ = MakeBatch(&step_, M * W_, 1, 0, cfg.batch_size, cfg.seq_len, c_.vocab);
  } else {
    ref_ = std::make_unique<Engine>(*ref_model_, *world_, c_.ref_cfg);
    ref_batch_ = batch_;
  }
  eng_->InitWeights(c_.seed);
  ref_->InitWeights(c_.seed);
}

ParityRun::~ParityRun() = default;

std::vector<StepDiff> ParityRun::Run(const std::function<void(const StepDiff&)>& each_step) {
  std::vector<StepDiff> out;
  const bool failed_before = ::testing::Test::HasFatalFailure();
  const bool verbose = std::getenv("SSHSDP_TEST_VERBOSE") && rank_ == 0;
  for (step_ = 0; step_ < c_.steps; ++step_) {
    StepDiff d;
    d.step = step_;
    d.dist = eng_->Step(batch_);
    d.ref = ref_->Step(ref_batch_);
    const Tolerances t = c_.tol_at ? c_.tol_at(step_) : c_.tol;
    if (t.loss >= 0) {
      EXPECT_NEAR(d.dist.loss, d.ref.loss, t.loss * std::abs(d.ref.loss)) << "step " << step_;
    }
    if (t.grad_norm >= 0) {
      EXPECT_NEAR(d.dist.grad_norm, d.ref.grad_norm, t.grad_norm * d.ref.grad_norm)
          << "step " << step_;
    }
    if (each_step) each_step(d);
    if (t.weight >= 0) {
      d.weights = ExpectWeightsNear(*eng_, *ref_, t.weight, step_);
      if (verbose) {
        fmt::print("{}step {} worst {:.3g} ({})\n", c_.label.empty() ? "" : c_.label + " ", step_,
                   d.weights.worst, d.weights.param);
      }
    }
    out.push_back(std::move(d));
    if (!failed_before && ::testing::Test::HasFatalFailure()) break;  // as an ASSERT would
  }
  return out;
}

}  // namespace sshsdp::testing
