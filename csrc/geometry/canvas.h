// The lazy canvas the image ops act on. Crops and flips only move a window
// (`view`, possibly past the source's edges) and a mirror flag; a resize is
// held back (`pending`) until something needs its pixels, so that when it is
// the last op it runs straight into the batch slot; and a JPEG is decoded only
// when pixels are needed, then only the window's rows and iMCU columns, at the
// smallest DCT scale that still covers the resize target. See csrc/README.md
// for the trade-offs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache/decoded_cache.h"
#include "codecs/image_info.h"
#include "codecs/jpeg_decoder.h"
#include "geometry/resize.h"

namespace stoker {

/// Per-thread buffers, grown to the largest image seen and then reused.
struct Scratch {
  JpegDecoder jpeg;
  std::vector<uint8_t> decoded;  // decoder output
  std::vector<uint8_t> bufs[2];  // resize outputs, alternating
  std::vector<uint8_t> padded;   // a view reaching past its source, zero-filled
  std::vector<uint8_t> row;      // one output row before layout and dtype
  std::vector<uint8_t> reduced;  // a cache_max_side copy the cache had no room for
};

/// This thread's scratch.
Scratch& thread_scratch();

/// A window of a pixel source, mirrored when `flip`. The source is the
/// still-undecoded JPEG (its full-resolution size known from the header) until
/// something needs pixels.
struct Canvas {
  bool have_pixels = false;
  RgbView pix;    // valid once have_pixels and not pending
  int src_w = 0;  // source size: the image's, then pix's (or the pending resize's output)
  int src_h = 0;
  PixelRect view;
  bool flip = false;
  bool pending = false;  // pix is the resize's output-to-be: resize pend_box of pend_src
  RgbView pend_src;
  ResizeBox pend_box;
  /// pix is not the canvas's to write: a cached image or a raw record's pixels
  /// (canvas_pixels copies them before an op writes).
  bool borrowed = false;

  /// Whether the view is all of the source.
  bool whole_view() const { return view == PixelRect{0, 0, src_w, src_h}; }
};

/// The operations on a canvas over one encoded image.
class CanvasOps {
 public:
  /// With `cache`, decoded pixels come from (and go to) the decoded cache
  /// (NOTE [ Exact pixels ] in canvas.cpp).
  CanvasOps(Scratch& s, const uint8_t* data, size_t n, CacheSlot cache = {})
      : s_(s), data_(data), n_(n), cache_(cache) {}
  /// Counts the image as a cache hit or miss.
  ~CanvasOps();
  CanvasOps(const CanvasOps&) = delete;
  CanvasOps& operator=(const CanvasOps&) = delete;

  /// Time spent in the codec (libjpeg-turbo, libpng) so far: an image is
  /// decoded once, so this is two clock reads per image. The rest of the
  /// pipeline's time is the ops' (stats: decode vs ops).
  int64_t decode_ns = 0;

  /// Starts on the image (a PNG is decoded at once: libpng has no region decode;
  /// a raw pixel record is its own pixels). DecodeError for anything but a
  /// JPEG, PNG or raw record, or a declared size over `max_pixels`.
  void open(int64_t max_pixels, Canvas& c);
  /// A crop given in view coordinates (before the mirror).
  static void crop(Canvas& c, const PixelRect& r);
  /// Resamples the view to (out_w x out_h); afterwards the view is all of the
  /// new pixels. The resampling itself waits in c.pending.
  void resize(Canvas& c, int out_w, int out_h);
  /// Runs a pending resize into a scratch buffer (applying a pending flip when
  /// the view is the whole output).
  void materialize(Canvas& c);
  /// Runs a pending resize straight into `out` (HWC uint8 of the view's size,
  /// rows `stride` bytes apart; 0: packed) if the view is all of its output;
  /// false if there is none to run so.
  bool try_resize_into(Canvas& c, uint8_t* out, size_t stride = 0);
  /// Decodes the whole image straight into `out` when nothing else is to be done.
  bool try_decode_into(Canvas& c, uint8_t* out);
  /// Decodes (at full scale) what the view needs, if nothing has been decoded
  /// yet, and runs a pending resize.
  void ensure_pixels(Canvas& c);

 private:
  using Clock = std::chrono::steady_clock;
  static void run_pending(Canvas& c, uint8_t* out, bool mirror, size_t stride = 0);
  void pad(Canvas& c);
  Clock::time_point begin_decode() const;
  void end_decode(Clock::time_point t0);
  // The JPEG decoder, at the start of this image (its header read again after a decode).
  void open_decoder();
  // The decoded pixels of `in` at DCT scale num/8, from the cache when it has
  // them, else decoded (whole, into the cache, when it has room).
  RgbView region(const PixelRect& in, int num, int* ox, int* oy, bool* borrowed);
  // cache_max_side: the image's reduced copy, from the cache or made now.
  bool reduced_mode() const { return cache_ && cache_.cache->options().max_side > 0; }
  const CachedImage& reduced_source();
  // Whether a cached entry of `variant` has the size its original's size gives
  // it (and that original, when known); if not, the cache is left (NOTE [ Cache
  // trust ] in cache/decoded_cache.cpp) and the image decoded.
  bool fits(const CachedImage& e, int variant, int full_w = 0, int full_h = 0) const;

  Scratch& s_;
  const uint8_t* data_;
  size_t n_;
  int next_ = 0;
  CacheSlot cache_;
  int64_t max_pixels_ = 0;
  int full_w_ = 0, full_h_ = 0;  // the image's size
  bool png_ = false;             // a PNG, decoded at open() into s_.decoded
  bool decoder_ready_ = false;   // the JPEG decoder has read this image's header, no decode since
  bool decoded_ = false;         // a codec ran (a cache miss)
  bool served_ = false;          // the cache gave pixels
  CachedImage reduced_;          // cache_max_side: pix.data null until made or found
};

/// Throws DecodeError for a declared size that is empty or over `max_pixels`.
void check_declared(const ImageInfo& info, int64_t max_pixels);

/// DecodeError naming the first bytes of something that is not a JPEG or PNG.
[[noreturn]] void not_an_image(const uint8_t* data, size_t n);

}  // namespace stoker
