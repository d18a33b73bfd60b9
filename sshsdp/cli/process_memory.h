// This process's resident memory, from /proc/self/status, for the progress line and the bench.
//
//   ResetPeakRss();            // VmHWM := VmRSS (clear_refs "5")
//   ... build, warm up ...
//   double grew = PeakRssMiB() - CurrentRssMiB();
#pragma once

namespace sshsdp {

double PeakRssMiB();     // VmHWM: the peak since start or since the last ResetPeakRss
double CurrentRssMiB();  // VmRSS
void ResetPeakRss();

}  // namespace sshsdp
