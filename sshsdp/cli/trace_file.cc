// The --trace file: step window, aligned clocks, gather to rank 0, atomic write (see
// trace_file.h).
#include "sshsdp/cli/trace_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "sshsdp/base/error.h"
#include "sshsdp/base/posix_file.h"

namespace sshsdp {

TraceWindow ParseTraceSteps(const std::string& spec) {
  TraceWindow w;
  long long a = 0, b = 0;
  int used = -1;  // characters consumed: the whole text must be "A:B" or "A"
  int n = std::sscanf(spec.c_str(), "%lld:%lld%n", &a, &b, &used);
  if (n != 2 || used != static_cast<int>(spec.size())) {
    used = -1;
    n = std::sscanf(spec.c_str(), "%lld%n", &a, &used) == 1 ? 1 : 0;
    b = a;
  }
  SSHSDP_CHECK(n >= 1 && used == static_cast<int>(spec.size()) && a >= 1 && b >= a, ConfigError,
               "--trace-steps must be A:B with 1 <= A <= B (steps A to B traced) or one step A, "
               "got '{}'",
               spec);
  w.first = a, w.last = b;
  return w;
}

void StartTrace(Tracer& tracer, Communicator& world) {
  world.Barrier();
  tracer.SetOrigin(Tracer::Clock::now());
  tracer.SetProcess(world.rank());
}

void WriteTraceFile(const Tracer& tracer, Communicator& world, const std::string& path,
                    const std::vector<std::string>& rows) {
  const int W = world.size();
  const std::string mine = tracer.EventsJson();
  // Sizes, then every rank's text padded to the largest (raw bytes through the byte dtype).
  uint64_t len = mine.size();
  std::vector<uint64_t> lens(W);
  world.AllGather(&len, lens.data(), 8, DType::kE4M3);
  const uint64_t max_len = *std::max_element(lens.begin(), lens.end());
  std::string padded = mine;
  padded.resize(max_len, ' ');
  std::string all(max_len * W, ' ');
  if (max_len > 0) world.AllGather(padded.data(), all.data(), max_len, DType::kE4M3);
  if (world.rank() != 0) return;
  std::vector<std::string> events;
  for (int r = 0; r < W; ++r) events.push_back(all.substr(r * max_len, lens[r]));
  const std::string text = TraceDocument(events, rows);
  WriteFileAtomically(path, [&](OutFile& f) { f.Write(text.data(), text.size()); });
}

}  // namespace sshsdp
