// sshsdp: the front door. One include for a program that trains its own model with sshsdp:
// the Model interface it implements, the Backend its ops run on, the token sources, and the
// Trainer that runs it sharded on this job's MPI ranks (trainer/trainer.h has an example).
//
//   #include <sshsdp/sshsdp.h>
//   int main(int argc, char** argv) {
//     return sshsdp::RunMpiMain(argc, argv, [&] { ...; sshsdp::Trainer t(model, data, opt); });
//   }
#pragma once

#include "sshsdp/backend/backend.h"         // Backend, MakeCpuBackend
#include "sshsdp/backend/backend_buffer.h"  // BackendBuffer: a model's activations
#include "sshsdp/base/error.h"              // ConfigError, IoError, ...
#include "sshsdp/comm/mpi_runtime.h"        // RunMpiMain
#include "sshsdp/models/data.h"             // TokenSource, SyntheticTokens, TokenFile
#include "sshsdp/models/layers.h"           // Single, Normal, kOnes: runtime-parameter specs
#include "sshsdp/params/model.h"            // Model, RuntimeParamSpec, UpdatePart, TensorRef
#include "sshsdp/trainer/trainer.h"         // Trainer, TrainerOptions
