// Pieces attention.cc and attention_bf16.cc share (not a public header): the shape check, a
// row dot product, and the chunked oneDNN kernel with its bf16 rounding switch — the fp32
// attention, and the bf16 attention's widened path.
#pragma once

#include <cstdint>

namespace sshsdp::kernels::attention_internal {

void CheckShape(const char* what, int B, int T, int H, int dh, int block);

float Dot(const float* a, const float* b, int64_t n);

// fp32 elements the chunked kernel needs; `round_bf16` adds the rounded copies of a chunk's
// qkv and dout.
int64_t ChunkedScratchFloats(int B, int T, int H, int dh, int block, bool round_bf16);

// The chunked kernel (attention.h's description). round_bf16: Q, K, V, dO, P and dS are
// rounded to bf16 before the products that read them (fp32 products of bf16 values: exact
// products, fp32 sums), the softmax, lse, D, dP and dS themselves stay fp32.
void ChunkedForward(const float* qkv, float* out, float* lse, float* scratch, int B, int T, int H,
                    int dh, int block, bool round_bf16);
void ChunkedBackward(const float* dout, const float* qkv, const float* out, const float* lse,
                     float* dqkv, float* scratch, int B, int T, int H, int dh, int block,
                     bool round_bf16);

}  // namespace sshsdp::kernels::attention_internal
