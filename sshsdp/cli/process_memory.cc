// Resident memory of this process (process_memory.h).
#include "sshsdp/cli/process_memory.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {

namespace {

// A /proc/self/status field in MiB (0 when missing).
double StatusMiB(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line)) {
    if (line.compare(0, n, key) == 0) return std::stod(line.substr(n)) / 1024.0;
  }
  return 0;
}

}  // namespace

double PeakRssMiB() { return StatusMiB("VmHWM:"); }
double CurrentRssMiB() { return StatusMiB("VmRSS:"); }
void ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  if (f) f << "5";
}

void CheckModelFitsNode(double params, int world_size, int local_ranks) {
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double node = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * page;
  const double need = 12.0 * params / std::max(world_size, 1) * std::max(local_ranks, 1);
  SSHSDP_CHECK(node <= 0 || need <= node, ConfigError,
               "the model has {:.3g} parameters: at 12 bytes per parameter (fp32 weights, "
               "gradients, one optimizer moment) sharded over {} rank{}, the {} on this node "
               "would need at least {:.1f} GiB, more than its {:.1f} GiB of memory; use a smaller "
               "model (--layers, --d-model) or more ranks on more nodes",
               params, world_size, world_size == 1 ? "" : "s",
               local_ranks == 1 ? std::string("rank") : fmt::format("{} ranks", local_ranks),
               need / 1073741824.0, node / 1073741824.0);
}

void CheckActivationsFitNode(double bytes_per_rank, int local_ranks, const std::string& batch) {
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double node = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * page;
  const double need = bytes_per_rank * std::max(local_ranks, 1);
  SSHSDP_CHECK(node <= 0 || need <= node, ConfigError,
               "a microbatch of {} per rank keeps at least {:.1f} GiB of activations on {} "
               "({} on this node), more than its {:.1f} GiB of memory; lower --batch-size or "
               "--seq-len (--microbatches keeps the tokens per step)",
               batch, need / 1073741824.0,
               local_ranks == 1 ? std::string("the rank") : fmt::format("{} ranks", local_ranks),
               local_ranks, node / 1073741824.0);
}

}  // namespace sshsdp
