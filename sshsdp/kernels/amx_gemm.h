// bf16 GEMMs with fp32 results on Intel AMX tiles: the linear layers' products (forward,
// backward-data, backward-weight) with bf16 runtime weights, on CPUs with AMX-BF16.
//
// Why: oneDNN 2.6's AMX matmul runs base's linear shapes (M = 1,024, k = 256..1,024) at
// 150-850 GFLOP/s on one Sapphire Rapids-class core (the forward x·wᵀ slowest, 150-450) whose
// TDPBF16PS loop on tiles in L1 reaches 900-1,500. Both
// operands are packed per call into AMX's tile layouts — A as 16×16-pair tiles of op(A)'s
// rows, B as VNNI tiles ([pair of k][column]) — so every tile load is 1 KiB contiguous
// instead of 16 rows 2-4 KiB apart (which fall into a few L1 sets and thrash); transposed
// operands (W in the forward, dyᵀ in the weight gradient) are transposed 16×16 words at a time
// in the packing. Blocks of 32×32 results (four tiles) are summed over 512 pairs (1,024 bf16)
// of k at a time (256 measured 5-10 % slower in all: partial sums went through memory on
// base's 768- and 1,024-deep products).
//
// Results do not depend on how the work is split: each element is Σ over k in tile order,
// the same for any M, N, offset or thread count (the threads split the rows); with
// accumulate the whole product is added to C once (C + A·B, as oneDNN's sum post-op), so an
// accumulated product equals an overwritten one added afterwards, bit for bit. As in every
// TDPBF16PS product, subnormal inputs and sums are flushed to zero (alpha and the add to C
// then run in ordinary AVX-512 arithmetic).
//
//   if (amx::Available())
//     amx::GemmBf16(false, true, m, n, k, x, k, w, k, y, n, 1.0f, false);  // y = x·wᵀ
//
// Tested against exact integer products over odd shapes, every transpose and stride
// (kernels_amx_gemm_test); skipped where the CPU has no AMX-BF16.
#pragma once

#include <cstdint>
#include <string_view>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp::kernels {

// The kernel that runs the native bf16 path's products of one matrix (Gemm, GemmStrided and
// the linear layers' products; matmul.h): this file's AMX GEMM where the CPU has AMX-BF16,
// oneDNN's matmul elsewhere and for batched products. SSHSDP_BF16_GEMM_KERNEL=auto|amx|onednn
// (read on first use) or SetBf16GemmKernel forces one, so both run on an AMX CPU; 'amx'
// where the CPU has no AMX-BF16 is refused (NumericsError naming the reason).
enum class Bf16GemmKernel { kOneDnn, kAmx };
Bf16GemmKernel ActiveBf16GemmKernel();
void SetBf16GemmKernel(Bf16GemmKernel kernel);
std::string_view Bf16GemmKernelName(Bf16GemmKernel kernel);  // "onednn" / "amx"

}  // namespace sshsdp::kernels

namespace sshsdp::kernels::amx {

// C[m, n] (=|+=) alpha · op(A) · op(B) with fp32 sums: A stored [m, k] row-major with row
// stride lda (or [k, m] when trans_a), B stored [k, n] with row stride ldb (or [n, k] when
// trans_b), C [m, n] with row stride ldc. accumulate=false overwrites C (NaN included);
// k == 0 writes zeros (overwrite) or leaves C (accumulate). Runs on the calling thread's
// OpenMP threads (ParallelFor over 32-row blocks). Requires Available() (amx_pairs.h).
void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a,
              int64_t lda, const bf16* b, int64_t ldb, float* c, int64_t ldc, float alpha,
              bool accumulate);

// GemmBf16 calls with m, n, k > 0 in this process so far (a deterministic count: tests assert
// which engine a product ran on).
int64_t GemmBf16Calls();

// Bytes of scratch the calling thread's GemmBf16 calls keep (partial sums of products deeper
// than 1,024, capped at 4 MiB whatever m; one k block of packed B, at most 1 MiB). Each worker
// thread keeps a further 64 KiB for packed A.
int64_t GemmBf16ScratchBytes();

}  // namespace sshsdp::kernels::amx
