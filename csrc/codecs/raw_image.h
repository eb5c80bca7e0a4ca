// Images stored as decoded pixels (stoker.image(storage="raw")): a record is a
// 16-byte header and the rows, so the loader reads them straight into the crop
// and resize with no codec at all (FFCV's "raw" write mode).
//
//   offset 0   magic 0x93 'P' 'I' 'X'   (neither a JPEG's FF D8 nor PNG's 89 'P' 'N' 'G')
//          4   format version (1)
//          5   channels: 3 (RGB) or 1 (one channel: grayscale, mask ids)
//          6   two zero bytes
//          8   width, u32 little-endian
//         12   height, u32 little-endian
//         16   height rows of width * channels bytes, packed (HWC)
//
// python/stoker/fields.py writes the same layout (Image.encode).
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs/image_info.h"

namespace stoker {

inline constexpr size_t kRawHeaderBytes = 16;
inline constexpr uint8_t kRawMagic[4] = {0x93, 'P', 'I', 'X'};
inline constexpr uint8_t kRawVersion = 1;

/// The four magic bytes of a raw pixel record.
bool is_raw(const uint8_t* data, size_t n);

/// The pixels of a raw record, inside it.
struct RawImage {
  const uint8_t* pixels = nullptr;
  int width = 0;
  int height = 0;
  int channels = 3;
  size_t stride() const { return static_cast<size_t>(width) * channels; }
  RgbView rgb() const { return {pixels, width, height, stride()}; }
};

/// Parses a raw record: DecodeError for an unknown version, a channel count
/// other than 1 or 3, an empty size, or a length that is not header + pixels.
RawImage raw_image(const uint8_t* data, size_t n);

/// Header only (raw_image without looking at the pixels). DecodeError as raw_image.
ImageInfo raw_probe(const uint8_t* data, size_t n);

/// Writes the header of a (width x height x channels) raw record into `out`
/// (kRawHeaderBytes bytes).
void write_raw_header(uint8_t* out, int width, int height, int channels);

}  // namespace stoker
