// Tracer: recording spans and writing them as Chrome trace events (see trace.h).
#include "sshsdp/base/trace.h"

#include <fmt/format.h>

namespace sshsdp {
namespace {

std::string Escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {  // control characters: \u00XX
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
      continue;
    }
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace

void Tracer::Record(const char* name, const char* cat, int lane, Clock::time_point begin,
                    Clock::time_point end, TraceArgs args) {
  using us = std::chrono::duration<double, std::micro>;
  Event e{name,
          cat,
          pid_.load(std::memory_order_relaxed),
          lane,
          us(begin - origin_).count(),
          us(end - begin).count(),
          std::move(args)};
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

size_t Tracer::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

std::string Tracer::EventsJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const Event& e : events_) {
    if (!out.empty()) out += ",\n";
    out += fmt::format(R"({{"name":"{}","cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.3f},)"
                       R"("dur":{:.3f},"args":{{)",
                       Escaped(e.name), Escaped(e.cat), e.pid, e.lane, e.ts_us, e.dur_us);
    for (size_t i = 0; i < e.args.size(); ++i)
      out += fmt::format(R"({}"{}":{})", i ? "," : "", Escaped(e.args[i].first), e.args[i].second);
    out += "}}";
  }
  return out;
}

std::string TraceDocument(const std::vector<std::string>& events,
                          const std::vector<std::string>& process_names) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto add = [&](const std::string& e) {
    if (e.empty()) return;
    if (!first) out += ",\n";
    out += e;
    first = false;
  };
  for (size_t pid = 0; pid < process_names.size(); ++pid) {
    add(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"{}"}}}})", pid,
                    Escaped(process_names[pid])));
    add(fmt::format(
        R"({{"name":"process_sort_index","ph":"M","pid":{},"args":{{"sort_index":{}}}}})", pid,
        pid));
    for (auto [tid, name] :
         {std::pair{kTraceCompute, "compute"}, std::pair{kTraceComm, "communication"}})
      add(fmt::format(
          R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})", pid, tid,
          name));
  }
  for (const std::string& e : events) add(e);
  out += "\n]}\n";
  return out;
}

}  // namespace sshsdp
