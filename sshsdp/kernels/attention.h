// Fused causal multi-head attention for the CPU over the packed QKV activation the models
// keep ([B·T, 3d] rows [q (d) | k (d) | v (d)], head h at columns h·dh of each third), fp32
// whatever the weight dtype (the models' activations are fp32).
//
// Blocked over queries, with every head of a chunk of sequences in one batched oneDNN product
// per block (GemmBatchedStrided): query block [q0, q1) meets keys [0, q1) only, so the masked
// blocks above the diagonal are never multiplied (at T = 256 and 64-row blocks, 62.5 % of the
// square's products are computed; only the diagonal blocks' upper triangles are wasted), and
// no [T, T] matrix is kept between forward and backward — the forward keeps
// each row's log-sum-exp (lse, [B, H, T]), the backward recomputes the block's probabilities
// from it (FlashAttention-2's recomputation; the whole key range of a query block fits in
// scratch on a CPU, so the softmax of a row is exact in one pass instead of online). The
// softmax loops run one vectorised exp per score (vec_math.h), AVX-512 / AVX2 / baseline
// clones picked at load time.
//
//   std::vector<float> scratch(AttentionScratchFloats(B, T, H));
//   CausalAttentionForward(qkv, out, lse, scratch.data(), B, T, H, dh);
//   CausalAttentionBackward(dout, qkv, out, lse, dqkv, scratch.data(), B, T, H, dh);
//
// The reference it is tested against (kernels_attention_test) is the per-head product with
// the whole score matrix materialised, testing/attention_reference.h.
//
// bf16 attention (the models' choice with bf16 weights, what torch.autocast's CPU flash
// attention computes): Q, K, V, dO, P and dS are rounded to bf16 (nearest even) as the
// products' operands; scores, softmax, lse, D = rowsum(dO ⊙ O), dP, dS and every sum stay
// fp32. On CPUs with AVX512-BF16 (and the native bf16 GEMM path) it runs its own kernel
// (attention_bf16.cc: per (sequence, head) plane, operands packed in pairs, VDPBF16PS tiles,
// or AMX tiles where the CPU has them);
// elsewhere, or with SSHSDP_BF16_GEMM=widened, the kernel above on the rounded operands (same
// values, fp32 sums in another order; VDPBF16PS also flushes subnormal bf16 values to zero). Tested
// against a double-precision oracle of the same roundings (kernels_attention_bf16_test).
//
//   std::vector<float> scratch(AttentionBf16ScratchFloats(B, T, H, dh));
//   CausalAttentionForwardBf16(qkv, out, lse, scratch.data(), scratch.size(), B, T, H, dh);
//   CausalAttentionBackwardBf16(dout, qkv, out, lse, dqkv, scratch.data(), scratch.size(), B, T,
//                               H, dh);
#pragma once

#include <cstdint>
#include <string>

namespace sshsdp::kernels {

// Query rows per block. Exposed for tests (blocks smaller than T on short sequences).
inline constexpr int kAttentionQueryBlock = 64;

// fp32 elements of the scratch both functions need for this shape and block.
int64_t AttentionScratchFloats(int B, int T, int H, int block = kAttentionQueryBlock);

// out [B·T, d] (overwritten) = softmax(Q·Kᵀ/√dh, causal) · V per (batch, head); lse [B, H, T]
// (overwritten) the natural log of each row's softmax denominator, scores scaled.
void CausalAttentionForward(const float* qkv, float* out, float* lse, float* scratch, int B, int T,
                            int H, int dh, int block = kAttentionQueryBlock);

// dqkv [B·T, 3d] overwritten with ∂/∂qkv from dout [B·T, d]; out and lse as the forward wrote
// them.
void CausalAttentionBackward(const float* dout, const float* qkv, const float* out,
                             const float* lse, float* dqkv, float* scratch, int B, int T, int H,
                             int dh, int block = kAttentionQueryBlock);

// What attention runs in this process, for progress headers: "fp32 (oneDNN)" when !bf16 (MKL
// or BLIS on those GEMM providers), else "bf16 (AMX kernel)", "bf16 (AVX512-BF16 kernel)" or
// "bf16 widened (fp32 oneDNN on rounded operands)".
std::string AttentionPathDescription(bool bf16);

// True where the bf16 attention runs its AVX512-BF16 kernel: the CPU has AVX512-BF16 and
// ActiveBf16GemmPath() is native (so SSHSDP_BF16_GEMM=widened forces the other path).
bool NativeBf16AttentionActive();

// What runs the native kernel's products: AMX tiles (amx_pairs.h) where the CPU has AMX-BF16,
// else VDPBF16PS. SSHSDP_BF16_ATTENTION_PRODUCTS=auto|amx|avx512bf16 (read on first use) or
// SetBf16AttentionProducts forces one, so both are tested on an AMX CPU; forcing amx where
// it is unavailable throws NumericsError. Same math either way: fp32 sums in another order.
enum class Bf16AttentionProducts { kAvx512Bf16, kAmx };
Bf16AttentionProducts ActiveBf16AttentionProducts();
void SetBf16AttentionProducts(Bf16AttentionProducts products);

// fp32 elements of scratch the bf16 functions need for this shape on the path active now
// (the native kernel: per worker, `threads` of them; the widened path: the chunked kernel's
// blocks and rounded copies). `block` must be even.
int64_t AttentionBf16ScratchFloats(int B, int T, int H, int dh, int block = kAttentionQueryBlock,
                                   int threads = -1 /* KernelThreads() */);

// As CausalAttentionForward / Backward, with the bf16 roundings above. scratch_floats: the
// scratch's size (fewer threads run when it was sized for fewer; NumericsError when too small
// for one).
void CausalAttentionForwardBf16(const float* qkv, float* out, float* lse, float* scratch,
                                int64_t scratch_floats, int B, int T, int H, int dh,
                                int block = kAttentionQueryBlock);
void CausalAttentionBackwardBf16(const float* dout, const float* qkv, const float* out,
                                 const float* lse, float* dqkv, float* scratch,
                                 int64_t scratch_floats, int B, int T, int H, int dh,
                                 int block = kAttentionQueryBlock);

}  // namespace sshsdp::kernels
