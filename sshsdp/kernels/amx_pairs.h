// bf16 products on Intel AMX tiles (TDPBF16PS), in the "pairs" layouts of the native bf16
// attention (attention_bf16.cc): a Pair is two bf16 in one 32-bit word, the lower index in
// the low half.
//
// Why: on Sapphire Rapids and later Xeons VDPBF16PS runs at the fp32 FMA rate (one port),
// so the AVX512-BF16 attention kernel measured no faster than the fp32 one there (1.01×
// forward, 1.19× backward), while one TDPBF16PS multiplies a 16×32 by a 32×16 bf16 block
// (8,192 products) into a 16×16 fp32 tile. The pairs layouts are AMX's own: A operands are
// row-major bf16 (a tile row is 16 pairs), B operands are [k / 2][columns] pairs (AMX's
// "VNNI" B layout), so the packed operands load as tiles without another copy.
//
//   if (amx::Available()) amx::GemmPairs(M, N, kp, a, lda, b, ldb, c, ldc, 1.0f, false);
//
// Tested against exact integer products on odd shapes (kernels_amx_pairs_test); skipped
// where the CPU has no AMX-BF16.
#pragma once

#include <cstdint>

namespace sshsdp::kernels::amx {

// True where the CPU has AMX-BF16 and the kernel granted this process the tile data state
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked once per process).
bool Available();

// C[M, N] (+)= alpha · A · B, fp32 sums: A [M, kp pairs] with row stride lda pairs, B [kp
// pairs, ldb] with ldb >= N rounded up to 16 (columns past N are read and never used).
// acc=false overwrites C's [M, N] (NaN included), acc=true adds. Inputs and results that are
// subnormal bf16 / fp32 are flushed to zero, as VDPBF16PS does. Requires Available(); loads
// its own tile configuration on the calling thread.
void GemmPairs(int64_t M, int64_t N, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b,
               int64_t ldb, float* c, int64_t ldc, float alpha, bool acc);

// Loads the tile configuration both AMX kernels use — eight tiles of 16 rows × 64 bytes — on
// the calling thread, and releases it. Require Available().
void ConfigureTiles();
void ReleaseTiles();

// GemmPairs calls with M, N > 0 in this process so far (a deterministic count: tests assert
// which products engine a kernel dispatched to).
int64_t Calls();

}  // namespace sshsdp::kernels::amx
