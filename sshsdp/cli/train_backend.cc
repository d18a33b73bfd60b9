// `sshsdp train --backend` (see train_backend.h).
#include "sshsdp/cli/train_backend.h"

#include <fmt/format.h>

#include <cstdlib>
#include <utility>

#include "sshsdp/base/error.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/device/cuda_direct_memory.h"
#include "sshsdp/models/backend_gpt_model.h"

namespace sshsdp {

int LocalRankFromEnvironment() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
  return 0;
}

DeviceRun MakeDeviceRun(const TrainOptions& o, EngineConfig* cfg) {
  DeviceRun dev;
  if (o.backend == "host") return dev;
  SSHSDP_CHECK(o.backend == "cpu" || o.backend == "cuda" || o.backend.starts_with("cuda:"),
               ConfigError, "--backend must be host, cpu, cuda or cuda:<ordinal>, got '{}'",
               o.backend);
  const std::string b = o.backend;
  SSHSDP_CHECK(!IsMoePreset(o.model), ConfigError,
               "--backend {} trains the dense GPT presets (tiny, small, base); --model {} (MoE) "
               "on a device is not built yet: use --backend host",
               b, o.model);
  SSHSDP_CHECK(o.weight_dtype == "bf16" || o.weight_dtype == "fp32", ConfigError,
               "--backend {} runs bf16 or fp32 runtime weights: pass --weight-dtype bf16 or fp32 "
               "(MXFP8 weights on a device are not built yet), got --weight-dtype {}",
               b, o.weight_dtype);
  SSHSDP_CHECK(o.reduce == "fp32", ConfigError,
               "--backend {} reduces fp32 gradients: pass --reduce fp32 (bf16 reductions on a "
               "device are not built yet), got --reduce {}",
               b, o.reduce);
  if (b == "cuda") {
    const int count = CudaDeviceCount();
    const int local = LocalRankFromEnvironment();
    dev.backend = MakeBackend(fmt::format("cuda:{}", count > 0 ? local % count : 0));
  } else {
    dev.backend = MakeBackend(b);  // DeviceError naming why (no CUDA in this build, no GPU)
  }
  cfg->backend = dev.backend.get();
  // A device on several ranks. The runtime groups (ZeRO-2: sg consecutive ranks, the ZeRO-3
  // groups inside them; every microbatch) move device buffers over NCCL when asked for or when
  // they span nodes, else on the direct path over CUDA IPC (one node; ranks may share a GPU,
  // which NCCL < 2.30 refuses). The outer groups (replica reduce-scatter and all-gather, HSDP's
  // all-reduce; once per step) go over NCCL with it, else staged through host memory over MPI.
  const int W = WorldSize();
  const int rpn = cfg->ranks_per_node == 0 ? W : std::min(cfg->ranks_per_node, W);
  const bool runtime_one_node = rpn % cfg->sg == 0;
  const bool outer = cfg->so != cfg->sg || cfg->so != cfg->sw || cfg->so != W;
  SSHSDP_CHECK(runtime_one_node || o.comm_path != "direct" || dev.backend->host_memory(),
               ConfigError,
               "--backend {} --comm-path direct moves device buffers over CUDA IPC, on one node; "
               "the ZeRO-2 groups of --sg {} span nodes of {} ranks: use --comm-path nccl (the "
               "default there), or an --sg that divides the ranks per node",
               b, cfg->sg, rpn);
  if (W == 1 || dev.backend->host_memory()) return dev;
  const std::string staged =
      outer ? "; the outer phase's groups staged through host memory over MPI" : "";
  if (o.comm_path == "nccl" || !runtime_one_node) {
    cfg->comm_path = CommPath::kNccl;
    if (o.comm_path != "nccl")
      dev.notes.push_back(fmt::format(
          "comm path nccl: the ZeRO-2 groups of --sg {} span nodes of {} ranks", cfg->sg, rpn));
  } else if (cfg->sg > 1 || o.comm_path == "direct") {
    dev.direct = MakeCudaDirectMemory(*dev.backend);
    cfg->comm_path = CommPath::kDirect;
    cfg->direct_device = dev.direct.get();
    dev.notes.push_back(
        "comm path direct: the ZeRO-3 / ZeRO-2 groups' device buffers move over CUDA IPC "
        "(each group in one node)" +
        staged);
  } else if (outer) {
    dev.notes.push_back("sw = sg = 1: no per-microbatch collective" + staged);
  }
  return dev;
}

std::unique_ptr<Model> MakeRunModel(const TrainOptions& o, const GptConfig& gc,
                                    const DeviceRun& dev) {
  if (dev.backend) return std::make_unique<BackendGptModel>(*dev.backend, gc);
  return MakeModel(o, gc);
}

}  // namespace sshsdp
