// CommPath: which implementation moves the per-microbatch all-gather and reduce-scatter of a
// run (EngineConfig::comm_path, `sshsdp train --comm-path`). Kept apart from the backends so
// configs and the CLI can name a path without pulling in MPI.
//
//   kCollective  ring collectives over MPI point-to-point (MpiCommunicator)
//   kDirect      the paper's ZeroSM path on CPU: registered windows, one-sided transfers,
//                inter-node-first all-gather, node-local reduction first (DirectCommunicator)
//   kNccl        NCCL on a device backend's buffers, any number of nodes (NcclCommunicator)
//
//   CommPath p = ParseCommPath("direct");   // ConfigError naming the accepted values otherwise
#pragma once

#include <string>
#include <string_view>

#include "sshsdp/base/error.h"

namespace sshsdp {

enum class CommPath { kCollective = 0, kDirect = 1, kNccl = 2 };

inline CommPath ParseCommPath(std::string_view s) {
  if (s == "collective") return CommPath::kCollective;
  if (s == "direct") return CommPath::kDirect;
  if (s == "nccl") return CommPath::kNccl;
  throw ConfigError(fmt::format("unknown comm path '{}': use collective, direct or nccl", s));
}

inline const char* CommPathName(CommPath p) {
  return p == CommPath::kCollective ? "collective" : p == CommPath::kDirect ? "direct" : "nccl";
}

}  // namespace sshsdp
