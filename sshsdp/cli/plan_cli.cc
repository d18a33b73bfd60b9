// `sshsdp plan` (see plan_cli.h): options, the text report and the JSON document of a RunPlan.
#include "sshsdp/cli/plan_cli.h"

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "sshsdp/backend/backend.h"
#include "sshsdp/base/error.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/cli/train_backend.h"
#include "sshsdp/engine/plan.h"
#include "sshsdp/models/data.h"

namespace sshsdp {
namespace {

double MiB(uint64_t b) { return static_cast<double>(b) / 1048576.0; }

nlohmann::json CountersJson(const CommCounters& c) {
  return {{"intra_node_bytes", c.intra_node_bytes},
          {"inter_node_bytes", c.inter_node_bytes},
          {"calls", c.calls},
          {"local_copy_bytes", c.local_copy_bytes}};
}

nlohmann::json PlanJson(const RunPlan& p, const std::string& model) {
  nlohmann::json j;
  const EngineConfig& c = p.cfg;
  j["model"] = model;
  j["layout"] = {{"world", p.topo.world()},
                 {"ranks_per_node", p.topo.ranks_per_node()},
                 {"sw", p.topo.sw()},
                 {"sg", p.topo.sg()},
                 {"so", p.topo.so()},
                 {"replicas", p.topo.num_replicas()},
                 {"microbatches", c.microbatches},
                 {"batch_size", c.batch_size},
                 {"seq_len", c.seq_len},
                 {"weight_dtype", DTypeName(c.weight_dtype)},
                 {"reduce", ReduceModeName(c.reduce)}};
  for (const PlannedGroup& g : p.groups)
    j["groups"].push_back({{"group", g.group},
                           {"numel", g.numel},
                           {"padded", g.padded},
                           {"dtype", g.dtype},
                           {"members", g.members},
                           {"update_params", g.update_params}});
  for (const RankPlan& r : p.ranks) {
    nlohmann::json jr;
    jr["rank"] = r.rank;
    jr["coord"] = {r.coord.a, r.coord.b, r.coord.c, r.coord.d};
    jr["memory_bytes"] = r.memory;
    jr["peak_bytes"] = r.peak;
    for (const PlannedCollective& k : r.collectives)
      jr["collectives"].push_back({{"name", k.name},
                                   {"group", k.group},
                                   {"group_size", k.group_size},
                                   {"calls", k.calls},
                                   {"sent", CountersJson(k.sent)}});
    jr["runtime_comm"] = CountersJson(r.runtime_comm);
    jr["update_comm"] = CountersJson(r.update_comm);
    jr["update_p2p"] = CountersJson(r.update_p2p);
    jr["gathers"] = r.gathers;
    jr["reduce_scatters"] = r.reduce_scatters;
    jr["newton_schulz_flops"] = r.update_exec_cost;
    jr["mx_p2p_bytes"] = r.mx_p2p_bytes;
    j["ranks"].push_back(std::move(jr));
  }
  j["muon"] = {{"units", p.muon_units}, {"split", p.muon_split}};
  for (const PlannedUnit& u : p.units)
    j["muon"]["unit_list"].push_back({{"name", u.name},
                                      {"shape", {u.rows, u.cols}},
                                      {"owners", u.owners},
                                      {"exec_rank", u.exec_rank},
                                      {"flops", u.cost}});
  for (const PlannedChunk& ch : p.chunks)
    j["zero1_owners"].push_back({{"group", ch.group},
                                 {"chunk", ch.chunk},
                                 {"begin", ch.begin},
                                 {"end", ch.end},
                                 {"owners", ch.owners},
                                 {"members", ch.members}});
  return j;
}

// A row of per-rank values: one column per rank, or min / mean / max for many ranks.
std::string Row(const std::vector<double>& v, bool columns, const char* fmt_one) {
  std::string out;
  if (columns) {
    for (double x : v) out += fmt::format(fmt::runtime(fmt_one), x);
    return out;
  }
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return fmt::format(fmt::runtime(fmt_one), *lo) + fmt::format(fmt::runtime(fmt_one), mean) +
         fmt::format(fmt::runtime(fmt_one), *hi);
}

void PrintText(const RunPlan& p, const std::string& model, int max_columns) {
  const EngineConfig& c = p.cfg;
  const int W = p.topo.world();
  const bool columns = W <= max_columns;
  size_t numel = 0;
  for (const PlannedGroup& g : p.groups) numel += g.numel;
  fmt::print(
      "sshsdp plan: {} ({:.2f} M parameters, {} runtime groups) on {}\n"
      "  {} runtime weights, {} reduction, {} microbatch(es) of {} x {} tokens per rank{}{}\n\n",
      model, numel / 1e6, p.groups.size(), p.topo.ToString(), DTypeName(c.weight_dtype),
      ReduceModeName(c.reduce), c.microbatches, c.batch_size, c.seq_len,
      c.reshard_after_forward ? "" : ", gathered weights kept for backward",
      c.prefetch ? "" : ", no prefetch");
  std::string head = columns ? "" : fmt::format("{:>12}{:>12}{:>12}", "min", "mean", "max");
  if (columns)
    for (int r = 0; r < W; ++r) head += fmt::format("{:>12}", fmt::format("rank {}", r));
  fmt::print(
      "memory per rank, MiB (accounted as the engine accounts it; activations are the "
      "model's and not planned)\n  {:<26}{}\n",
      "", head);
  std::vector<std::string> cats;
  for (const RankPlan& r : p.ranks)
    for (const auto& [k, v] : r.memory)
      if (std::find(cats.begin(), cats.end(), k) == cats.end()) cats.push_back(k);
  for (const std::string& k : cats) {
    std::vector<double> v;
    for (const RankPlan& r : p.ranks) v.push_back(MiB(r.memory.count(k) ? r.memory.at(k) : 0));
    fmt::print("  {:<26}{}\n", k, Row(v, columns, "{:>12.3f}"));
  }
  std::vector<double> peak;
  for (const RankPlan& r : p.ranks) peak.push_back(MiB(r.peak));
  fmt::print("  {:<26}{}\n\n", "peak (sum)", Row(peak, columns, "{:>12.3f}"));

  fmt::print(
      "bytes each rank sends per optimizer step, MiB (ring collectives: to the next rank "
      "of the group)\n  {:<34}{:>6}{}\n",
      "collective [group: ranks]", "calls", head);
  std::vector<std::string> names;
  for (const RankPlan& r : p.ranks)
    for (const PlannedCollective& k : r.collectives)
      if (std::find(names.begin(), names.end(), k.name) == names.end()) names.push_back(k.name);
  auto find = [](const RankPlan& r, const std::string& n) -> const PlannedCollective* {
    for (const PlannedCollective& k : r.collectives)
      if (k.name == n) return &k;
    return nullptr;
  };
  for (const std::string& n : names) {
    const PlannedCollective* first = nullptr;
    for (const RankPlan& r : p.ranks)
      if ((first = find(r, n))) break;
    std::vector<double> total, inter;
    for (const RankPlan& r : p.ranks) {
      const PlannedCollective* k = find(r, n);
      total.push_back(k ? MiB(k->sent.total()) : 0);
      inter.push_back(k ? MiB(k->sent.inter_node_bytes) : 0);
    }
    const std::string label = fmt::format("{} [{}: {}]", n, first->group, first->group_size);
    fmt::print("  {:<34}{:>6}{}\n", label, first->calls, Row(total, columns, "{:>12.3f}"));
    if (*std::max_element(inter.begin(), inter.end()) > 0)
      fmt::print("  {:<34}{:>6}{}\n", "  of it inter-node", "", Row(inter, columns, "{:>12.3f}"));
  }
  std::vector<double> rt, up;
  for (const RankPlan& r : p.ranks) {
    rt.push_back(MiB(r.runtime_comm.total()));
    up.push_back(MiB(r.update_comm.total()));
  }
  fmt::print("  {:<34}{:>6}{}\n", "runtime total", "", Row(rt, columns, "{:>12.3f}"));
  fmt::print("  {:<34}{:>6}{}\n\n", "update phase total", "", Row(up, columns, "{:>12.3f}"));

  if (p.muon_units > 0) {
    std::vector<double> flops, p2p;
    for (const RankPlan& r : p.ranks) {
      flops.push_back(r.update_exec_cost / 1e9);
      p2p.push_back(MiB(r.update_p2p.total()));
    }
    const double mean = std::accumulate(flops.begin(), flops.end(), 0.0) / W;
    const double hi = *std::max_element(flops.begin(), flops.end());
    fmt::print(
        "structured update: {} Muon units, {} split across ZeRO-1 shards (each run by one "
        "owner, its pieces moved point to point)\n",
        p.muon_units, p.muon_split);
    fmt::print("  {:<32}{}\n", "Newton-Schulz GFLOP", Row(flops, columns, "{:>12.4f}"));
    fmt::print("  {:<32}{}\n", "point-to-point MiB sent", Row(p2p, columns, "{:>12.4f}"));
    fmt::print("  balance (max / mean Newton-Schulz work): {:.3f}\n", mean > 0 ? hi / mean : 1.0);
    int shown = 0;
    for (const PlannedUnit& u : p.units) {
      if (u.owners.size() < 2) continue;
      if (shown++ == 12) {
        fmt::print("  ... ({} split units in all; --json lists every unit)\n", p.muon_split);
        break;
      }
      std::string owners;
      for (int o : u.owners) owners += fmt::format("{}{}", owners.empty() ? "" : ",", o);
      fmt::print("  split {:<28} [{} x {}] owners {{{}}} -> runs on rank {} ({:.3f} MFLOP)\n",
                 u.name, u.rows, u.cols, owners, u.exec_rank, u.cost / 1e6);
    }
    fmt::print("\n");
  }

  fmt::print("ZeRO-1 owner map (chunk -> owning rank in each HSDP replica; members inside)\n");
  for (const PlannedChunk& ch : p.chunks) {
    std::string owners;
    for (int o : ch.owners) owners += fmt::format("{}{}", owners.empty() ? "" : ",", o);
    std::string members;
    for (size_t i = 0; i < ch.members.size(); ++i) {
      if (i == 6) {
        members += fmt::format(" ... (+{})", ch.members.size() - 6);
        break;
      }
      members += (i ? ", " : "") + ch.members[i];
    }
    fmt::print("  group {:>2} chunk {:>2} [{:>9}, {:>9}) rank {:<8} {}\n", ch.group, ch.chunk,
               ch.begin, ch.end, owners, members.empty() ? "(padding)" : members);
  }
}

}  // namespace

void AddPlanOptions(CLI::App& app, PlanOptions& o) {
  // plan's own options are not the run's: --dump-config leaves them out.
  app.add_option("-n,--world-size", o.world_size,
                 "ranks the run will have (what mpirun -np would be given)")
      ->required()
      ->configurable(false);
  app.add_flag("--json", o.json, "print the whole plan as one JSON document")->configurable(false);
  app.add_option("--rank-columns", o.max_rank_columns,
                 "text output: one column per rank up to this many ranks, else min / mean / max")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->configurable(false);
  AddTrainOptions(app, o.train);
}

int RunPlanCommand(const PlanOptions& o) {
  try {
    const TrainOptions& t = o.train;
    SSHSDP_CHECK(o.world_size >= 1, ConfigError, "--world-size must be >= 1, got {}", o.world_size);
    // The plan models every rank: 8,192 ranks take 0.7 s on one Zen 5 core, 65,536 about 20 s
    // (a fully sharded world's executors each walk the replica's unit pieces). Beyond that it
    // would not answer in reasonable time, and its per-rank figures repeat with the layout.
    constexpr int kMaxPlanWorld = 65536;
    SSHSDP_CHECK(o.world_size <= kMaxPlanWorld, ConfigError,
                 "--world-size {}: sshsdp plan models every rank and plans at most {}; plan a "
                 "smaller world with the same --sw/--sg/--so and --ranks-per-node: the per-rank "
                 "figures repeat",
                 o.world_size, kMaxPlanWorld);
    SSHSDP_CHECK(t.resume.empty(), ConfigError,
                 "sshsdp plan does not read checkpoints: give the layout the resumed run will use "
                 "(--sw/--sg/--so/--ranks-per-node; without them a resume adopts the saved one, "
                 "which `sshsdp ckpt inspect {}` prints)",
                 t.resume);
    CheckRanksPerNode(t.ranks_per_node, o.world_size);
    SSHSDP_CHECK(t.vocab_size >= 0 && t.vocab_size <= kMaxTokenFileVocab, ConfigError,
                 "--vocab-size must lie in 1..{} (0: from the data), got {}", kMaxTokenFileVocab,
                 t.vocab_size);
    const int T = t.seq_len ? t.seq_len : MakeGptConfig(t, 256).seq_len;
    int vocab = t.vocab_size ? t.vocab_size : 256;
    if (t.data != "synthetic") vocab = TokenFile(t.data, t.vocab_size, T, t.seed).vocab();
    const GptConfig gc = MakeGptConfig(t, vocab);
    const std::unique_ptr<Model> model = MakeModel(t, gc);
    EngineConfig cfg = EngineConfigOf(t, o.world_size, T);
    // A run on the CPU backend: what a device keeps beyond it (MXFP8's S′ and band scales
    // there, the update's roots between steps), a GPU run's comm-path choice and staging
    // buffers are not modelled.
    CheckBackendOptions(t);
    SSHSDP_CHECK(t.backend == "cpu", ConfigError,
                 "sshsdp plan plans runs on the CPU backend (what a device keeps on it; a GPU "
                 "run's direct / NCCL paths and staging buffers are not modelled): plan --backend "
                 "{} as --backend cpu",
                 t.backend);
    const RunPlan plan = PlanRun(*model, o.world_size, cfg);
    const std::string what = fmt::format("{} {}", ModelName(t), ModelDescription(t, gc));
    if (o.json) {
      fmt::print("{}\n", PlanJson(plan, what).dump(1));
    } else {
      PrintText(plan, what, o.max_rank_columns);
    }
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "sshsdp plan: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace sshsdp
