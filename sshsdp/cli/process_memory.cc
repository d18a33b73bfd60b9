// Resident memory of this process (process_memory.h).
#include "sshsdp/cli/process_memory.h"

#include <cstring>
#include <fstream>
#include <string>

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

}  // namespace sshsdp
