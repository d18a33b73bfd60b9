// comm_bench: our ring collectives against the raw MPI calls, in the same run.
//
// For all-gather, reduce-scatter and all-reduce (fp32, SUM) over a sweep of sizes it times
// MpiCommunicator's algorithm and the MPI library's own collective (MPI_Allgather in place,
// MPI_Reduce_scatter_block, MPI_Allreduce in place) on the same communicator, alternating
// them iteration by iteration so both see the same machine noise. Each iteration starts
// after a barrier; its time is the slowest rank's; the table reports the median after
// warm-up, nccl-tests bandwidths, and ours/raw (time ratio: < 1 means ours is faster).
// Before timing, each size checks that both produce bit-identical results.
//
//   S = the whole gathered array (AG, RS) or count*4 (AR); algbw = S / t;
//   busbw = algbw * (n-1)/n (AG, RS) or algbw * 2(n-1)/n (AR).
//
//   mpirun -np 4 comm_bench --min-bytes 1K --max-bytes 64M --iters 20 --warmup 3 --json out.json
#include <fmt/format.h>
#include <mpi.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sshsdp/base/bench_util.h"
#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"

namespace sshsdp {
namespace {

struct Options {
  std::string min_bytes = "1K";
  std::string max_bytes = "64M";
  int iters = 20;
  int warmup = 3;
  std::string ops = "ag,rs,ar";
  int ranks_per_node = 0;  // 0: the whole world is one node
  std::string json;
};

struct Row {
  std::string op;
  size_t bytes, count;
  double ours_us, raw_us;
  double ours_algbw, ours_busbw, raw_algbw, raw_busbw;
};

// One collective variant: prepares its buffers (untimed) and runs once (timed).
struct Variant {
  std::function<void()> reset;
  std::function<void()> run;
};

class Bench {
 public:
  Bench(MpiCommunicator& comm, const Options& o) : comm_(comm), o_(o) {}

  // Seconds of one timed call on the slowest rank.
  double TimeOnce(const Variant& v) {
    v.reset();
    CheckMpi(MPI_Barrier(comm_.handle()), "comm_bench: MPI_Barrier");
    const double t0 = MPI_Wtime();
    v.run();
    double dt = MPI_Wtime() - t0;
    CheckMpi(MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm_.handle()),
             "comm_bench: MPI_Allreduce of times");
    return dt;
  }

  Row Measure(const std::string& op, size_t bytes, size_t count, const Variant& ours,
              const Variant& raw, double factor) {
    for (int i = 0; i < o_.warmup; ++i) {
      TimeOnce(ours);
      TimeOnce(raw);
    }
    std::vector<double> t_ours, t_raw;
    for (int i = 0; i < o_.iters; ++i) {  // alternate: both see the same noise
      t_ours.push_back(TimeOnce(ours));
      t_raw.push_back(TimeOnce(raw));
    }
    Row r{op, bytes, count, Median(t_ours) * 1e6, Median(t_raw) * 1e6, 0, 0, 0, 0};
    r.ours_algbw = bytes / (r.ours_us * 1e-6) / 1e9;
    r.raw_algbw = bytes / (r.raw_us * 1e-6) / 1e9;
    r.ours_busbw = r.ours_algbw * factor;
    r.raw_busbw = r.raw_algbw * factor;
    return r;
  }

  // Runs both variants once and checks they agree bit for bit on this rank.
  void Validate(const std::string& op, size_t bytes, const Variant& ours,
                const std::vector<float>& ours_out, const Variant& raw,
                const std::vector<float>& raw_out) {
    ours.reset();
    ours.run();
    std::vector<float> a = ours_out;
    raw.reset();
    raw.run();
    int bad = a.size() != raw_out.size() ||
              std::memcmp(a.data(), raw_out.data(), a.size() * sizeof(float)) != 0;
    CheckMpi(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm_.handle()),
             "comm_bench: MPI_Allreduce");
    SSHSDP_CHECK(!bad, CommError, "comm_bench: {} of {} bytes: ours and MPI's results differ", op,
                 bytes);
  }

  Row AllGather(size_t bytes) {
    const int n = comm_.size(), p = comm_.rank();
    const size_t count = bytes / 4 / n;  // S = the whole gathered array
    std::vector<float> a(count * n), b(count * n);
    auto fill = [&](std::vector<float>& v) {
      for (size_t i = 0; i < count; ++i) v[p * count + i] = static_cast<float>(p * 1000 + i % 997);
    };
    Variant ours{[&] { fill(a); }, [&] { comm_.AllGatherInPlace(a.data(), count, DType::kF32); }};
    Variant raw{[&] { fill(b); },
                [&] {
                  CheckMpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b.data(),
                                         static_cast<int>(count), MPI_FLOAT, comm_.handle()),
                           "MPI_Allgather");
                }};
    Validate("all-gather", bytes, ours, a, raw, b);
    return Measure("all-gather", count * n * 4, count, ours, raw, double(n - 1) / n);
  }

  Row ReduceScatter(size_t bytes) {
    const int n = comm_.size(), p = comm_.rank();
    const size_t count = bytes / 4 / n;  // S = the whole input array
    std::vector<float> send(count * n), a(count), b(count);
    for (size_t j = 0; j < send.size(); ++j) send[j] = static_cast<float>(p * 1000 + j % 997);
    Variant ours{[] {},
                 [&] {
                   comm_.ReduceScatter(send.data(), DType::kF32, a.data(), DType::kF32, count,
                                       false);
                 }};
    Variant raw{[] {},
                [&] {
                  CheckMpi(MPI_Reduce_scatter_block(send.data(), b.data(), static_cast<int>(count),
                                                    MPI_FLOAT, MPI_SUM, comm_.handle()),
                           "MPI_Reduce_scatter_block");
                }};
    Validate("reduce-scatter", bytes, ours, a, raw, b);
    return Measure("reduce-scatter", count * n * 4, count, ours, raw, double(n - 1) / n);
  }

  Row AllReduce(size_t bytes) {
    const int n = comm_.size(), p = comm_.rank();
    const size_t count = bytes / 4;
    std::vector<float> a(count), b(count);
    auto fill = [&](std::vector<float>& v) {
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(p * 1000 + i % 997);
    };
    Variant ours{[&] { fill(a); }, [&] { comm_.AllReduce(a.data(), count, DType::kF32); }};
    Variant raw{[&] { fill(b); },
                [&] {
                  CheckMpi(MPI_Allreduce(MPI_IN_PLACE, b.data(), static_cast<int>(count), MPI_FLOAT,
                                         MPI_SUM, comm_.handle()),
                           "MPI_Allreduce");
                }};
    Validate("all-reduce", bytes, ours, a, raw, b);
    return Measure("all-reduce", count * 4, count, ours, raw, 2.0 * (n - 1) / n);
  }

 private:
  MpiCommunicator& comm_;
  const Options& o_;
};

int Main(int argc, char** argv) {
  Options o;
  CLI::App app{"comm_bench: sshsdp ring collectives vs raw MPI collectives (fp32, SUM)"};
  app.add_option("--min-bytes", o.min_bytes, "smallest size S (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "largest size S; sizes double from min")
      ->capture_default_str();
  app.add_option("--iters", o.iters, "timed iterations per size and variant")
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed iterations per size and variant")
      ->capture_default_str();
  app.add_option("--ops", o.ops, "comma-separated subset of ag,rs,ar")->capture_default_str();
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "simulated node size for the byte counters (0: one node)")
      ->capture_default_str();
  app.add_option("--json", o.json, "write the rows to this JSON file (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) app.exit(e);
    return e.get_exit_code();
  }
  const size_t min_b = ParseBytes(o.min_bytes), max_b = ParseBytes(o.max_bytes);
  SSHSDP_CHECK(min_b >= 1 && min_b <= max_b, ConfigError,
               "--min-bytes ({}) must be positive and at most --max-bytes ({})", o.min_bytes,
               o.max_bytes);
  SSHSDP_CHECK(o.iters >= 1 && o.warmup >= 0, ConfigError,
               "--iters must be >= 1 and --warmup >= 0 (got {} and {})", o.iters, o.warmup);
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  auto comm = MpiCommunicator::World(o.ranks_per_node > 0 ? o.ranks_per_node : world_size);
  const int n = comm->size();
  const bool root = comm->rank() == 0;
  Bench bench(*comm, o);

  std::vector<std::string> ops;
  for (size_t start = 0; start <= o.ops.size();) {
    size_t end = o.ops.find(',', start);
    if (end == std::string::npos) end = o.ops.size();
    const std::string op = o.ops.substr(start, end - start);
    SSHSDP_CHECK(op == "ag" || op == "rs" || op == "ar", ConfigError,
                 "--ops: unknown collective '{}'; use ag, rs, ar", op);
    ops.push_back(op);
    start = end + 1;
  }

  if (root) {
    fmt::print(
        "# comm_bench: {} ranks, fp32 SUM, median of {} iterations after {} warm-up, "
        "time = slowest rank\n",
        n, o.iters, o.warmup);
    fmt::print("{:>14} {:>8} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "op", "size",
               "ours_us", "raw_us", "ours_alg", "ours_bus", "raw_alg", "raw_bus", "ours/raw");
    fmt::print("{:>14} {:>8} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "", "(S)", "", "",
               "GB/s", "GB/s", "GB/s", "GB/s", "time");
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& op : ops) {
    for (size_t bytes = min_b; bytes <= max_b; bytes *= 2) {
      Row r = op == "ag"   ? bench.AllGather(bytes)
              : op == "rs" ? bench.ReduceScatter(bytes)
                           : bench.AllReduce(bytes);
      if (r.count == 0) continue;  // smaller than one element per rank
      if (root) {
        fmt::print(
            "{:>14} {:>8} {:>11.1f} {:>11.1f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f}\n", r.op,
            HumanBytes(r.bytes), r.ours_us, r.raw_us, r.ours_algbw, r.ours_busbw, r.raw_algbw,
            r.raw_busbw, r.ours_us / r.raw_us);
        std::fflush(stdout);
      }
      rows.push_back({{"op", r.op},
                      {"ranks", n},
                      {"bytes", r.bytes},
                      {"count", r.count},
                      {"ours_us", r.ours_us},
                      {"raw_us", r.raw_us},
                      {"ours_algbw_GBps", r.ours_algbw},
                      {"ours_busbw_GBps", r.ours_busbw},
                      {"raw_algbw_GBps", r.raw_algbw},
                      {"raw_busbw_GBps", r.raw_busbw},
                      {"ours_over_raw", r.ours_us / r.raw_us}});
    }
  }
  if (root && !o.json.empty()) {
    std::ofstream f(o.json);
    SSHSDP_CHECK(f.good(), IoError, "cannot write --json file '{}'", o.json);
    f << nlohmann::json{{"ranks", n}, {"iters", o.iters}, {"warmup", o.warmup}, {"rows", rows}}
             .dump(2)
      << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace sshsdp

int main(int argc, char** argv) {
  return sshsdp::RunMpiMain(argc, argv, [&] { return sshsdp::Main(argc, argv); });
}
