// The ceiling the image path is measured against: plain full decodes with
// libjpeg-turbo / libpng on N threads, nothing else (no ops, no batching).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace stoker {

/// Decodes every image `rounds` times, spread over `threads` threads (dynamic
/// assignment through a shared counter), into per-thread buffers.
/// @return images per second over the whole run. Throws DecodeError if an
///         image does not decode.
double decode_throughput(const std::vector<std::pair<const uint8_t*, size_t>>& images, int threads,
                         int rounds = 1);

}  // namespace stoker
