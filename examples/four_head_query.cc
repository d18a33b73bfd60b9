// The paper's appendix example: a query projection of four heads,
//   W_Q = [W0; W1; W2; W3],  W_i ∈ R^{d_h × d},
// each head its own update parameter with fp32 main weights, packed into ONE bf16 runtime tensor
// that ONE GEMM consumes (kernels::LinearForward on the [4·d_h, d] view), sharded over four
// ranks, trained a few steps with AdamW and with per-head Muon, and checked against a local
// reference: the same engine on a one-rank communicator (the same logical per-unit update).
//
// Like the paper's Figure 4 a "Linear" W_L [d, d] precedes the projection in the same flat
// buffer, so with (W=4, sw=sg=2, so=4) — ZeRO-1 chunks of 260 elements owned by ranks
// [0, 2, 1, 3] — Head0 (elements [400, 560)) spans rank 2 (120 elements) and rank 1 (40).
// Rank 2 executes Head0's Newton–Schulz: rank 1 already runs Head1 (wholly local), so rank 2
// has the least load among the owners. Rank 1 sends u[120, 160) (40 bf16 = 80 bytes) to
// rank 2, rank 2 returns v[120, 160) (40 fp32 = 160 bytes); both update their own
// main-weight fragments. The program prints the plan and exits non-zero on any mismatch.
//
//   mpirun -np 4 four_head_query            (any world size works; the checks of the
//                                            four-rank plan run at W = 4)
//
// The model: y = (x·W_Lᵀ)·W_Qᵀ for a fixed random input x per sample, loss = mean squared error
// against a fixed random target. Each "token" of a batch is a sample index.
#include <cmath>
#include <cstdio>
#include <random>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/kernels/matmul.h"

namespace sshsdp {
namespace {

constexpr int64_t kHeads = 4, kHeadDim = 8, kDim = 20, kSamples = 64;

// One runtime group: in_proj [d, d] (update parameter "in_proj"), q [4·d_h, d] (update
// parameters "q.h0".."q.h3", one per head, row blocks of the packed projection).
class FourHeadQuery final : public Model {
 public:
  FourHeadQuery() : x_(kSamples * kDim), t_(kSamples * kHeads * kHeadDim) {
    std::mt19937 rng(2026);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& v : x_) v = nd(rng);
    for (float& v : t_) v = 0.5f * nd(rng);
  }
  int num_groups() const override { return 1; }
  std::vector<RuntimeParamSpec> GroupParams(int) const override {
    const InitSpec init{InitSpec::Kind::kNormal, 0.2f};
    RuntimeParamSpec lin{
        "in_proj", {kDim, kDim}, {{"in_proj", {kDim, kDim}, 0, UpdateKind::kMatrix, init}}};
    RuntimeParamSpec q{"q", {kHeads * kHeadDim, kDim}, {}};
    for (int h = 0; h < kHeads; ++h)
      q.parts.push_back({fmt::format("q.h{}", h),
                         {kHeadDim, kDim},
                         h * kHeadDim * kDim,
                         UpdateKind::kMatrix,
                         init});
    return {lin, q};
  }
  void SetBatch(const int32_t* tokens, const int32_t*, int B, int T) override {
    n_ = B * T;
    ids_.assign(tokens, tokens + n_);
    for (int32_t id : ids_)
      SSHSDP_CHECK(id >= 0 && id < kSamples, ConfigError, "sample {} outside [0, {})", id,
                   kSamples);
    xb_.resize(n_ * kDim);
    tb_.resize(n_ * kHeads * kHeadDim);
    for (int i = 0; i < n_; ++i) {
      std::copy_n(&x_[ids_[i] * kDim], kDim, &xb_[i * kDim]);
      std::copy_n(&t_[ids_[i] * kHeads * kHeadDim], kHeads * kHeadDim, &tb_[i * kHeads * kHeadDim]);
    }
    h_.resize(n_ * kDim);
    y_.resize(n_ * kHeads * kHeadDim);
  }
  void Forward(int, const std::vector<TensorRef>& w) override {
    kernels::LinearForward(xb_.data(), w[0].data, w[0].dtype, h_.data(), n_, kDim, kDim);
    // The four heads in one GEMM over the packed runtime tensor.
    kernels::LinearForward(h_.data(), w[1].data, w[1].dtype, y_.data(), n_, kHeads * kHeadDim,
                           kDim);
    double sum = 0;
    for (size_t i = 0; i < y_.size(); ++i) sum += 0.5 * (y_[i] - tb_[i]) * (y_[i] - tb_[i]);
    loss_ = sum / static_cast<double>(y_.size());
  }
  double Loss() const override { return loss_; }
  void Backward(int, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                GradWrite mode) override {
    const bool acc = mode == GradWrite::kAccumulate;
    std::vector<float> dy(y_.size()), dh(h_.size());
    const float s = static_cast<float>(1.0 / static_cast<double>(y_.size()));
    for (size_t i = 0; i < y_.size(); ++i) dy[i] = s * (y_[i] - tb_[i]);
    const int64_t n = kHeads * kHeadDim;
    kernels::LinearBackwardWeight(dy.data(), h_.data(), w[1].dtype, grad[1].data, DType::kF32, n_,
                                  n, kDim, acc);
    kernels::LinearBackwardData(dy.data(), w[1].data, w[1].dtype, dh.data(), n_, n, kDim, false);
    kernels::LinearBackwardWeight(dh.data(), xb_.data(), w[0].dtype, grad[0].data, DType::kF32, n_,
                                  kDim, kDim, acc);
  }
  double FlopsPerToken() const override { return 6.0 * (kDim * kDim + kHeads * kHeadDim * kDim); }
  int64_t ActivationBytes() const override {
    return static_cast<int64_t>((xb_.size() + tb_.size() + h_.size() + y_.size()) * 4);
  }

 private:
  std::vector<float> x_, t_, xb_, tb_, h_, y_;
  std::vector<int32_t> ids_;
  int n_ = 0;
  double loss_ = 0;
};

EngineConfig Config(int sw, int sg, int so, int M, OptimizerKind opt) {
  EngineConfig c;
  c.sw = sw;
  c.sg = sg;
  c.so = so;
  c.microbatches = M;
  c.batch_size = 4;
  c.seq_len = 1;
  c.weight_dtype = DType::kBF16;  // the packed runtime tensor
  c.adamw.lr = 1e-2f;
  c.clip_norm = 0;
  c.optimizer = opt;
  c.muon_unit = UnitRule::kHead;  // each head its own Muon unit (and in_proj one matrix)
  c.muon.lr = 0.02f;
  return c;
}

// Sample of (step, microbatch, rank, b): the same global batch for any world size.
BatchFn Batch(const int64_t* step, int M, int W, int rank, int B) {
  return [=](int mb, int32_t* tok, int32_t* tgt) {
    for (int b = 0; b < B; ++b) {
      const int64_t s = ((*step * M + mb) * W + rank) * B + b;
      tok[b] = tgt[b] = static_cast<int32_t>((s * 37 + 11) % kSamples);
    }
  };
}

int failures = 0;
void Check(bool ok, int rank, const std::string& what) {
  if (ok) return;
  ++failures;
  fmt::print(stderr, "four_head_query: rank {}: MISMATCH: {}\n", rank, what);
}

// Trains `steps` steps distributed and on one rank; returns nothing, counts failures.
void TrainAndCompare(Communicator& world, OptimizerKind opt, int steps) {
  const int W = world.size(), r = world.rank();
  const bool paper = W == 4;
  const int sw = paper ? 2 : 1, sg = sw, so = W, M = 2;
  auto self = world.Split(r, 0);
  FourHeadQuery model, ref_model;
  Engine eng(model, world, Config(sw, sg, so, M, opt));
  Engine ref(ref_model, *self, Config(1, 1, 1, M * W, opt));
  eng.InitWeights(5);
  ref.InitWeights(5);
  const char* name = opt == OptimizerKind::kMuon ? "muon per head" : "adamw";
  if (opt == OptimizerKind::kMuon) {
    const UpdatePlan& plan = *eng.structured_update().plan(OptimizerKind::kMuon);
    if (r == 0) fmt::print("{}", plan.Describe());
    if (paper) {
      // Units in buffer order: in_proj, q.h0, q.h1, q.h2, q.h3.
      const UnitPlacement& h0 = plan.placements()[1];
      Check(plan.units()[1].name == "q.h0" && h0.pieces.size() == 2 && h0.pieces[0].rank == 2 &&
                h0.pieces[0].length == 120 && h0.pieces[1].rank == 1 && h0.pieces[1].length == 40,
            r, "Head0 should span rank 2 (120 elements) and rank 1 (40)");
      Check(h0.exec_rank == 2, r, fmt::format("Head0 executes on rank {}, not 2", h0.exec_rank));
      int head0_msgs = 0;
      for (const PlannedMessage& m : plan.messages()) {
        if (m.unit != 1) continue;
        ++head0_msgs;
        const bool fetch = m.kind == PlannedMessage::Kind::kFetch;
        Check(fetch ? (m.field == "u" && m.src == 1 && m.dst == 2 && m.bytes == 80)
                    : (m.field == "v" && m.src == 2 && m.dst == 1 && m.bytes == 160),
              r, "Head0's messages: u[120,160) 1 -> 2 (80 B), v[120,160) 2 -> 1 (160 B)");
      }
      Check(head0_msgs == 2, r, fmt::format("Head0 has {} messages, not 2", head0_msgs));
    }
  }
  int64_t step = 0;
  BatchFn b = Batch(&step, M, W, r, 4), rb = Batch(&step, M * W, 1, 0, 4);
  double worst = 0;
  for (; step < steps; ++step) {
    StepStats a = eng.Step(b);
    StepStats c = ref.Step(rb);
    const uint64_t expect = opt == OptimizerKind::kMuon
                                ? eng.structured_update().plan(OptimizerKind::kMuon)->BytesSent(r)
                                : 0;
    Check(a.counters.update_p2p.total() == expect, r,
          fmt::format("{}: update sent {} bytes, the plan says {}", name,
                      a.counters.update_p2p.total(), expect));
    Check(std::abs(a.loss - c.loss) <= 1e-3 * std::abs(c.loss), r,
          fmt::format("{} step {}: loss {} vs reference {}", name, step, a.loss, c.loss));
    auto wa = eng.GatherMainWeights(), wb = ref.GatherMainWeights();
    for (auto& [n, va] : wa)
      for (size_t i = 0; i < va.size(); ++i)
        worst = std::max(worst, std::abs(double(va[i]) - wb.at(n)[i]));
    if (r == 0)
      fmt::print("{} step {}: loss {:.6f} (reference {:.6f}), update P2P bytes on rank 0: {}\n",
                 name, step + 1, a.loss, c.loss, a.counters.update_p2p.total());
  }
  // bf16 u and bf16 runtime weights: the runs differ by fp32 summation order, which can flip
  // a bf16 rounding; far below the ~lr·|update| ≈ 5e-3 of a wrong or missing fragment.
  Check(worst < 1e-3, r, fmt::format("{}: main weights differ by {}", name, worst));
  if (r == 0)
    fmt::print("{}: main weights match the one-rank reference (max |diff| {:.3g})\n", name, worst);
}

}  // namespace
}  // namespace sshsdp

int main(int argc, char** argv) {
  return sshsdp::RunMpiMain(argc, argv, [&] {
    auto world = sshsdp::MpiCommunicator::World(sshsdp::WorldSize());
    sshsdp::TrainAndCompare(*world, sshsdp::OptimizerKind::kAdamW, 4);
    sshsdp::TrainAndCompare(*world, sshsdp::OptimizerKind::kMuon, 4);
    // Every rank agrees on the verdict.
    float f = static_cast<float>(sshsdp::failures);
    world->AllReduce(&f, 1, sshsdp::DType::kF32);
    if (world->rank() == 0) fmt::print("four_head_query: {}\n", f == 0 ? "OK" : "FAILED");
    return f == 0 ? 0 : 1;
  });
}
