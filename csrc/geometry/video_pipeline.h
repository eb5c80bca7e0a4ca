// The path of one video field: choose the clip's frames from the sample's
// draws (nothing decoded yet), decode them (codecs/video_decoder.h), and run
// the field's image ops on every frame with one set of draws, so a random
// crop or flip is the same on all frames of a clip; written straight into the
// batch slot, with each frame's presentation time.
//
// NOTE [ Clip sampling ]
// By frames (fps = 0), a clip is num_frames frames `step` apart: start,
// start + step, ...; RandomClip draws the start uniformly among those whose
// clip fits, CenterClip takes the middle one. By time (fps > 0), the clip's
// times are t0, t0 + 1/fps, ... and each takes the frame shown at that time
// (the last whose pts is at or before it): the same clip duration whatever
// the file's frame rate, variable rates included; t0 is a frame's time, drawn
// among those whose clip fits. A video shorter than its clip repeats its last
// frame (the times in "<name>_pts" say so). The draw comes from the sample's
// seed (NOTE [ Random draws ] in producers/record_producer.h), on its own
// stream, apart from the image ops' draws.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "codecs/media_record.h"
#include "common/dtype.h"
#include "geometry/image_ops.h"
#include "geometry/image_pipeline.h"
#include "geometry/pixel_writer.h"

namespace stoker {

/// Which frames a clip takes (NOTE [ Clip sampling ]).
struct ClipSpec {
  bool random = true;  ///< RandomClip, else CenterClip
  int num_frames = 1;
  int step = 1;
  double fps = 0;  ///< > 0: a clip by time at this rate (step is then 1)
};

struct VideoFieldSpec {
  ClipSpec clip;
  std::vector<ImageOp> ops;  ///< on every frame, one set of draws per clip
  ImageLayout layout = ImageLayout::kCHW;
  int64_t max_pixels = 100'000'000;  ///< larger frames are refused before decoding
};

/// The frames of a clip of `rec` for `seed` (num_frames frame numbers,
/// ascending; repeated at the end when the video is short).
std::vector<int32_t> choose_clip(const ClipSpec& clip, const VideoRecord& rec, uint64_t seed);

class VideoPipeline {
 public:
  /// Checks the clip and the ops (UsageError naming what is wrong).
  explicit VideoPipeline(const VideoFieldSpec& spec);

  const ClipSpec& clip() const { return clip_; }
  int num_frames() const { return clip_.num_frames; }
  DType out_dtype() const { return frames_.out_dtype(); }
  ImageLayout layout() const { return frames_.layout(); }
  /// (h, w) of a frame when the ops fix it, else nullopt.
  std::optional<std::pair<int, int>> fixed_size() const { return frames_.fixed_size(); }
  /// Output (h, w) of a frame of this record, from its index. DecodeError.
  std::pair<int, int> output_size(const uint8_t* data, size_t n) const;
  /// Bytes of one frame at (h, w).
  size_t frame_bytes(int h, int w) const;

  /// Chooses, decodes and transforms the clip of this record for `seed` into
  /// `out` (num_frames frames of out_h x out_w, each in layout()), and the
  /// frames' times in seconds into `pts` (num_frames doubles). Thread-safe.
  void run(const uint8_t* data, size_t n, uint64_t seed, void* out, double* pts, int out_h,
           int out_w, int64_t* decode_ns = nullptr) const;

 private:
  ClipSpec clip_;
  ImagePipeline frames_;
  int64_t max_pixels_;
};

}  // namespace stoker
