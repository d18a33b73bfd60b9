// `sshsdp train --backend NAME`: where the engine and the model run (backend/backend.h,
// EngineConfig::backend).
//
//   --backend cpu      the CPU backend (the default): every preset and feature; the engine and
//                      the model each on their own CPU backend
//   --backend cuda     this rank's GPU (its local rank modulo the GPUs it sees); cuda:N names one.
//                      Several ranks move the ZeRO-3 / ZeRO-2 groups' device buffers on the
//                      direct path over CUDA IPC when those groups lie in a node (ranks may share
//                      one GPU), else over NCCL; the outer phase over NCCL with it, else staged
//                      through host memory over MPI.
//
// What the engine on a device runs so far — the dense and MoE presets, bf16, fp32 or MXFP8
// runtime weights (MXFP8 dequantized for each GEMM; --scale-layout auto is row_major there),
// fp32 reduction, AdamW or Muon, every --sw/--sg/--so layout, checkpoints (the state copied
// through host memory; they load on the CPU and back) — is what this accepts: anything else is
// refused here by name, before any collective.
//
//   EngineConfig cfg = EngineConfigOf(o, world_size, T);
//   DeviceRun dev = MakeDeviceRun(o, &cfg);          // sets cfg.backend, cfg.direct_device
//   std::unique_ptr<Model> model = MakeRunModel(o, gc, dev);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/cli/train.h"
#include "sshsdp/comm/direct_device.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {

struct DeviceRun {
  std::unique_ptr<Backend> backend;            // null: the CPU (engine's and model's own)
  std::unique_ptr<DirectDeviceMemory> direct;  // a device's memory on several ranks
  std::vector<std::string> notes;              // what the backend chose for the run (rank 0 prints)
};

// ConfigError naming the option for what the engine on o.backend does not run (an unknown
// backend or `host`, bf16 reductions or unreadable MXFP8 scales on a device, --mx-gemm bf16
// with MoE). MakeDeviceRun runs it.
void CheckBackendOptions(const TrainOptions& o);

// Makes o.backend's backend and sets cfg->backend (and for a device on several ranks
// cfg->comm_path = direct, cfg->direct_device).
// ConfigError naming the option for what the engine on a backend does not run; DeviceError
// when the backend cannot be made (no CUDA in this build, no GPU).
DeviceRun MakeDeviceRun(const TrainOptions& o, EngineConfig* cfg);

// How a device on `world` ranks moves its buffers at layout (sw, sg, so), given --comm-path:
// nccl when asked for or when the ZeRO-2 groups (sg consecutive ranks) span nodes of
// ranks_per_node (0: one node); else direct (CUDA IPC) when those groups move anything or
// direct was asked for; else collective (sw = sg = 1: only the outer phase moves, staged).
// `note` says what was chosen and why (empty when the option chose it and nothing is staged
// or implied). ConfigError for --comm-path direct on groups spanning nodes.
struct DeviceCommChoice {
  CommPath path = CommPath::kCollective;
  std::string note;
};
DeviceCommChoice ChooseDeviceCommPath(int world, int ranks_per_node, int sw, int sg, int so,
                                      const std::string& comm_path, const std::string& backend);

// The run's model: the preset's Gpt or MoeGpt on dev.backend, or on its own CPU backend.
std::unique_ptr<Model> MakeRunModel(const TrainOptions& o, const GptConfig& gc,
                                    const DeviceRun& dev);

// This process's rank among the ranks of its node, from the launcher's environment (Open MPI,
// Slurm); 0 when neither says.
int LocalRankFromEnvironment();

}  // namespace sshsdp
