// --fault's wrapper (fault_injection.h).
#include "sshsdp/cli/fault_injection.h"

#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>

#include "sshsdp/base/error.h"

namespace sshsdp {

FaultSpec ParseFault(const std::string& spec) {
  FaultSpec f;
  if (spec.empty()) return f;
  f.spec = spec;
  f.sleep = spec.size() > 6 && spec.compare(spec.size() - 6, 6, ":sleep") == 0;
  long step = -1;
  SSHSDP_CHECK(std::sscanf(spec.c_str(), "%d:%ld", &f.rank, &step) == 2, ConfigError,
               "--fault must be RANK:STEP, got '{}'", spec);
  f.step = step;
  return f;
}

BatchFn WithFault(const FaultSpec& f, int rank, const int64_t* step, BatchFn batch) {
  if (f.rank != rank) return batch;
  return [f, rank, step, batch = std::move(batch)](int mb, int32_t* tok, int32_t* tgt) {
    if (*step + 1 == f.step && mb == 0) {
      if (f.sleep) {  // a long step (signal tests), not a failure
        std::this_thread::sleep_for(std::chrono::seconds(3));
      } else {
        throw CommError(fmt::format("--fault {}: injected failure on rank {} in step {}", f.spec,
                                    rank, f.step));
      }
    }
    batch(mb, tok, tgt);
  };
}

}  // namespace sshsdp
