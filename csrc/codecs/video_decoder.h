// Video fields (stoker.video()): the frame index made when a record is
// written, and the decode of chosen frames in a loader worker (FFmpeg's
// libavformat, libavcodec and libswscale), with no scan of the file.
//
// NOTE [ Frame-exact clips ]
// A clip is a list of frame numbers, chosen before anything is decoded
// (geometry/video_pipeline.h). Frame i is the i-th in presentation order of
// the index, which holds each frame's presentation time (pts) and the key
// frame a decode must start from to produce it (media_record.h). To decode
// frames a < b < ...:
//   * open the file from its container's header alone: where that header does
//     not say everything (mp4 and mkv leave the pixel format to the codec), the
//     stream probe ran once, when the record was written, and what a decoder
//     takes from it (the frames it holds back for reordering) is in the record;
//   * seek to a's key frame, bounded so that the demuxer never lands after
//     it, then drop packets (undecoded) up to that key frame: whatever the
//     demuxer's seek granularity, decoding starts exactly there;
//   * decode forward, and keep the frames whose pts is wanted: a frame is
//     known by its presentation time, so B-frames (decoded out of order) and
//     variable frame rates give exactly the frames asked for;
//   * packets of frames that are not wanted are decoded only as references:
//     for H.264, HEVC and VP9 the decoder skips those that no other frame
//     references (AVDISCARD_NONREF), which changes no other frame's pixels;
//   * a wanted frame whose key frame lies after the packets already read
//     starts a new seek (a clip with a large step skips whole GOPs);
//   * once every wanted frame's packet has gone to the decoder, drain it (a
//     null packet): the frames it holds back for reordering come out without
//     decoding the packets after the clip (a B-frame stream's reorder delay
//     would otherwise cost one to three more reference frames);
//   * stop as soon as the last wanted frame is out.
// Frames are converted to RGB24 with libswscale, at their size, as PyAV's
// frame.to_ndarray(format="rgb24") converts them (bilinear flags, the frame's
// colour space and range): the test oracle (tests/test_video.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "codecs/media_record.h"

namespace stoker {

/// The record of a video field for the file `data` (media_record.h): its
/// first video stream's frame index, then the file. DecodeError naming the
/// reason for bytes FFmpeg cannot read, no video stream, a codec this FFmpeg
/// cannot decode, or packets without presentation times.
std::vector<uint8_t> make_video_record(const uint8_t* data, size_t n);

/// Called with the i-th wanted frame, converted: `rgb` is rec.width x
/// rec.height packed RGB24 rows, with `headroom` writable bytes before it.
using VideoFrameSink = std::function<void(size_t i, uint8_t* rgb)>;

/// Decodes frames `ids` (frame numbers of `rec`, ascending and distinct) and
/// hands each to `sink`, in order (NOTE [ Frame-exact clips ]). DecodeError
/// naming the frame and time for a frame the file does not give.
/// @param decode_ns if given, the codec's and the colour conversion's time
///   is added there
void decode_video_frames(const VideoRecord& rec, const int32_t* ids, size_t count, size_t headroom,
                         const VideoFrameSink& sink, int64_t* decode_ns = nullptr);

}  // namespace stoker
