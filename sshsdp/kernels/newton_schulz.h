// Newton–Schulz orthogonalization for Muon (docs/design.md, Optimizers), batched over matrices of
// one shape (paper §4.1: "f1 groups matrices with matching shapes for batched GEMMs").
//
// Quintic iteration with the reference coefficients (a, b, c) = (3.4445, −4.7750, 2.0315):
//   X = in / (‖in‖_F + 1e-7);  repeat steps: A = X·Xᵀ;  X = a·X + (b·A + c·A²)·X.
// For a tall matrix (rows > cols) the iteration runs on Xᵀ so the Gram matrix is the small
// one; we do it without transposing: A = Xᵀ·X and X = X·(a·I + b·A + c·A²), which is the same
// arithmetic transposed. The result approximates U·S′·Vᵀ of the input with S′ roughly in
// [0.5, 1.5].
//
// Precision: the input is bf16 (Muon's u, as in the paper's EG1) or fp32; the iteration runs
// in fp32 on the CPU (oneDNN fp32 GEMMs), where the reference runs it in bf16 on a GPU.
//
//   NewtonSchulz ns;
//   ns.Run(in_ptrs, DType::kBF16, out_ptrs, /*batch=*/3, /*rows=*/8, /*cols=*/20, /*steps=*/5,
//          NsCoefficients{}, /*out_scale=*/1.0f);
//   double f = NewtonSchulzFlops(8, 20, 5);   // 5·(4·8²·20 + 2·8³)
#pragma once

#include <cstdint>
#include <vector>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

struct NsCoefficients {
  float a = 3.4445f;
  float b = -4.7750f;
  float c = 2.0315f;
};

// FLOPs of `steps` iterations on one [rows, cols] matrix: steps·(4m²n + 2m³), m = min, n = max.
double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps);

class NewtonSchulz {
 public:
  // out[i] = out_scale · NS(in[i]) for i < batch, every matrix [rows, cols] row-major; in[i]
  // fp32 or bf16 (in_dtype), out[i] fp32. in and out may not overlap. Throws NumericsError on
  // another dtype. Work buffers are kept between calls (at most ~64 MiB; larger batches run in
  // chunks).
  void Run(const void* const* in, DType in_dtype, float* const* out, int64_t batch, int64_t rows,
           int64_t cols, int steps, const NsCoefficients& coef, float out_scale);

 private:
  std::vector<float> work_;
};

}  // namespace sshsdp
