// GEMM benchmark over the products the reference models run: each linear layer's forward and
// both backward products (GPT small and base at 2,048 rows; a Qwen3-0.6B block and its 151,936
// LM head at 512 rows) and attention's batched products, timed on every fp32 provider that
// loads (gemm_provider.h). oneDNN runs twice, first and last: the two give the noise floor.
// A benchmark, never a test. bench/gemm_sweep.sh puts torch.mm / torch.bmm next to it.
//
//   OMP_NUM_THREADS=1 build/sshsdp/kernels/kernels_gemm_bench            # table
//   kernels_gemm_bench --shapes                # the shapes as JSON lines (for the torch peer)
//   kernels_gemm_bench --auto                  # the provider SSHSDP_GEMM=auto takes, and why
//   kernels_gemm_bench --json --reps 5         # one JSON line per shape and provider
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "sshsdp/kernels/gemm_provider.h"
#include "sshsdp/kernels/matmul.h"

namespace sshsdp::kernels {
namespace {

// C[m,n] = op(A)·op(B); a batched shape is a [batch, heads] grid of products on dense
// operands (attention's scores and weighted values).
struct Shape {
  std::string name;
  bool ta, tb;
  int64_t m, n, k, batch = 1, heads = 1;
  double Flops() const { return 2.0 * m * n * k * batch * heads; }
};

// A linear layer W [out, in] on `rows` activation rows: forward, dX and dW.
void AddLinear(std::vector<Shape>& out, const std::string& name, int64_t rows, int64_t in,
               int64_t outs) {
  out.push_back({name + " fwd", false, true, rows, outs, in});
  out.push_back({name + " dX", false, false, rows, in, outs});
  out.push_back({name + " dW", true, false, outs, in, rows});
}

void AddAttention(std::vector<Shape>& out, const std::string& name, int64_t b, int64_t h, int64_t t,
                  int64_t dh) {
  out.push_back({name + " q.kT", false, true, t, t, dh, b, h});
  out.push_back({name + " p.v", false, false, t, dh, t, b, h});
}

std::vector<Shape> Shapes() {
  std::vector<Shape> s;
  // GPT small (d 128) and base (d 256), vocabulary padded to 50,304, batch 8 x T 256.
  for (auto [model, d] : {std::pair{"small", 128}, std::pair{"base", 256}}) {
    const std::string m = model;
    AddLinear(s, m + " qkv", 2048, d, 3 * d);
    AddLinear(s, m + " proj", 2048, d, d);
    AddLinear(s, m + " fc1", 2048, d, 4 * d);
    AddLinear(s, m + " fc2", 2048, 4 * d, d);
    AddLinear(s, m + " head50k", 2048, d, 50304);
    AddAttention(s, m + " attn", 8, d == 128 ? 4 : 8, 256, 32);
  }
  // A Qwen3-0.6B block (d 1024, 16 query and 8 KV heads of 128, MLP 3072) at 2 x T 256.
  AddLinear(s, "qwen3 qkv", 512, 1024, 4096);
  AddLinear(s, "qwen3 o", 512, 2048, 1024);
  AddLinear(s, "qwen3 gate/up", 512, 1024, 3072);  // two products of this shape
  AddLinear(s, "qwen3 down", 512, 3072, 1024);
  AddLinear(s, "qwen3 head151k", 512, 1024, 151936);
  AddAttention(s, "qwen3 attn", 2, 16, 256, 128);
  return s;
}

// One run of `s` with fp32 operands a, b into c.
void Run(const Shape& s, const float* a, const float* b, float* c) {
  if (s.batch == 1 && s.heads == 1) {
    Gemm(s.ta, s.tb, s.m, s.n, s.k, a, b, DType::kF32, c, DType::kF32, false);
    return;
  }
  const int64_t sa = s.m * s.k, sb = s.k * s.n, sc = s.m * s.n;
  GemmBatchedStrided(s.ta, s.tb, s.batch, s.heads, s.m, s.n, s.k, a, s.ta ? s.m : s.k,
                     {s.heads * sa, sa}, b, s.tb ? s.k : s.n, {s.heads * sb, sb}, c, s.n,
                     {s.heads * sc, sc}, false);
}

// Median GFLOP/s over `reps` timed runs after one warm-up.
double Rate(const Shape& s, const std::vector<float>& a, const std::vector<float>& b,
            std::vector<float>& c, int reps) {
  Run(s, a.data(), b.data(), c.data());
  std::vector<double> secs;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Run(s, a.data(), b.data(), c.data());
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(secs.begin(), secs.end());
  return s.Flops() / secs[secs.size() / 2] / 1e9;
}

int Main(int argc, char** argv) {
  bool json = false, shapes_only = false;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    if (!std::strcmp(argv[i], "--shapes")) shapes_only = true;
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
  }
  if (argc > 1 && !std::strcmp(argv[1], "--auto")) {
    fmt::print("{} ({})\n", GemmProviderName(ActiveGemmProvider()), GemmProviderReason());
    return 0;
  }
  const std::vector<Shape> shapes = Shapes();
  if (shapes_only) {
    for (const Shape& s : shapes) {
      fmt::print(
          "{{\"name\": \"{}\", \"ta\": {}, \"tb\": {}, \"m\": {}, \"n\": {}, \"k\": {}, "
          "\"batch\": {}, \"heads\": {}}}\n",
          s.name, s.ta, s.tb, s.m, s.n, s.k, s.batch, s.heads);
    }
    return 0;
  }
  // oneDNN first and last (the A/A pair), the others between.
  std::vector<GemmProvider> order{GemmProvider::kOneDnn};
  for (GemmProvider p : {GemmProvider::kMkl, GemmProvider::kBlis}) {
    std::string why;
    if (GemmProviderLoads(p, &why)) {
      order.push_back(p);
    } else {
      fmt::print(stderr, "{} left out: {}\n", GemmProviderName(p), why);
    }
  }
  order.push_back(GemmProvider::kOneDnn);
  if (!json) {
    fmt::print("CPU {} (ISA {}), {} thread(s); GFLOP/s, median of {}\n", DetectCpuKind().Describe(),
               CpuIsaName(), omp_get_max_threads(), reps);
    fmt::print("{:<22} {:>6} {:>6} {:>6} {:>6}", "product", "m", "n", "k", "grid");
    for (size_t i = 0; i < order.size(); ++i) {
      fmt::print(" {:>8}",
                 fmt::format("{}{}", GemmProviderName(order[i]), i + 1 == order.size() ? "'" : ""));
    }
    fmt::print("\n");
  }
  for (const Shape& s : shapes) {
    const int64_t g = s.batch * s.heads;
    std::vector<float> a(g * s.m * s.k, 0.5f), b(g * s.k * s.n, 0.25f), c(g * s.m * s.n);
    if (!json) fmt::print("{:<22} {:>6} {:>6} {:>6} {:>6}", s.name, s.m, s.n, s.k, g);
    for (size_t i = 0; i < order.size(); ++i) {
      SetGemmProvider(order[i]);
      const double rate = Rate(s, a, b, c, reps);
      if (json) {
        fmt::print(
            "{{\"name\": \"{}\", \"provider\": \"{}\", \"repeat\": {}, \"threads\": {}, "
            "\"gflops\": {:.2f}}}\n",
            s.name, GemmProviderName(order[i]), i + 1 == order.size() ? 1 : 0,
            omp_get_max_threads(), rate);
      } else {
        fmt::print(" {:>8.1f}", rate);
      }
      std::fflush(stdout);
    }
    if (!json) fmt::print("\n");
  }
  return 0;
}

}  // namespace
}  // namespace sshsdp::kernels

int main(int argc, char** argv) { return sshsdp::kernels::Main(argc, argv); }
