// CRC-32 (IEEE 802.3, the polynomial of zlib, gzip and PNG) for checkpoint file checksums.
//
// A small table-driven implementation (slicing by 8: ~1-2 GB/s on one core) so checkpoints
// need no extra library. Incremental: feed chunks in order, starting from 0.
//
//   uint32_t c = Crc32(header.data(), header.size());
//   c = Crc32(values, bytes, c);          // continues the same checksum
//   Crc32("123456789", 9) == 0xCBF43926   // the standard check value
#pragma once

#include <cstddef>
#include <cstdint>

namespace sshsdp {

// CRC-32 of `bytes` bytes at `data`, continuing from `crc` (the value of the preceding
// bytes; 0 for the start).
uint32_t Crc32(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace sshsdp
