// AdamW as a batched multi-tensor update over ZeRO-1 fragments (docs/design.md, One step, step 3):
// the arithmetic (PyTorch's, decoupled weight decay first) is kernels/optimizer.h's AdamWStep, run
// as the backend's AdamW op; all spans of one call are one op, one "kernel launch" per update
// group.
//
//   std::unique_ptr<Backend> cpu = MakeCpuBackend();
//   UpdatePlan plan(AdamWProgram(cfg, *cpu), units, chains, replica);
//
// As an update program (update_stage.h) AdamW is one elementwise stage over every local
// fragment: UpdatePlan(AdamWProgram(cfg), units, chains, replica) never communicates.
#pragma once

#include "sshsdp/backend/backend.h"
#include "sshsdp/kernels/optimizer.h"
#include "sshsdp/update/update_stage.h"

namespace sshsdp {

// One elementwise stage "adamw" over fields main, grad, m, v (fp32 ZeRO-1 state), reading
// scalars "adamw.lr", "step" and "grad_scale"; cfg.lr is replaced by "adamw.lr". Weight decay
// applies to every unit except norm gains (UpdateKind::kVector). The batch runs as one
// Backend::AdamW on `backend`, whose memory the fields are (not owned; outlives the program).
UpdateProgram AdamWProgram(const AdamWConfig& cfg, Backend& backend);

}  // namespace sshsdp
