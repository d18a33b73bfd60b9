// The job's watchdog (what NCCL's watchdog is to GPU collectives): every blocking wait of the
// comm layer — ring collectives, point-to-point exchanges, barriers, communicator splits, the
// direct path's rendezvous and flag polls — opens a WaitScope naming the operation, the group
// and the world ranks it waits for. A thread of this process checks the open scopes; when one
// has lasted longer than the timeout it prints, on this rank, what it was waiting for and
// ends the whole job (MPI_Abort), so a rank that is stuck, stopped (SIGSTOP) or deadlocked
// ends the job instead of hanging every other rank silently.
//
//   SetCommTimeout(600);                           // seconds; 0 disables; default 600
//   {
//     WaitScope w("all-gather", name(), {prev_world_rank, next_world_rank});
//     MPI_Waitall(...);                            // watched while w is open
//   }
#pragma once

#include <string>
#include <vector>

namespace sshsdp {

inline constexpr double kDefaultCommTimeoutSeconds = 600;

// Sets the timeout for the rest of the process (seconds, > 0; 0 disables the watchdog).
// Throws ConfigError for a negative or non-finite value.
void SetCommTimeout(double seconds);

// One blocking wait, watched while the scope is open. Cheap: one lock and one map entry.
class WaitScope {
 public:
  // `peers`: world ranks this wait needs (empty: every member of `group`).
  WaitScope(const char* op, const std::string& group, std::vector<int> peers = {});
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  unsigned long long id_ = 0;
};

// The message the watchdog prints for a wait of `seconds` (exposed for tests).
std::string DescribeStalledWait(const char* op, const std::string& group,
                                const std::vector<int>& peers, double seconds, double timeout);

}  // namespace sshsdp
