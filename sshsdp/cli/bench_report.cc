// `sshsdp bench`'s report of one workload (bench_internal.h), on rank 0: the table (tokens/s,
// ratio, MFU, memory, copies, communication, time split), the paired ratios, the kernel
// profile and Muon's update phase when asked, the rows as JSON, and --peer-inputs'
// workload.json for the PyTorch peers.
#include <algorithm>
#include <cmath>
#include <fstream>

#include "sshsdp/base/error.h"
#include "sshsdp/cli/bench_internal.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/hf/hf_config.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {
namespace {

nlohmann::json RowJson(const BenchRow& r, int64_t tokens_per_mb) {
  const CopyBytes& c = r.counters.copies;
  nlohmann::json j = {
      {"batch_size", r.batch},
      {"tokens_per_microbatch", tokens_per_mb},
      {"config", r.label},
      {"redundancies", r.switches},
      {"shard_layout", r.layout},
      {"qkv_model", r.qkv},
      {"median_step_s", r.median_s},
      {"tokens_per_s", r.tokens_per_s},
      {"ratio_to_sshsdp", r.ratio},
      {"ratio_to_sshsdp_paired",
       r.has_paired ? nlohmann::json(r.ratio_paired) : nlohmann::json(nullptr)},
      {"ratio_reference", r.reference},
      {"mfu", r.mfu},
      {"peak_rss_mib", r.rss_mib},
      {"accounted_peak_mib", r.accounted_mib},
      {"accounted_peak_mib_by_category", r.accounted_by_category},
      {"bytes_copied_per_step", r.counters.bytes_copied},
      {"collective_copy_bytes_per_step", r.counters.collective_copy_bytes},
      {"bytes_copied_weights", c.weight_copy_in + c.weight_copy_out + c.weight_pack},
      {"bytes_copied_grads", c.grad_copy + c.grad_unpack},
      {"copies",
       {{"weight_copy_in", c.weight_copy_in},
        {"weight_copy_out", c.weight_copy_out},
        {"weight_pack", c.weight_pack},
        {"grad_copy", c.grad_copy},
        {"grad_unpack", c.grad_unpack},
        {"update_copy", c.update_copy}}},
      {"add_passes", r.counters.add_passes},
      {"update",
       {{"comm_bytes", r.counters.update_comm.total()},
        {"p2p_bytes", r.counters.update_p2p.total()},
        {"full_tensor_bytes", r.counters.update_full_tensor.total()},
        {"full_tensor_calls", r.counters.update_full_tensor.calls},
        {"ns_flops_per_rank", r.counters.update_exec_cost},
        {"copy_bytes", c.update_copy},
        {"outer_overlapped", r.counters.outer_overlapped}}},
      {"weight_preps", r.counters.weight_preps},
      {"comm_intra_bytes_per_step",
       r.counters.runtime_comm.intra_node_bytes + r.counters.update_comm.intra_node_bytes},
      {"comm_inter_bytes_per_step",
       r.counters.runtime_comm.inter_node_bytes + r.counters.update_comm.inter_node_bytes},
      {"time_s",
       {{"compute", r.time.compute},
        {"comm_wait", r.time.comm_wait},
        {"copy", r.time.copy},
        {"cast", r.time.cast},
        {"add", r.time.add},
        {"optimizer", r.time.optimizer},
        {"other", r.time.other}}},
      {"losses", r.losses}};
  if (r.profile.step_s > 0) j["profile"] = StepProfileJson(r.profile);
  return j;
}

// The model of workload.json (bench/peers/peer_models.py builds it): sshsdp's model JSON, plus
// the MoE load-balancing loss weight, a training setting the model JSON leaves out.
nlohmann::json PeerModelJson(const BenchOptions& o, const GptConfig& gc) {
  if (const auto llama = BenchLlama(o)) return LlamaModelJson(*llama);  // no PyTorch peer builds it
  if (!IsMoePreset(o.model)) return GptModelJson(gc);
  MoeConfig c = MoeConfig::Preset(o.model);
  c.trunk = gc;
  nlohmann::json j = MoeModelJson(c);
  j["aux_loss_weight"] = c.aux_loss_weight;
  return j;
}

std::string LabelOf(const BenchRow& r) {
  return fmt::format("{} ({}, {}, {})", r.label, r.switches, r.layout, r.qkv);
}

// The main table. The config column is as wide as its longest label (ablation rungs are
// long); width counts code points, like fmt's padding of the ①–⑦ labels.
void PrintTable(const std::vector<BenchRow>& rows) {
  size_t lw = 30;
  for (const BenchRow& r : rows) {
    const std::string l = LabelOf(r);
    lw = std::max<size_t>(lw, std::count_if(l.begin(), l.end(), [](char ch) {
                            return (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
                          }));
  }
  fmt::print(
      "{:<{}} {:>9} {:>7} {:>6} {:>8} {:>8} {:>10} {:>10} {:>10} | {:>7} {:>7} {:>7} {:>7} {:>7} "
      "{:>7} {:>7}\n",
      "config (switches, layout)", lw, "tok/s", "ratio", "MFU%", "RSS MiB", "acct MiB", "copyW KiB",
      "copyG KiB", "comm KiB", "compute", "commwt", "copy", "cast", "add", "optim", "other");
  const double l0 = rows.front().losses.empty() ? 0 : rows.front().losses[0];
  double worst = 0;
  for (const BenchRow& r : rows) {
    const CopyBytes& c = r.counters.copies;
    const double comm =
        static_cast<double>(r.counters.runtime_comm.total() + r.counters.update_comm.total());
    fmt::print(
        "{:<{}} {:>9.0f} {:>6.2f}x {:>6.2f} {:>8.1f} {:>8.2f} {:>10.1f} {:>10.1f} {:>10.1f} | "
        "{:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f}\n",
        LabelOf(r), lw, r.tokens_per_s, r.ratio, 100 * r.mfu, r.rss_mib, r.accounted_mib,
        (c.weight_copy_in + c.weight_copy_out + c.weight_pack) / 1024.0,
        (c.grad_copy + c.grad_unpack) / 1024.0, comm / 1024.0, 1e3 * r.time.compute,
        1e3 * r.time.comm_wait, 1e3 * r.time.copy, 1e3 * r.time.cast, 1e3 * r.time.add,
        1e3 * r.time.optimizer, 1e3 * r.time.other);
    if (!r.losses.empty() && l0 != 0)
      worst = std::max(worst, std::abs(r.losses[0] - l0) / std::abs(l0));
  }
  fmt::print(
      "(times: ms per step, mean over ranks; copies and comm: per step, rank 0, comm = bytes "
      "sent intra+inter node; first-step losses agree within {:.1e} relative; ratios: tok/s over "
      "the '{}' row)\n",
      worst, rows.front().reference);
}

// The update phase: optimizer time, Newton–Schulz work and update bytes per rank.
void PrintUpdatePhase(const std::string& muon_unit, const std::vector<BenchRow>& rows) {
  fmt::print(
      "\nupdate phase (Muon per {}; rank 0, per step):\n{:<30} {:>9} {:>16} {:>10} {:>12} "
      "{:>12} {:>10}\n",
      muon_unit, "config", "optim ms", "planned NS GFLOP", "update KiB", "p2p KiB", "gather KiB",
      "copy KiB");
  for (const BenchRow& r : rows) {
    const StepCounters& k = r.counters;
    fmt::print("{:<30} {:>9.1f} {:>16.3f} {:>10.1f} {:>12.1f} {:>12.1f} {:>10.1f}\n", r.label,
               1e3 * r.time.optimizer, k.update_exec_cost / 1e9, k.update_comm.total() / 1024.0,
               k.update_p2p.total() / 1024.0, k.update_full_tensor.total() / 1024.0,
               k.copies.update_copy / 1024.0);
  }
}

// --peer-inputs' workload.json: the model, the workload and the rows.
void WritePeerWorkload(const BenchJob& job, int B, const std::vector<BenchRow>& rows) {
  const BenchOptions& o = job.run->o;
  const int64_t tpm = static_cast<int64_t>(B) * job.run->T;
  nlohmann::json wl = {{"model", PeerModelJson(o, job.run->gc)},
                       {"T", job.run->T},
                       {"batch_size", B},
                       {"microbatches", o.microbatches},
                       {"world", job.world->size()},
                       {"warmup", o.warmup},
                       {"steps", o.steps},
                       {"weight_dtype", o.weight_dtype},
                       {"attention_dtype", o.attention_dtype},
                       {"adamw",
                        {{"lr", o.lr},
                         {"beta1", o.beta1},
                         {"beta2", o.beta2},
                         {"eps", o.eps},
                         {"weight_decay", o.weight_decay}}},
                       {"clip", o.clip},
                       {"gemm_peak_flops", job.gemm_peak.per_rank},
                       {"flops_per_token", rows.front().flops_per_token},
                       {"rows", nlohmann::json::array()}};
  for (const BenchRow& r : rows) wl["rows"].push_back(RowJson(r, tpm));
  const std::string dir = fmt::format("{}/b{}", o.peer_inputs, B);
  std::ofstream f(dir + "/workload.json", std::ios::trunc);
  f << wl.dump(2) << "\n";
  SSHSDP_CHECK(f.good(), IoError, "{}/workload.json: write failed", dir);
}

}  // namespace

void ReportWorkload(const BenchJob& job, int B, const std::vector<BenchRow>& rows,
                    nlohmann::json* json) {
  const BenchOptions& o = job.run->o;
  const int64_t tpm = static_cast<int64_t>(B) * job.run->T;
  fmt::print(
      "\nworkload: {} tokens per microbatch per rank (batch {} x seq {}), {} microbatches, {} "
      "ranks\n",
      tpm, B, job.run->T, o.microbatches, job.world->size());
  PrintTable(rows);
  if (!o.sequential) {
    std::vector<std::string> pr;
    for (const BenchRow& r : rows) pr.push_back(fmt::format("{} {:.2f}x", r.label, r.ratio_paired));
    fmt::print("paired ratios (median over rounds of the per-round tok/s ratio): {}\n",
               fmt::join(pr, ", "));
  }
  if (o.profile) {
    std::vector<std::pair<std::string, StepProfile>> prof;
    for (const BenchRow& r : rows) prof.emplace_back(r.label, r.profile);
    fmt::print("{}", StepProfileTable(prof));
  }
  if (job.run->muon) PrintUpdatePhase(o.muon_unit, rows);
  for (const BenchRow& r : rows) {
    json->push_back(RowJson(r, tpm));
    json->back()["gemm_path"] = job.gemm_peak.path;
    json->back()["gemm_peak_flops"] = job.gemm_peak.per_rank;
    json->back()["gemm_peak_pinned"] = job.gemm_peak.pinned;
  }
  if (!o.peer_inputs.empty()) WritePeerWorkload(job, B, rows);
}

}  // namespace sshsdp
