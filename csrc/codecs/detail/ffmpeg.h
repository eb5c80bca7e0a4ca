// FFmpeg's libraries as the media decoders use them: a demuxer reading from
// memory (a record's bytes, never a file), and owners of FFmpeg's objects
// that free them on every path. Included only by the .cpp files built with
// STOKER_WITH_VIDEO.
#pragma once

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avutil.h>
#include <libavutil/channel_layout.h>
#include <libavutil/mem.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>
}

// FFmpeg 5.1 (libavcodec 59.37): the channel-layout API the audio path uses.
#if LIBAVCODEC_VERSION_INT < AV_VERSION_INT(59, 37, 100)
#error "stoker's video and audio fields need FFmpeg 5.1 or newer (or -DSTOKER_WITH_VIDEO=OFF)"
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace stoker::detail {

/// FFmpeg's text for an error code.
std::string av_error_text(int err);

/// FFmpeg's process-wide settings, once per process, before the first file is
/// opened: its own logging quiet (errors reach the user as exceptions that name
/// the file; STOKER_FFMPEG_LOG=1 leaves it as FFmpeg has it), and its largest
/// single allocation lowered to kMaxFFmpegAlloc (NOTE [ FFmpeg's allocations ]).
void configure_ffmpeg();

// NOTE [ FFmpeg's allocations ]
// A damaged file can make FFmpeg allocate what its headers claim before it reads
// a byte of it: a WAV whose LIST chunk claims 4 GB makes the demuxer allocate a
// tag of nearly 2 GB (av_mallocz, so every page is touched), in
// avformat_open_input, found by tests/fuzz/fuzz_media.cpp. A loader opens files
// on several threads at once, so a few damaged records could take a host's
// memory. libavutil refuses any single allocation over av_max_alloc()'s limit
// (INT_MAX by default) as out of memory, which the demuxer reports as an error,
// so the file is refused with a DecodeError. 1 GiB is far above what a record's
// decode needs in one block: a packet is at most its file (records are read
// whole), and a frame over the loader's pixel limit is refused first.
inline constexpr size_t kMaxFFmpegAlloc = size_t{1} << 30;

struct FrameFree {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct CodecFree {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct SwrFree {
  void operator()(SwrContext* s) const { swr_free(&s); }
};
using FramePtr = std::unique_ptr<AVFrame, FrameFree>;
using PacketPtr = std::unique_ptr<AVPacket, PacketFree>;
using CodecPtr = std::unique_ptr<AVCodecContext, CodecFree>;
using SwrPtr = std::unique_ptr<SwrContext, SwrFree>;

FramePtr make_frame();
PacketPtr make_packet();

/// A demuxer over `n` bytes at `data` (a record's file: valid while this lives).
/// Without `probe_streams` the streams are what the container's header says
/// (enough for mp4, mkv, webm, wav, flac, ogg: no frame is decoded to open it);
/// with it, avformat_find_stream_info reads ahead as FFmpeg's tools do.
/// DecodeError naming FFmpeg's reason when the bytes are no container it reads.
class MemoryInput {
 public:
  MemoryInput(const uint8_t* data, size_t n, bool probe_streams);
  ~MemoryInput();
  MemoryInput(const MemoryInput&) = delete;
  MemoryInput& operator=(const MemoryInput&) = delete;

  AVFormatContext* fmt() const { return fmt_; }
  AVStream* stream(int i) const;

 private:
  struct Cursor {
    const uint8_t* data;
    size_t n;
    size_t pos;
  };
  void release();
  static int read(void* opaque, uint8_t* buf, int size);
  static int64_t seek(void* opaque, int64_t offset, int whence);

  Cursor cursor_;
  AVIOContext* io_ = nullptr;
  AVFormatContext* fmt_ = nullptr;
};

/// A single-threaded decoder of stream `st` (loader workers decode samples in
/// parallel; a decoder's own threads would only compete with them).
/// DecodeError when this FFmpeg has no decoder for its codec.
CodecPtr open_decoder(const AVStream* st);

}  // namespace stoker::detail
