// Step profile tables of `sshsdp bench --profile` (see bench_profile.h).
#include "sshsdp/cli/bench_profile.h"

#include <fmt/format.h>

namespace sshsdp {
namespace {

// Columns after the kernels: the engine's own categories.
struct Column {
  const char* name;
  double value;
};

std::vector<Column> Columns(const StepProfile& p) {
  std::vector<Column> c;
  double kernels = 0;
  for (int i = 0; i < kOpCategories; ++i) {
    c.push_back({OpCategoryName(static_cast<OpCategory>(i)), p.kernels[i]});
    kernels += p.kernels[i];
  }
  const TimeSplit& t = p.time;
  c.push_back({"compute other", t.compute - kernels});
  c.push_back({"comm wait", t.comm_wait});
  c.push_back({"copy+cast+add", t.copy + t.cast + t.add});
  c.push_back({"optimizer", t.optimizer});
  c.push_back(
      {"other", p.step_s - (t.compute + t.comm_wait + t.copy + t.cast + t.add + t.optimizer)});
  return c;
}

}  // namespace

std::string StepProfileTable(const std::vector<std::pair<std::string, StepProfile>>& rows) {
  std::string out =
      "\nstep profile (ms per step, mean over ranks and timed steps: the step column is that "
      "mean, not the median behind tok/s; % of it):\n";
  if (rows.empty()) return out;
  size_t lw = 6;
  for (const auto& [label, p] : rows) lw = std::max(lw, label.size());
  out += fmt::format("{:<{}} {:>8}", "config", lw, "step");
  for (const Column& c : Columns(rows.front().second)) out += fmt::format(" {:>14}", c.name);
  out += "\n";
  for (const auto& [label, p] : rows) {
    out += fmt::format("{:<{}} {:>8.1f}", label, lw, 1e3 * p.step_s);
    if (!p.profiled) {
      out += "  (this model keeps no kernel profile)\n";
      continue;
    }
    for (const Column& c : Columns(p)) {
      out += fmt::format(" {:>7.1f} {:>5.1f}%", 1e3 * c.value,
                         p.step_s > 0 ? 100 * c.value / p.step_s : 0.0);
    }
    out += "\n";
  }
  return out;
}

nlohmann::json StepProfileJson(const StepProfile& p) {
  nlohmann::json j = {{"step_s", p.step_s}, {"profiled", p.profiled}};
  if (!p.profiled) return j;
  for (const Column& c : Columns(p)) j["seconds"][c.name] = c.value;
  return j;
}

}  // namespace sshsdp
