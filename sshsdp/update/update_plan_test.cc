// Single-process tests of the structured-update layer: unit selection (per head, per matrix,
// per expert, overrides), plan-time errors (unit-count mismatch, temporary read before it is
// produced), the planner on the paper's four-rank example computed from every rank's point of
// view (identical plans, Head0 executed on rank 2 with the exact messages), load balancing and
// its deterministic tie-breaks, HSDP replicas, Newton–Schulz against a double-precision
// transcription, and Muon / AdamW programs run by the executor on one rank against scalar
// references.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/newton_schulz.h"
#include "sshsdp/update/adamw.h"
#include "sshsdp/update/muon.h"
#include "sshsdp/update/structured_update.h"
#include "sshsdp/update/update_executor.h"
#include "sshsdp/update/update_plan.h"

namespace sshsdp {
namespace {

// The CPU backend the updates of this file run on.
Backend& Cpu() {
  static const std::unique_ptr<Backend> cpu = MakeCpuBackend();
  return *cpu;
}

// A one-rank communicator: nothing to send (the executor never exchanges with itself).
class SelfComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int world_rank(int) const override { return 0; }
  std::string name() const override { return "self"; }
  void AllGatherInPlace(void*, size_t, DType) override {}
  void AllGather(const void*, void*, size_t, DType) override {}
  void ReduceScatter(const void*, DType, void*, DType, size_t, bool) override {}
  void AllReduce(void*, size_t, DType) override {}
  void Exchange(const std::vector<P2POp>& s, const std::vector<P2POp>& r) override {
    ASSERT_TRUE(s.empty() && r.empty()) << "a one-rank plan must not communicate";
  }
  void Barrier() override {}
  std::unique_ptr<Communicator> Split(int, int) override { return nullptr; }
  std::unique_ptr<Communicator> Duplicate() override { return nullptr; }
};

// One block like the GPT's: a norm gain, QKV of `heads` heads [dh, d] each, a projection.
std::vector<RuntimeParamSpec> Block(int64_t d, int heads) {
  const int64_t dh = d / heads;
  RuntimeParamSpec ln{"ln.g", {d}, {{"ln.g", {d}, 0, UpdateKind::kVector, {}}}};
  RuntimeParamSpec qkv{"attn.qkv", {3 * d, d}, {}};
  int64_t off = 0;
  for (const char* w : {"q", "k", "v"})
    for (int h = 0; h < heads; ++h) {
      qkv.parts.push_back(
          {fmt::format("attn.{}.h{}", w, h), {dh, d}, off, UpdateKind::kMatrix, {}});
      off += dh * d;
    }
  RuntimeParamSpec proj{"attn.proj", {d, d}, {{"attn.proj", {d, d}, 0, UpdateKind::kMatrix, {}}}};
  return {ln, qkv, proj};
}

TEST(SelectUnits, PerHeadPerMatrixAndOverrides) {
  GroupLayout L = BuildGroupLayout(1, Block(8, 2), DType::kBF16, 4);
  UnitPolicy p;
  UnitSelection adam = SelectUnits(L, p);
  EXPECT_TRUE(adam.muon.empty());
  EXPECT_EQ(adam.adamw.size(), L.update.size());

  p.muon = true;
  UnitSelection head = SelectUnits(L, p);
  ASSERT_EQ(head.muon.size(), 7u);  // 6 heads + proj
  EXPECT_EQ(head.muon[0].name, "attn.q.h0");
  EXPECT_EQ(head.muon[0].rows, 4);
  EXPECT_EQ(head.muon[0].cols, 8);
  EXPECT_EQ(head.muon[0].begin, 8u);  // after ln.g
  EXPECT_EQ(head.muon[5].name, "attn.v.h1");
  EXPECT_EQ(head.muon[6].name, "attn.proj");
  ASSERT_EQ(head.adamw.size(), 1u);
  EXPECT_EQ(head.adamw[0].name, "ln.g");
  EXPECT_EQ(head.optimizer[0], OptimizerKind::kAdamW);
  EXPECT_EQ(head.optimizer[1], OptimizerKind::kMuon);

  p.matrix_rule = UnitRule::kMatrix;
  UnitSelection mat = SelectUnits(L, p);
  ASSERT_EQ(mat.muon.size(), 2u);
  EXPECT_EQ(mat.muon[0].name, "attn.qkv");
  EXPECT_EQ(mat.muon[0].rows, 24);
  EXPECT_EQ(mat.muon[0].cols, 8);
  EXPECT_EQ(mat.muon[0].num_members, 6);

  p.matrix_rule = UnitRule::kHead;
  p.overrides["attn.proj"] = UnitRule::kAdamW;
  p.overrides["ln.g"] = UnitRule::kAdamW;
  UnitSelection ov = SelectUnits(L, p);
  EXPECT_EQ(ov.muon.size(), 6u);
  EXPECT_EQ(ov.adamw.size(), 2u);

  // A 'matrix' rule on only some parts of the QKV parameter is refused, naming both.
  p.overrides = {{"attn.q.h0", UnitRule::kMatrix}};
  try {
    SelectUnits(L, p);
    ADD_FAILURE() << "accepted a partial matrix rule";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("attn.qkv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("attn.q.h1"), std::string::npos) << e.what();
  }
  // Muon on a vector is refused.
  p.overrides = {{"ln.g", UnitRule::kHead}};
  EXPECT_THROW(SelectUnits(L, p), PlanError);
}

TEST(SelectUnits, StackedExpertsAndIneligibleMatrices) {
  // Experts packed in one runtime parameter [E, f, d]: one part per expert, or one stacked part.
  RuntimeParamSpec per{"moe.w1", {3, 4, 8}, {}};
  for (int e = 0; e < 3; ++e)
    per.parts.push_back({fmt::format("moe.w1.e{}", e), {4, 8}, e * 32, UpdateKind::kMatrix, {}});
  RuntimeParamSpec stacked{
      "moe.w2", {3, 8, 4}, {{"moe.w2", {3, 8, 4}, 0, UpdateKind::kMatrix, {}}}};
  RuntimeParamSpec router{
      "moe.router", {3, 8}, {{"moe.router", {3, 8}, 0, UpdateKind::kMatrix, {}}}};
  router.parts[0].muon_eligible = false;
  GroupLayout L = BuildGroupLayout(0, {router, per, stacked}, DType::kBF16, 2);
  for (UnitRule r : {UnitRule::kHead, UnitRule::kMatrix}) {
    UnitPolicy p;
    p.muon = true;
    p.matrix_rule = r;
    UnitSelection s = SelectUnits(L, p);
    ASSERT_EQ(s.muon.size(), 6u) << UnitRuleName(r);
    EXPECT_EQ(s.muon[0].name, r == UnitRule::kHead ? "moe.w1.e0" : "moe.w1[0]");
    EXPECT_EQ(s.muon[1].begin, 24u + 32u);
    EXPECT_EQ(s.muon[3].name, "moe.w2[0]");
    EXPECT_EQ(s.muon[5].begin, 24u + 96u + 64u);
    EXPECT_EQ(s.muon[5].rows, 8);
    EXPECT_EQ(s.muon[5].cols, 4);
    ASSERT_EQ(s.adamw.size(), 1u);
    EXPECT_EQ(s.adamw[0].name, "moe.router");  // muon_eligible = false
  }
}

// Muon program without f0: f1 reads u before anything produced it.
TEST(ValidateProgram, RejectsTemporaryReadBeforeProduced) {
  UpdateProgram p = MuonProgram(MuonConfig{}, Cpu());
  p.stages.erase(p.stages.begin());
  std::vector<UpdateUnit> units = {{"h0", 0, 0, 1, UpdateKind::kMatrix, 0, 2, 3}};
  try {
    ValidateProgram(p, units);
    ADD_FAILURE() << "accepted a read of u before it is produced";
  } catch (const PlanError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("stage 'newton_schulz' reads temporary 'u' before any stage produces it"),
              std::string::npos)
        << w;
  }
}

TEST(ValidateProgram, RejectsOperandsDisagreeingOnUnitCount) {
  UpdateProgram p = MuonProgram(MuonConfig{}, Cpu());
  p.stages[1].outputs[0].per_unit = Extent::Elements(1);  // v per element, u per unit
  std::vector<UpdateUnit> units = {{"h0", 0, 0, 1, UpdateKind::kMatrix, 0, 2, 3},
                                   {"h1", 0, 1, 1, UpdateKind::kMatrix, 6, 2, 3}};
  try {
    ValidateProgram(p, units);
    ADD_FAILURE() << "accepted operands with different unit counts";
  } catch (const PlanError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("operands disagree on the number of units: 'u' (a whole unit per unit) "
                     "describes 2 units but 'v' (1 element(s) per unit) describes 12 units"),
              std::string::npos)
        << w;
  }
  // Differing elements per unit are fine when the counts agree: 6 elements = every unit.
  p.stages[1].outputs[0].per_unit = Extent::Elements(6);
  EXPECT_EQ(ValidateProgram(p, units)[1], StageKind::kUnit);
  // ... but not when a unit has another size.
  units.push_back({"h2", 0, 2, 1, UpdateKind::kMatrix, 12, 3, 3});
  EXPECT_THROW(ValidateProgram(p, units), PlanError);
  // Undeclared fields.
  UpdateProgram q = MuonProgram(MuonConfig{}, Cpu());
  q.stages[2].inputs[0].field = "master";
  EXPECT_THROW(ValidateProgram(q, units), PlanError);
}

// Figure 4: Linear [6,4] then Q heads [4,4] x3, so=4, sg=sw=2, W=4; ZeRO-1 chunks of 18
// owned by [0, 2, 1, 3]. Muon on the heads, AdamW on the Linear.
struct PaperExample {
  GroupLayout layout;
  Topology topo{4, 4, 2, 2, 4};
  PaperExample() {
    RuntimeParamSpec lin{"linear", {6, 4}, {{"linear", {6, 4}, 0, UpdateKind::kMatrix, {}}}};
    RuntimeParamSpec q{"q", {12, 4}, {}};
    for (int h = 0; h < 3; ++h)
      q.parts.push_back({fmt::format("q.h{}", h), {4, 4}, h * 16, UpdateKind::kMatrix, {}});
    layout = BuildGroupLayout(0, {lin, q}, DType::kBF16, 4);
  }
  UnitSelection Select() const {
    UnitPolicy p;
    p.muon = true;
    p.overrides["linear"] = UnitRule::kAdamW;
    return SelectUnits(layout, p);
  }
};

TEST(UpdatePlan, PaperExampleHead0ExecutesOnRank2) {
  PaperExample ex;
  std::vector<PlannedMessage> first;
  for (int r = 0; r < 4; ++r) {
    ShardChain chain(ex.layout.list, ex.topo, r);
    UpdatePlan plan(MuonProgram(MuonConfig{}, Cpu()), ex.Select().muon, {&chain}, 0);
    ASSERT_EQ(plan.units().size(), 3u);
    const auto& h0 = plan.placements()[0];
    ASSERT_EQ(h0.pieces.size(), 2u);
    EXPECT_EQ(h0.pieces[0].rank, 2);
    EXPECT_EQ(h0.pieces[0].length, 12u);
    EXPECT_EQ(h0.pieces[1].rank, 1);
    EXPECT_EQ(h0.pieces[1].length, 4u);
    // Both owners start with no load: rank 2 holds more of Head0 (12 > 4) and executes it.
    EXPECT_EQ(h0.exec_rank, 2);
    // Head1: 14 elements on rank 1, 2 on rank 3; rank 3 already runs Head2 (local).
    EXPECT_EQ(plan.placements()[1].exec_rank, 1);
    EXPECT_FALSE(plan.placements()[2].split());
    EXPECT_EQ(plan.placements()[2].exec_rank, 3);
    const double f = NewtonSchulzFlops(4, 4, 5);
    EXPECT_EQ(plan.ExecCost(0), 0);
    EXPECT_EQ(plan.ExecCost(1), f);
    EXPECT_EQ(plan.ExecCost(2), f);
    EXPECT_EQ(plan.ExecCost(3), f);
    // Exactly four messages: fetch u, return v, for Head0 and Head1.
    const auto& m = plan.messages();
    ASSERT_EQ(m.size(), 4u);
    auto expect = [&](const PlannedMessage& x, PlannedMessage::Kind k, const char* field, int unit,
                      int src, int dst, size_t begin, size_t len, size_t bytes) {
      EXPECT_EQ(x.kind, k);
      EXPECT_EQ(x.stage, 1);
      EXPECT_EQ(x.field, field);
      EXPECT_EQ(x.unit, unit);
      EXPECT_EQ(x.src, src);
      EXPECT_EQ(x.dst, dst);
      EXPECT_EQ(x.begin, begin);
      EXPECT_EQ(x.length, len);
      EXPECT_EQ(x.bytes, bytes);
    };
    using K = PlannedMessage::Kind;
    expect(m[0], K::kFetch, "u", 0, 1, 2, 36, 4, 8);    // Head0 u[12, 16): rank 1 -> 2
    expect(m[1], K::kFetch, "u", 1, 3, 1, 54, 2, 4);    // Head1 u[14, 16): rank 3 -> 1
    expect(m[2], K::kReturn, "v", 0, 2, 1, 36, 4, 16);  // Head0 v[12, 16): rank 2 -> 1
    expect(m[3], K::kReturn, "v", 1, 1, 3, 54, 2, 8);   // Head1 v[14, 16): rank 1 -> 3
    EXPECT_EQ(plan.BytesSent(0), 0u);
    EXPECT_EQ(plan.BytesSent(1), 8u + 8u);
    EXPECT_EQ(plan.BytesSent(2), 16u);
    EXPECT_EQ(plan.BytesSent(3), 4u);
    if (r == 0) first = m;
    for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i].src, first[i].src) << "rank " << r;
  }
}

TEST(UpdatePlan, BalancesSplitUnitsAndBreaksTiesDeterministically) {
  // 8 equal units [4, 4] over so = 4 chunks of 34 elements (136 = 8·16 + 8 padding after a
  // vector): every chunk boundary cuts a unit.
  RuntimeParamSpec g{"g", {8}, {{"g", {8}, 0, UpdateKind::kVector, {}}}};
  RuntimeParamSpec w{"w", {32, 4}, {}};
  for (int h = 0; h < 8; ++h)
    w.parts.push_back({fmt::format("w.h{}", h), {4, 4}, h * 16, UpdateKind::kMatrix, {}});
  GroupLayout L = BuildGroupLayout(0, {g, w}, DType::kF32, 4);
  Topology topo(4, 4, 1, 1, 4);
  ShardChain chain(L.list, topo, 0);
  UnitPolicy p;
  p.muon = true;
  UpdatePlan plan(MuonProgram(MuonConfig{}, Cpu()), SelectUnits(L, p).muon, {&chain}, 0);
  // Loads differ by at most one unit between ranks.
  double lo = 1e300, hi = 0;
  for (int r = 0; r < 4; ++r) {
    lo = std::min(lo, plan.ExecCost(r));
    hi = std::max(hi, plan.ExecCost(r));
  }
  EXPECT_LE(hi - lo, NewtonSchulzFlops(4, 4, 5));
  // Every split unit executes on one of its owners; ties on load go to the larger piece, then
  // to the first piece.
  for (const UnitPlacement& pl : plan.placements()) {
    bool owner = false;
    for (const UnitPiece& pc : pl.pieces) owner |= pc.rank == pl.exec_rank;
    EXPECT_TRUE(owner);
  }
}

TEST(UpdatePlan, EachHsdpReplicaRunsTheSamePlanOnItsRanks) {
  PaperExample ex;
  Topology topo(8, 8, 2, 2, 4);  // two replicas of the paper's layout: ranks 0-3 and 4-7
  ShardChain c0(ex.layout.list, topo, 0), c5(ex.layout.list, topo, 5);
  UpdatePlan p0(MuonProgram(MuonConfig{}, Cpu()), ex.Select().muon, {&c0}, 0);
  UpdatePlan p1(MuonProgram(MuonConfig{}, Cpu()), ex.Select().muon, {&c5}, 1);
  ASSERT_EQ(p0.messages().size(), p1.messages().size());
  for (size_t i = 0; i < p0.messages().size(); ++i) {
    EXPECT_EQ(p1.messages()[i].src, p0.messages()[i].src + 4);
    EXPECT_EQ(p1.messages()[i].dst, p0.messages()[i].dst + 4);
    EXPECT_EQ(p1.messages()[i].bytes, p0.messages()[i].bytes);
  }
  EXPECT_EQ(p1.placements()[0].exec_rank, 6);
  EXPECT_EQ(p1.ranks(), (std::vector<int>{4, 5, 6, 7}));
}

// Double-precision Newton–Schulz, transposing tall inputs explicitly (the reference recipe).
std::vector<double> NsReference(const std::vector<float>& in, int64_t r, int64_t c, int steps) {
  const bool tall = r > c;
  const int64_t m = tall ? c : r, n = tall ? r : c;
  std::vector<double> X(m * n);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) (tall ? X[j * n + i] : X[i * n + j]) = in[i * c + j];
  double norm = 0;
  for (double x : X) norm += x * x;
  norm = std::sqrt(norm);
  for (double& x : X) x /= norm + 1e-7;
  const double a = 3.4445, b = -4.7750, cc = 2.0315;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> A(m * m, 0), B(m * m, 0), Y(m * n, 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < n; ++k) A[i * m + j] += X[i * n + k] * X[j * n + k];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < m; ++k) aa += A[i * m + k] * A[k * m + j];
        B[i * m + j] = b * A[i * m + j] + cc * aa;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double y = a * X[i * n + j];
        for (int64_t k = 0; k < m; ++k) y += B[i * m + k] * X[k * n + j];
        Y[i * n + j] = y;
      }
    X = Y;
  }
  std::vector<double> out(r * c);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = tall ? X[j * n + i] : X[i * n + j];
  return out;
}

TEST(NewtonSchulz, MatchesDoubleReferenceWideTallSquareBatched) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  NewtonSchulz ns;
  for (auto [r, c] : {std::pair<int64_t, int64_t>{4, 20}, {20, 4}, {12, 12}, {8, 20}}) {
    const int batch = 3;
    std::vector<std::vector<float>> in(batch, std::vector<float>(r * c));
    std::vector<std::vector<bf16>> in16(batch, std::vector<bf16>(r * c));
    std::vector<std::vector<float>> out(batch, std::vector<float>(r * c));
    std::vector<const void*> ip;
    std::vector<float*> op;
    for (int i = 0; i < batch; ++i) {
      for (int64_t k = 0; k < r * c; ++k) {
        in16[i][k] = FloatToBf16(nd(rng));
        in[i][k] = Bf16ToFloat(in16[i][k]);
      }
      ip.push_back(in16[i].data());
      op.push_back(out[i].data());
    }
    const float scale = MuonUpdateScale(MuonScale::kReference, r, c);
    ns.Run(ip.data(), DType::kBF16, op.data(), batch, r, c, 5, NsCoefficients{}, scale);
    for (int i = 0; i < batch; ++i) {
      std::vector<double> ref = NsReference(in[i], r, c, 5);
      double worst = 0;
      for (int64_t k = 0; k < r * c; ++k)
        worst = std::max(worst, std::abs(out[i][k] - scale * ref[k]));
      EXPECT_LT(worst, 2e-4) << "[" << r << ", " << c << "] matrix " << i;
      // One matrix alone gives the same result as inside the batch.
      std::vector<float> single(r * c);
      float* sp = single.data();
      ns.Run(&ip[i], DType::kBF16, &sp, 1, r, c, 5, NsCoefficients{}, scale);
      for (int64_t k = 0; k < r * c; ++k) EXPECT_NEAR(single[k], out[i][k], 1e-6);
    }
  }
  EXPECT_EQ(NewtonSchulzFlops(8, 20, 5), 5.0 * (4 * 64 * 20 + 2 * 512));
  EXPECT_EQ(NewtonSchulzFlops(20, 8, 5), NewtonSchulzFlops(8, 20, 5));
  EXPECT_FLOAT_EQ(MuonUpdateScale(MuonScale::kReference, 20, 5), 2.0f);
  EXPECT_FLOAT_EQ(MuonUpdateScale(MuonScale::kReference, 5, 20), 1.0f);
  EXPECT_FLOAT_EQ(MuonUpdateScale(MuonScale::kRms, 25, 16), 1.0f);
}

// Muon + AdamW on one rank through StructuredUpdate equals a scalar transcription of the
// logical per-unit update, over several steps, for both unit rules.
TEST(StructuredUpdate, OneRankMatchesScalarReference) {
  for (UnitRule rule : {UnitRule::kHead, UnitRule::kMatrix}) {
    SCOPED_TRACE(UnitRuleName(rule));
    GroupLayout L = BuildGroupLayout(0, Block(8, 2), DType::kF32, 1);
    Topology topo(1, 1, 1, 1, 1);
    ShardChain chain(L.list, topo, 0);
    SelfComm comm;
    UpdateOptions o;
    o.backend = &Cpu();
    o.optimizer = OptimizerKind::kMuon;
    o.muon_unit = rule;
    o.muon.weight_decay = 0.1f;
    o.muon.scale = MuonScale::kRms;
    MemoryAccount acct;
    StructuredUpdate up({{&L, &chain, {}}}, o, 0, comm, &acct);
    const size_t n = L.list.padded_numel();
    std::vector<float> main(n), grad(n), m(n, 0), v(n, 0);
    std::vector<double> rmain(n), rm(n, 0), rv(n, 0);
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    for (size_t i = 0; i < n; ++i) main[i] = rmain[i] = nd(rng);
    Zero1State st{chain.LocalRange(Shard::kZero1),
                  {{"main", main.data()}, {"grad", grad.data()}, {"m", m.data()}, {"v", v.data()}}};
    UnitSelection sel = SelectUnits(L, UnitPolicy{true, rule, {}});
    for (int t = 1; t <= 3; ++t) {
      for (size_t i = 0; i < n; ++i) grad[i] = nd(rng);
      const double gs = 0.5, lr = 0.02, alr = 0.01;
      ScalarState sc;
      sc.Set("grad_scale", gs);
      sc.Set("step", t);
      sc.Set("adamw.lr", alr);
      sc.Set("muon.lr", lr);
      up.Run({st}, sc);
      EXPECT_EQ(up.last_run().bytes_sent, 0u);
      EXPECT_EQ(up.last_run().bytes_copied, 0u);
      EXPECT_EQ(acct.current("update_temporaries"), 0u);  // released after the update
      EXPECT_GT(acct.by_category().at("update_temporaries").peak, 0u);
      // Reference: Muon per unit (u rounded to bf16), AdamW elementwise.
      for (const UpdateUnit& u : sel.muon) {
        std::vector<float> uin(u.numel());
        for (size_t k = 0; k < u.numel(); ++k) {
          const size_t i = u.begin + k;
          const double g = gs * grad[i];
          rm[i] = 0.95 * rm[i] + g;
          uin[k] = RoundToBf16(static_cast<float>(g + 0.95 * rm[i]));
        }
        std::vector<double> o5 = NsReference(uin, u.rows, u.cols, 5);
        const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(u.rows, u.cols)));
        for (size_t k = 0; k < u.numel(); ++k) {
          const size_t i = u.begin + k;
          rmain[i] = rmain[i] * (1 - lr * 0.1) - lr * scale * o5[k];
        }
      }
      for (const UpdateUnit& u : sel.adamw)
        for (size_t i = u.begin; i < u.end(); ++i) {
          const double g = gs * grad[i], wd = u.kind == UpdateKind::kVector ? 0.0 : 0.1;
          rmain[i] *= 1 - alr * wd;
          rm[i] = 0.9 * rm[i] + 0.1 * g;
          rv[i] = 0.95 * rv[i] + 0.05 * g * g;
          const double mh = rm[i] / (1 - std::pow(0.9, t)), vh = rv[i] / (1 - std::pow(0.95, t));
          rmain[i] -= alr * mh / (std::sqrt(vh) + 1e-8);
        }
      for (size_t i = 0; i < L.list.numel(); ++i) {
        ASSERT_NEAR(main[i], rmain[i], 2e-5) << "step " << t << " element " << i;
        ASSERT_NEAR(m[i], rm[i], 1e-5) << "step " << t << " element " << i;
      }
    }
    EXPECT_EQ(up.optimizers()[0][0], OptimizerKind::kAdamW);
    EXPECT_EQ(up.optimizers()[0][1], OptimizerKind::kMuon);
    EXPECT_NEAR(up.muon_share(), (4.0 * 64) / (8 + 4 * 64), 1e-12);
  }
}

}  // namespace
}  // namespace sshsdp
