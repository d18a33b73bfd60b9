// device/cuda_attention_kernels.cu compiled as C++ on the CPU emulation of CUDA
// (cuda_emulation.h), for device_backend_emulated_test.
#include "sshsdp/device/testing/cuda_emulation.h"
// The kernel file after the emulation's definitions.
#include "sshsdp/device/cuda_attention_kernels.cu"
