// The records of stoker.video() and stoker.audio() fields: the file's bytes as
// they were written (mp4, mkv, webm; wav, flac, mp3, ogg, m4a), behind a small
// index made once when the record is written (video_decoder.h,
// audio_decoder.h), so that a loader finds a clip's frames and samples without
// scanning the file. Little-endian:
//
//   video                                   audio
//   0  magic 0x93 'V' 'I' 'D'               0  magic 0x93 'A' 'U' 'D'
//   4  version (1), 3 zero bytes            4  version (1), 3 zero bytes
//   8  u32 bytes before the file            8  u32 bytes before the file (48)
//  12  u32 frames                          12  i32 stream index
//  16  u32 key frames                      16  i32 sample rate
//  20  i32 stream index                    20  i32 channels
//  24  i32 time base numerator             24  i64 samples (per channel, decoded)
//  28  i32 time base denominator           32  i32 flags (bit 0: seeks are sample-exact,
//                                              bit 1: open with a stream probe)
//  32  i32 width                           36  12 zero bytes
//  36  i32 height                          48  the file
//  40  i32 flags (bit 0: open with a stream probe,
//      bit 1: the probe's reorder delay is at 44)
//  44  i32 reorder delay (frames), or zero
//  48  frames, in presentation order: i64 pts, u32 key frame, u32 zero
//      key frames, in decode order: i64 pts, i64 dts
//      the file
//
// A frame's key frame is the one a decode must start from to produce it (the
// last key frame before it in decode order; the one before that for a leading
// frame of an open GOP, shown before its own key frame). Times are in the
// stream's time base, as the container stores them.
//
// Parsing needs no codec library: a build without FFmpeg still reads the
// sizes, and python/stoker/fields.py writes the same layout from what
// _core.video_record / audio_record return.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker {

inline constexpr uint8_t kVideoMagic[4] = {0x93, 'V', 'I', 'D'};
inline constexpr uint8_t kAudioMagic[4] = {0x93, 'A', 'U', 'D'};
inline constexpr uint8_t kMediaVersion = 1;
inline constexpr size_t kMediaHeaderBytes = 48;
inline constexpr int32_t kVideoProbeStreams = 1;  ///< video flag: needs find_stream_info
/// video flag: the stream probe's findings are stored (the reorder delay), so a
/// loader opens the file without probing (NOTE [ Frame-exact clips ])
inline constexpr int32_t kVideoStoredProbe = 2;
/// The most frames a decoder holds back for reordering (H.264's and HEVC's 16).
inline constexpr int32_t kMaxReorderDelay = 16;
inline constexpr int32_t kAudioExactSeek = 1;     ///< audio flag: pcm or flac
inline constexpr int32_t kAudioProbeStreams = 2;  ///< audio flag: needs find_stream_info
/// The highest audio rate a record holds or a loader resamples to (FFmpeg's
/// decoders stop at 768 kHz; libswresample's filter grows with the ratio).
inline constexpr int32_t kMaxSampleRate = 768000;
/// The most audio channels a record holds (libswresample's limit, SWR_CH_MAX).
inline constexpr int32_t kMaxAudioChannels = 64;

struct VideoFrameEntry {
  int64_t pts;
  uint32_t key;
  uint32_t zero;
};
struct VideoKeyEntry {
  int64_t pts;
  int64_t dts;
};

/// A video record's index and file, pointing into the record.
struct VideoRecord {
  int32_t num_frames = 0;
  int32_t num_keys = 0;
  int32_t stream = 0;
  int32_t tb_num = 0, tb_den = 1;
  int32_t width = 0, height = 0;
  int32_t flags = 0;
  int32_t reorder_delay = 0;        ///< with kVideoStoredProbe: the probe's video_delay
  const uint8_t* frames = nullptr;  ///< num_frames VideoFrameEntry (unaligned)
  const uint8_t* keys = nullptr;    ///< num_keys VideoKeyEntry (unaligned)
  const uint8_t* file = nullptr;
  size_t file_size = 0;

  VideoFrameEntry frame(int32_t i) const;
  VideoKeyEntry key(int32_t i) const;
  /// Presentation time of frame i in seconds.
  double seconds(int32_t i) const;
};

/// An audio record's facts and file, pointing into the record.
struct AudioRecord {
  int32_t stream = 0;
  int32_t sample_rate = 0;
  int32_t channels = 0;
  int64_t samples = 0;
  int32_t flags = 0;
  const uint8_t* file = nullptr;
  size_t file_size = 0;
};

bool is_video_record(const uint8_t* data, size_t n);
bool is_audio_record(const uint8_t* data, size_t n);

/// Parses a video record (the index checked against the record's length and
/// for ascending presentation times). DecodeError saying what is wrong,
/// including for bytes that are not a video record (a file written as a blob).
VideoRecord parse_video_record(const uint8_t* data, size_t n);
/// Parses an audio record. DecodeError as parse_video_record.
AudioRecord parse_audio_record(const uint8_t* data, size_t n);

/// The number of samples of `rec` at `rate` (its own length when the rates
/// are equal, else the resampled length, rounded down).
int64_t resampled_length(const AudioRecord& rec, int rate);

}  // namespace stoker
