// `sshsdp train --backend` (see train_backend.h).
#include "sshsdp/cli/train_backend.h"

#include <fmt/format.h>

#include <cstdlib>
#include <utility>

#include "sshsdp/base/error.h"
#include "sshsdp/cli/model_config.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/device/cuda_direct_memory.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/moe.h"

namespace sshsdp {

int LocalRankFromEnvironment() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
  return 0;
}

DeviceCommChoice ChooseDeviceCommPath(int world, int ranks_per_node, int sw, int sg, int so,
                                      const std::string& comm_path, const std::string& backend) {
  // The runtime groups (ZeRO-2: sg consecutive ranks, the ZeRO-3 groups inside them; every
  // microbatch) move device buffers over NCCL when asked for or when they span nodes, else on
  // the direct path over CUDA IPC (one node; ranks may share a GPU, which NCCL < 2.30 refuses).
  // The outer groups (replica reduce-scatter and all-gather, HSDP's all-reduce; once per step)
  // go over NCCL with it, else staged through host memory over MPI.
  const int rpn = ranks_per_node == 0 ? world : std::min(ranks_per_node, world);
  const bool runtime_one_node = rpn % sg == 0;
  const bool outer = so != sg || so != sw || so != world;
  SSHSDP_CHECK(runtime_one_node || comm_path != "direct", ConfigError,
               "--backend {} --comm-path direct moves device buffers over CUDA IPC, on one node; "
               "the ZeRO-2 groups of --sg {} span nodes of {} ranks: use --comm-path nccl (the "
               "default there), or an --sg that divides the ranks per node",
               backend, sg, rpn);
  const std::string staged =
      outer ? "; the outer phase's groups staged through host memory over MPI" : "";
  if (comm_path == "nccl" || !runtime_one_node) {
    return {CommPath::kNccl, comm_path == "nccl"
                                 ? ""
                                 : fmt::format("comm path nccl: the ZeRO-2 groups of --sg {} span "
                                               "nodes of {} ranks",
                                               sg, rpn)};
  }
  if (sg > 1 || comm_path == "direct")
    return {CommPath::kDirect,
            "comm path direct: the ZeRO-3 / ZeRO-2 groups' device buffers move over CUDA IPC "
            "(each group in one node)" +
                staged};
  return {CommPath::kCollective, outer ? "sw = sg = 1: no per-microbatch collective" + staged : ""};
}

void CheckBackendOptions(const TrainOptions& o) {
  SSHSDP_CHECK(o.backend != "host", ConfigError,
               "--backend host is --backend cpu now, the default (the engine and every model run "
               "on the CPU backend): drop --backend host");
  SSHSDP_CHECK(o.backend == "cpu" || o.backend == "cuda" || o.backend.starts_with("cuda:"),
               ConfigError, "--backend must be cpu, cuda or cuda:<ordinal>, got '{}'", o.backend);
  SSHSDP_CHECK(!IsMoePreset(o.model) || o.mx_gemm == "fp32", ConfigError,
               "--model {}: --mx-gemm bf16 runs the dense presets only (MXFP8 experts are "
               "dequantized for fp32 GEMMs): drop it",
               o.model);
  if (o.backend == "cpu") return;
  const std::string b = o.backend;
  SSHSDP_CHECK(o.reduce == "fp32", ConfigError,
               "--backend {} reduces fp32 gradients: pass --reduce fp32 (bf16 reductions on a "
               "device are not built yet), got --reduce {}",
               b, o.reduce);
  SSHSDP_CHECK(
      o.weight_dtype != "mxfp8" || o.scale_layout == "auto" || o.scale_layout == "row_major",
      ConfigError,
      "--backend {} dequantizes MXFP8 weights for its GEMMs from per-row scales: set the "
      "scale layout to row_major (--scale-layout row_major, or auto), got {}",
      b, o.scale_layout);
}

DeviceRun MakeDeviceRun(const TrainOptions& o, EngineConfig* cfg) {
  DeviceRun dev;
  CheckBackendOptions(o);
  if (o.backend == "cpu") return dev;  // the engine's and the model's own CPU backends
  const std::string b = o.backend;
  if (b == "cuda") {
    const int count = CudaDeviceCount();
    const int local = LocalRankFromEnvironment();
    dev.backend = MakeBackend(fmt::format("cuda:{}", count > 0 ? local % count : 0));
  } else {
    dev.backend = MakeBackend(b);  // DeviceError naming why (no CUDA in this build, no GPU)
  }
  cfg->backend = dev.backend.get();
  if (o.weight_dtype == "mxfp8") {
    // The device dequantizes each MXFP8 weight for its GEMM from per-row scales (no MX GEMM
    // before Blackwell: EngineConfigOf's --scale-layout auto); another --scale-layout given is
    // refused by the engine.
    dev.notes.push_back(fmt::format(
        "--weight-dtype mxfp8 on --backend {}: E4M3 codes stay the stored and communicated "
        "format and are dequantized to {} for each GEMM (--mx-gemm), their scales relaid out "
        "row_major",
        b, o.mx_gemm));
  }
  if (WorldSize() == 1 || dev.backend->host_memory()) return dev;
  const DeviceCommChoice c = ChooseDeviceCommPath(WorldSize(), cfg->ranks_per_node, cfg->sw,
                                                  cfg->sg, cfg->so, o.comm_path, b);
  cfg->comm_path = c.path;
  if (c.path == CommPath::kDirect) {
    dev.direct = MakeCudaDirectMemory(*dev.backend);
    cfg->direct_device = dev.direct.get();
  }
  if (!c.note.empty()) dev.notes.push_back(c.note);
  return dev;
}

std::unique_ptr<Model> MakeRunModel(const TrainOptions& o, const GptConfig& gc,
                                    const DeviceRun& dev) {
  if (!dev.backend) return MakeModel(o, gc);  // on its own CPU backend
  if (IsLlamaFamily(o))
    return MakeLlamaFamilyModel(MakeLlamaConfig(o, gc.vocab), dev.backend.get(),
                                o.weight_dtype == "mxfp8");
  if (!IsMoePreset(o.model)) return std::make_unique<Gpt>(gc, *dev.backend);
  MoeConfig c = MakeMoeConfig(o, gc);
  c.trunk = gc;
  return std::make_unique<MoeGpt>(c, *dev.backend);
}

}  // namespace sshsdp
