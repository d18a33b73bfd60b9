// direct_bench: the direct (ZeroSM) path against the ring collectives, in the same run — the
// communication half of the paper's Figure 8 comparison (the engine half is
// engine/comm_path_bench).
//
// For the per-microbatch all-gather and reduce-scatter (fp32; the reduce-scatter accumulates
// into its destination as G′ᶻ² does), over per-rank shard sizes (the workload one rank
// contributes / receives) and simulated node counts, it times MpiCommunicator's ring and
// DirectCommunicator on the same ranks, alternating iteration by iteration so both see the same
// machine noise. An iteration starts after a barrier; its time is the slowest rank's; rows show
// the median after warm-up. Before timing, each case checks both give identical results (all-
// gather bit for bit; reduce-scatter on integer-valued data, exact). Bytes columns are exact
// job-wide inter-node bytes of one call (sum over ranks of the counters).
//
//   mpirun -np 8 direct_bench --min-bytes 4K --max-bytes 4M --nodes 1,2,4 --json out.json
#include <fmt/format.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sshsdp/base/bench_util.h"
#include "sshsdp/base/error.h"
#include "sshsdp/comm/direct_communicator.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"

namespace sshsdp {
namespace {

struct Options {
  std::string min_bytes = "4K";
  std::string max_bytes = "4M";
  std::string nodes = "1,2";
  std::string ops = "ag,rs";
  int iters = 20;
  int warmup = 3;
  std::string json;
};

// Seconds of one call on the slowest rank.
double TimeOnce(MPI_Comm comm, const std::function<void()>& f) {
  CheckMpi(MPI_Barrier(comm), "direct_bench: MPI_Barrier");
  const double t0 = MPI_Wtime();
  f();
  double dt = MPI_Wtime() - t0;
  CheckMpi(MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm), "MPI_Allreduce");
  return dt;
}

// Job-wide inter-node bytes of one call: sum over ranks of the counter delta.
uint64_t JobInter(MPI_Comm comm, const Communicator& c, const CommCounters& before) {
  uint64_t d = c.counters().inter_node_bytes - before.inter_node_bytes;
  CheckMpi(MPI_Allreduce(MPI_IN_PLACE, &d, 1, MPI_UINT64_T, MPI_SUM, comm), "MPI_Allreduce");
  return d;
}

struct Row {
  std::string op;
  int nodes = 1, per_node = 1;
  size_t shard_bytes = 0;
  double ring_us = 0, direct_us = 0;
  uint64_t ring_inter = 0, direct_inter = 0;
};

int Main(int argc, char** argv) {
  Options o;
  CLI::App app{"direct_bench: direct (ZeroSM) path vs ring collectives, fp32, same run"};
  app.add_option("--min-bytes", o.min_bytes, "smallest per-rank shard (K/M/G)")
      ->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "largest per-rank shard; sizes go up x4")
      ->capture_default_str();
  app.add_option("--nodes", o.nodes, "simulated node counts (those dividing the world)")
      ->capture_default_str();
  app.add_option("--ops", o.ops, "ag, rs or both")->capture_default_str();
  app.add_option("--iters", o.iters, "timed iterations per case and path")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed iterations per case and path")
      ->capture_default_str();
  app.add_option("--json", o.json, "write the rows to this JSON file (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (WorldRankOrMinusOne() == 0) app.exit(e);
    return e.get_exit_code();
  }
  const size_t min_b = ParseBytes(o.min_bytes), max_b = ParseBytes(o.max_bytes);
  SSHSDP_CHECK(min_b >= 4 && min_b <= max_b, ConfigError,
               "--min-bytes must be >= 4 and <= --max-bytes");
  SSHSDP_CHECK(o.iters >= 1 && o.warmup >= 0, ConfigError, "--iters >= 1, --warmup >= 0");
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const bool root = WorldRankOrMinusOne() == 0;
  std::vector<Row> rows;
  if (root) {
    fmt::print(
        "# direct_bench: {} ranks, fp32, median of {} iterations after {} warm-up, time = "
        "slowest rank; inter = job-wide inter-node bytes of one call\n",
        W, o.iters, o.warmup);
    fmt::print("{:>3} {:>9} {:>8} {:>11} {:>11} {:>8} {:>12} {:>12} {:>7}\n", "op", "nodes",
               "shard", "ring_us", "direct_us", "dir/ring", "ring_inter", "direct_inter", "ratio");
  }
  for (const std::string& ns : SplitList(o.nodes)) {
    const int nodes = std::stoi(ns);
    if (nodes < 1 || W % nodes != 0) continue;
    const int rpn = W / nodes;
    auto ring = MpiCommunicator::World(rpn);
    auto direct = DirectCommunicator::Create(MpiCommunicator::World(rpn));
    const MPI_Comm comm = ring->handle();
    const int n = W, p = ring->rank();
    const size_t max_count = max_b / 4;
    auto root_node = std::make_unique<DataNode>("bench.buffer");
    root_node->AddChild("buf", DType::kF32, {static_cast<int64_t>(n * max_count)});
    root_node->Finalize();
    float* reg = direct->Register(std::move(root_node)).FindChild("buf")->data_as<float>();
    direct->ReserveReduceScatter(max_count);
    std::vector<float> plain(n * max_count), send(max_count), out_r(max_count), out_d(max_count);
    for (const std::string& op : SplitList(o.ops)) {
      SSHSDP_CHECK(op == "ag" || op == "rs", ConfigError, "--ops: unknown '{}'", op);
      for (size_t bytes = min_b; bytes <= max_b; bytes *= 4) {
        const size_t count = bytes / 4;
        std::function<void()> run_ring, run_direct;
        if (op == "ag") {
          for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>(p * 1000 + i % 997);
          run_ring = [&] { ring->AllGather(send.data(), plain.data(), count, DType::kF32); };
          run_direct = [&] { direct->AllGather(send.data(), reg, count, DType::kF32); };
          run_ring();
          run_direct();
          int bad = std::memcmp(plain.data(), reg, n * count * 4) != 0;
          MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm);
          SSHSDP_CHECK(!bad, CommError, "direct_bench: all-gather results differ ({} B)", bytes);
        } else {
          for (size_t j = 0; j < n * count; ++j)
            plain[j] = reg[j] = static_cast<float>((p * 31 + j) % 61) - 30.0f;
          run_ring = [&] {
            ring->ReduceScatter(plain.data(), DType::kF32, out_r.data(), DType::kF32, count, true);
          };
          run_direct = [&] {
            direct->ReduceScatter(reg, DType::kF32, out_d.data(), DType::kF32, count, true);
          };
          std::fill(out_r.begin(), out_r.end(), 0.0f);
          std::fill(out_d.begin(), out_d.end(), 0.0f);
          run_ring();
          run_direct();
          int bad = std::memcmp(out_r.data(), out_d.data(), count * 4) != 0;
          MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm);
          SSHSDP_CHECK(!bad, CommError, "direct_bench: reduce-scatter results differ ({} B)",
                       bytes);
        }
        Row r{op, nodes, rpn, bytes};
        CommCounters rb = ring->counters(), db = direct->counters();
        run_ring();
        run_direct();
        r.ring_inter = JobInter(comm, *ring, rb);
        r.direct_inter = JobInter(comm, *direct, db);
        for (int i = 0; i < o.warmup; ++i) {
          TimeOnce(comm, run_ring);
          TimeOnce(comm, run_direct);
        }
        std::vector<double> tr, td;
        for (int i = 0; i < o.iters; ++i) {
          tr.push_back(TimeOnce(comm, run_ring));
          td.push_back(TimeOnce(comm, run_direct));
        }
        r.ring_us = Median(tr) * 1e6;
        r.direct_us = Median(td) * 1e6;
        if (root) {
          fmt::print("{:>3} {:>4}x{:<4} {:>8} {:>11.1f} {:>11.1f} {:>8.3f} {:>12} {:>12} {:>7}\n",
                     r.op, nodes, rpn, HumanBytes(bytes), r.ring_us, r.direct_us,
                     r.direct_us / r.ring_us, r.ring_inter, r.direct_inter,
                     r.direct_inter ? fmt::format("{:.2f}", double(r.ring_inter) / r.direct_inter)
                                    : std::string("-"));
          std::fflush(stdout);
        }
        rows.push_back(r);
      }
    }
  }
  if (root && !o.json.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows) {
      j.push_back({{"op", r.op},
                   {"nodes", r.nodes},
                   {"ranks_per_node", r.per_node},
                   {"shard_bytes", r.shard_bytes},
                   {"ring_us", r.ring_us},
                   {"direct_us", r.direct_us},
                   {"direct_over_ring", r.direct_us / r.ring_us},
                   {"ring_inter_bytes", r.ring_inter},
                   {"direct_inter_bytes", r.direct_inter}});
    }
    std::ofstream f(o.json);
    SSHSDP_CHECK(f.good(), IoError, "cannot write --json file '{}'", o.json);
    f << nlohmann::json{{"ranks", W}, {"iters", o.iters}, {"warmup", o.warmup}, {"rows", j}}.dump(2)
      << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace sshsdp

int main(int argc, char** argv) {
  return sshsdp::RunMpiMain(argc, argv, [&] { return sshsdp::Main(argc, argv); });
}
