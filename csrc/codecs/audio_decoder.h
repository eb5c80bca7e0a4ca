// Audio fields (stoker.audio()): the facts of a file made when its record is
// written (rate, channels, the exact number of samples), and the decode of a
// range of samples in a loader worker, converted to float32 and resampled
// (FFmpeg's libavformat, libavcodec and libswresample).
//
// NOTE [ Audio ranges ]
// Sample 0 is the first sample FFmpeg's decode of the whole file gives (an
// encoder's priming samples are gone, as in PyAV or torchaudio), and the
// record says how many there are, counted by decoding the file once when it
// is written. A range is decoded as that full decode would give it:
//   * PCM (wav) and FLAC, whose frames decode alone, are seeked: to the last
//     seek point before the range, then frames are placed by their time;
//   * other codecs (mp3, aac, vorbis, opus) carry state from frame to frame
//     (overlapped transforms, mp3's bit reservoir), so they are decoded from
//     the start of the file up to the range's end: exact, and at hundreds of
//     times real time for a short clip (long files: see docs/video.md).
// Resampling (libswresample, its default filter) runs over the range with
// `kResampleMargin` input samples on either side, which the output drops, so
// that a crop's samples are those of the whole file resampled, within the
// filter's precision; the margin starts on a sample where the two rates'
// grids meet, so an output sample's time is exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codecs/media_record.h"

namespace stoker {

/// The record of an audio field for the file `data` (media_record.h): its
/// first audio stream's rate, channels and exact length, then the file.
/// DecodeError naming the reason for bytes FFmpeg cannot read or decode.
std::vector<uint8_t> make_audio_record(const uint8_t* data, size_t n);

/// Decodes samples [start, start + count) of `rec`, at `rate` and with
/// `channels` channels (to mono: the mean of the channels; other changes by
/// libswresample's default matrix), as float32 rows of `stride` floats, one per
/// channel. Samples past the end are not written. NOTE [ Audio ranges ].
/// @return the samples written per channel
int64_t decode_audio(const AudioRecord& rec, int64_t start, int64_t count, int rate, int channels,
                     float* out, int64_t stride, int64_t* decode_ns = nullptr);

}  // namespace stoker
