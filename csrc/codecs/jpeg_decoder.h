// JPEG decoding to 8-bit RGB with libjpeg-turbo: whole images, or only the
// region a crop needs at a reduced DCT scale.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "codecs/image_info.h"

namespace stoker {

/// SOI marker followed by the start of another marker.
bool is_jpeg(const uint8_t* data, size_t n);

/// Header only. Throws DecodeError.
ImageInfo jpeg_probe(const uint8_t* data, size_t n);

/// One libjpeg decompressor, reused image after image (one per thread: not
/// thread-safe). Grayscale, RGB, YCbCr, CMYK and YCCK (Adobe-inverted or not)
/// all come out as RGB. Corrupt or truncated data is a DecodeError, never a
/// grey-padded image: libjpeg's warnings about the entropy-coded data count
/// as errors.
///
/// Use: open(), then exactly one of decode_full() or decode_region().
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  /// Reads the header of `data` (which must outlive the decode). Refuses an
  /// empty image or one above `max_pixels` before any pixel is decoded.
  ImageInfo open(const uint8_t* data, size_t n, int64_t max_pixels);

  /// Decodes the whole image at full scale into `dst` (rows `stride` bytes apart).
  void decode_full(uint8_t* dst, size_t stride) { decode_scaled(8, dst, stride); }

  /// Decodes the whole image at scale `scale_num`/8 (1, 2, 4 or 8) into `dst`:
  /// scaled_size(width, scale_num) x scaled_size(height, scale_num) pixels,
  /// rows `stride` bytes apart. Any crop decode_region() gives at that scale
  /// holds the same values as this image's pixels there (the decoded cache
  /// relies on it: NOTE [ Exact pixels ] in geometry/canvas.cpp).
  void decode_scaled(int scale_num, uint8_t* dst, size_t stride);

  /// A side of `side` pixels decoded at scale num/8 (libjpeg rounds up).
  static int scaled_size(int side, int num) {
    return static_cast<int>((int64_t{side} * num + 7) / 8);
  }

  /// Smallest DCT scale (numerator of n/8, among 1, 2, 4, 8: the scales whose
  /// IDCT libjpeg-turbo has in SIMD) at which a (w x h) crop still covers
  /// 1.25x (target_w x target_h); 8 (no scaling) when none does.
  static int choose_scale(int w, int h, int target_w, int target_h);

  /// Decodes the pixels of `crop` (full-resolution coordinates, inside the
  /// image) at scale `scale_num`/8, reading only the rows it needs and, via
  /// jpeg_crop_scanline, only the iMCU columns it needs. `buf` holds the
  /// pixels afterwards (reused between calls).
  /// @param origin_x, origin_y  set to the scaled coordinates of the view's
  ///        top-left pixel: scaled pixel (X, Y) is view pixel (X - origin_x, Y - origin_y).
  /// @return the decoded pixels: scaled columns floor(crop.x * s) to
  ///         ceil((crop.x + crop.w) * s), rows likewise, s = scale_num / 8.
  RgbView decode_region(const PixelRect& crop, int scale_num, std::vector<uint8_t>& buf,
                        int* origin_x, int* origin_y);

  struct State;  ///< libjpeg's structs, kept out of this header

 private:
  std::unique_ptr<State> s_;
};

}  // namespace stoker
