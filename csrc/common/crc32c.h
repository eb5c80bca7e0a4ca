// CRC-32C (Castagnoli), the per-record checksum of the shard format.
// Uses the SSE4.2 / ARMv8 CRC instructions when the CPU has them (several
// GB/s per core, so verifying every record costs a few percent of a read),
// and a table-driven fallback otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker {

/// Extends `crc` (0 to start) over `n` bytes at `data`.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

/// True when the hardware path is in use (reported by `stoker inspect`).
bool crc32c_hardware();

}  // namespace stoker
