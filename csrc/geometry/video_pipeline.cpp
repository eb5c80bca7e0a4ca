#include "geometry/video_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codecs/media.h"
#include "codecs/raw_image.h"
#include "codecs/video_decoder.h"
#include "common/clock.h"
#include "common/error.h"
#include "geometry/detail/rng.h"
#include "sampler/permutation.h"

namespace stoker {

namespace {

// The clip draw's own stream, apart from the image ops' (which start from the seed itself).
constexpr uint64_t kClipStream = 0x636c6970ull;  // "clip"

ImageFieldSpec frame_spec(const VideoFieldSpec& spec) {
  ImageFieldSpec s;
  s.layout = spec.layout;
  s.max_pixels = spec.max_pixels;
  return s;
}

}  // namespace

std::vector<int32_t> choose_clip(const ClipSpec& clip, const VideoRecord& rec, uint64_t seed) {
  detail::SplitMix64 rng(hash_combine(seed, kClipStream));
  const int32_t n = rec.num_frames;
  const int t = clip.num_frames;
  std::vector<int32_t> ids(static_cast<size_t>(t));
  if (clip.fps <= 0) {
    const int64_t span = static_cast<int64_t>(t - 1) * clip.step + 1;
    int64_t start = 0;
    if (span <= n) start = clip.random ? rng.randint(0, n - span) : (n - span) / 2;
    for (int i = 0; i < t; ++i)
      ids[static_cast<size_t>(i)] =
          static_cast<int32_t>(std::min<int64_t>(start + int64_t{i} * clip.step, n - 1));
    return ids;
  }
  const double span = (t - 1) / clip.fps;
  const double first = rec.seconds(0), last = rec.seconds(n - 1);
  // the frames a clip may start at: those at least `span` before the last
  int32_t starts = 1;
  {
    int32_t lo = 0, hi = n - 1;  // the last frame with time <= last - span
    const double limit = last - span + 1e-9;
    if (rec.seconds(0) <= limit) {
      while (lo < hi) {
        const int32_t mid = lo + (hi - lo + 1) / 2;
        if (rec.seconds(mid) <= limit)
          lo = mid;
        else
          hi = mid - 1;
      }
      starts = lo + 1;
    }
  }
  int32_t s = 0;
  if (clip.random) {
    s = static_cast<int32_t>(rng.randint(0, starts - 1));
  } else {  // the frame at or before the centred start time
    const double t0 = first + std::max(0.0, (last - first - span) / 2);
    while (s + 1 < starts && rec.seconds(s + 1) <= t0 + 1e-9) ++s;
  }
  int32_t f = s;
  const double t0 = rec.seconds(s);
  for (int i = 0; i < t; ++i) {
    const double at = t0 + i / clip.fps + 1e-9;
    while (f + 1 < n && rec.seconds(f + 1) <= at) ++f;
    ids[static_cast<size_t>(i)] = f;
  }
  return ids;
}

VideoPipeline::VideoPipeline(const VideoFieldSpec& spec)
    : clip_(spec.clip),
      frames_(frame_spec(spec), spec.ops, /*raw_only=*/true),
      max_pixels_(spec.max_pixels) {
  require_media_codecs();
  STOKER_CHECK(clip_.num_frames >= 1 && clip_.num_frames <= 100000, UsageError,
               "a clip's num_frames must be in [1, 100000], got ", clip_.num_frames);
  STOKER_CHECK(clip_.step >= 1, UsageError, "a clip's step must be >= 1, got ", clip_.step);
  STOKER_CHECK(clip_.fps >= 0 && std::isfinite(clip_.fps), UsageError,
               "a clip's fps must be positive, got ", clip_.fps);
  STOKER_CHECK(clip_.fps == 0 || clip_.step == 1, UsageError,
               "a clip takes step= or fps=, not both");
}

std::pair<int, int> VideoPipeline::output_size(const uint8_t* data, size_t n) const {
  const VideoRecord rec = parse_video_record(data, n);
  STOKER_CHECK(int64_t{rec.width} * rec.height <= max_pixels_, DecodeError, "video frames of ",
               rec.width, "x", rec.height, " are over max_image_pixels (", max_pixels_, ")");
  return frames_.output_size_for({rec.height, rec.width});
}

size_t VideoPipeline::frame_bytes(int h, int w) const {
  return static_cast<size_t>(h) * static_cast<size_t>(w) * 3 * dtype_size(out_dtype());
}

void VideoPipeline::run(const uint8_t* data, size_t n, uint64_t seed, void* out, double* pts,
                        int out_h, int out_w, int64_t* decode_ns) const {
  const VideoRecord rec = parse_video_record(data, n);
  STOKER_CHECK(int64_t{rec.width} * rec.height <= max_pixels_, DecodeError, "video frames of ",
               rec.width, "x", rec.height, " are over max_image_pixels (", max_pixels_, ")");
  const std::vector<int32_t> ids = choose_clip(clip_, rec, seed);
  thread_local std::vector<int32_t> distinct;
  distinct.assign(ids.begin(), ids.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const size_t bytes = frame_bytes(out_h, out_w);
  auto* dst = static_cast<uint8_t*>(out);
  const size_t raw = kRawHeaderBytes + static_cast<size_t>(rec.width) * rec.height * 3;
  size_t t = 0;        // the next output frame
  int64_t ops_ns = 0;  // the image ops' share of the decode's time
  // Each decoded frame becomes a raw pixel record in place (the header in the
  // headroom before its pixels), which the image ops read with no copy.
  decode_video_frames(
      rec, distinct.data(), distinct.size(), kRawHeaderBytes,
      [&](size_t i, uint8_t* rgb) {
        uint8_t* record = rgb - kRawHeaderBytes;
        write_raw_header(record, rec.width, rec.height, 3);
        uint8_t* first = dst + t * bytes;
        {
          const ScopedNs timer(&ops_ns);
          frames_.run(record, raw, seed, first, out_h, out_w);
        }
        pts[t] = rec.seconds(distinct[i]);
        ++t;
        while (t < ids.size() && ids[t] == distinct[i]) {  // a short video's last frame again
          std::memcpy(dst + t * bytes, first, bytes);
          pts[t] = pts[t - 1];
          ++t;
        }
      },
      decode_ns);
  if (decode_ns) *decode_ns -= ops_ns;
}

}  // namespace stoker
