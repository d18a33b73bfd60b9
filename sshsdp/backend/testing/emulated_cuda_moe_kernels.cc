// backend/cuda_moe_kernels.cu compiled as C++ on the CPU emulation of CUDA (cuda_emulation.h), for
// backend_emulated_test.
#include "sshsdp/backend/testing/cuda_emulation.h"
// The kernel file after the emulation's definitions.
#include "sshsdp/backend/cuda_moe_kernels.cu"
