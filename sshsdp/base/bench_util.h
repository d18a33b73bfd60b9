// Small helpers every benchmark binary shares (comm_bench, direct_bench, update_bench,
// gpt_bench, `sshsdp bench`): the median of timed samples, byte sizes on the command line
// ("64K", "4MiB") and back, and comma-separated lists.
//
//   const size_t max_b = ParseBytes(o.max_bytes);        // "4M" -> 4194304, ConfigError if bad
//   fmt::print("{} {:.1f} us\n", HumanBytes(b), 1e6 * Median(samples));
//   for (const std::string& op : SplitList("ag,rs")) ...
//   double s = MedianSeconds(7, [&] { Kernel(...); });
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp {

// Median of the samples (mean of the two middle ones for an even count; 0 when empty).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median wall time in seconds of `reps` calls of f (kernel benchmarks).
template <typename F>
double MedianSeconds(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  return Median(t);
}

// "4096", "4K", "4KiB", "64M", "1G", "512B" -> bytes. ConfigError naming the text otherwise.
inline size_t ParseBytes(const std::string& s) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    throw ConfigError(fmt::format("bad size '{}': use a number with optional K, M or G", s));
  }
  const std::string suffix = s.substr(pos);
  if (suffix == "K" || suffix == "KiB") return v << 10;
  if (suffix == "M" || suffix == "MiB") return v << 20;
  if (suffix == "G" || suffix == "GiB") return v << 30;
  SSHSDP_CHECK(suffix.empty() || suffix == "B", ConfigError,
               "bad size '{}': use a number with optional K, M or G", s);
  return v;
}

// Bytes as the shortest exact "…G", "…M", "…K" or plain number.
inline std::string HumanBytes(size_t b) {
  if (b >= (size_t{1} << 30) && b % (size_t{1} << 30) == 0) return fmt::format("{}G", b >> 30);
  if (b >= (size_t{1} << 20) && b % (size_t{1} << 20) == 0) return fmt::format("{}M", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{}K", b >> 10);
  return fmt::format("{}", b);
}

// "a,b,,c" -> {"a", "b", "", "c"} (empty items kept, so callers can reject them by name).
inline std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace sshsdp
