#include "codecs/detail/ffmpeg.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "common/error.h"

namespace stoker::detail {

namespace {

constexpr int kIOBufferBytes = 32 * 1024;

}  // namespace

std::string av_error_text(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(err, buf, sizeof buf);
  return buf;
}

void configure_ffmpeg() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* keep = std::getenv("STOKER_FFMPEG_LOG");
    if (!keep || std::strcmp(keep, "1") != 0) av_log_set_level(AV_LOG_QUIET);
    av_max_alloc(kMaxFFmpegAlloc);
  });
}

FramePtr make_frame() {
  FramePtr f(av_frame_alloc());
  if (!f) throw std::bad_alloc();
  return f;
}

PacketPtr make_packet() {
  PacketPtr p(av_packet_alloc());
  if (!p) throw std::bad_alloc();
  return p;
}

int MemoryInput::read(void* opaque, uint8_t* buf, int size) {
  Cursor& c = *static_cast<Cursor*>(opaque);
  const size_t left = c.n - c.pos;
  if (left == 0) return AVERROR_EOF;
  const size_t k = std::min(left, static_cast<size_t>(size));
  std::memcpy(buf, c.data + c.pos, k);
  c.pos += k;
  return static_cast<int>(k);
}

int64_t MemoryInput::seek(void* opaque, int64_t offset, int whence) {
  Cursor& c = *static_cast<Cursor*>(opaque);
  if (whence & AVSEEK_SIZE) return static_cast<int64_t>(c.n);
  int64_t to = 0;
  switch (whence & ~AVSEEK_FORCE) {
    case SEEK_SET:
      to = offset;
      break;
    case SEEK_CUR:
      to = static_cast<int64_t>(c.pos) + offset;
      break;
    case SEEK_END:
      to = static_cast<int64_t>(c.n) + offset;
      break;
    default:
      return AVERROR(EINVAL);
  }
  if (to < 0 || to > static_cast<int64_t>(c.n)) return AVERROR(EINVAL);
  c.pos = static_cast<size_t>(to);
  return to;
}

MemoryInput::MemoryInput(const uint8_t* data, size_t n, bool probe_streams) : cursor_{data, n, 0} {
  configure_ffmpeg();
  auto* buf = static_cast<uint8_t*>(av_malloc(kIOBufferBytes));
  if (!buf) throw std::bad_alloc();
  io_ = avio_alloc_context(buf, kIOBufferBytes, 0, &cursor_, &MemoryInput::read, nullptr,
                           &MemoryInput::seek);
  if (!io_) {
    av_free(buf);
    throw std::bad_alloc();
  }
  fmt_ = avformat_alloc_context();
  if (!fmt_) {
    release();
    throw std::bad_alloc();
  }
  fmt_->pb = io_;
  fmt_->flags |= AVFMT_FLAG_CUSTOM_IO;
  int err = avformat_open_input(&fmt_, nullptr, nullptr, nullptr);  // frees fmt_ on failure
  if (err >= 0 && probe_streams) err = avformat_find_stream_info(fmt_, nullptr);
  if (err < 0) {
    release();
    STOKER_THROW(DecodeError, "FFmpeg cannot read the file (", av_error_text(err), "; ", n,
                 " bytes)");
  }
}

MemoryInput::~MemoryInput() { release(); }

void MemoryInput::release() {
  if (fmt_) avformat_close_input(&fmt_);
  if (io_) {
    av_freep(&io_->buffer);
    avio_context_free(&io_);
  }
}

AVStream* MemoryInput::stream(int i) const {
  STOKER_CHECK(i >= 0 && static_cast<unsigned>(i) < fmt_->nb_streams, DecodeError, "stream ", i,
               " is not in the file (it has ", fmt_->nb_streams, ")");
  return fmt_->streams[i];
}

CodecPtr open_decoder(const AVStream* st) {
  const AVCodec* codec = avcodec_find_decoder(st->codecpar->codec_id);
  STOKER_CHECK(codec != nullptr, DecodeError, "this FFmpeg has no decoder for ",
               avcodec_get_name(st->codecpar->codec_id));
  CodecPtr ctx(avcodec_alloc_context3(codec));
  if (!ctx) throw std::bad_alloc();
  int err = avcodec_parameters_to_context(ctx.get(), st->codecpar);
  STOKER_CHECK(err >= 0, DecodeError, "codec parameters of ", codec->name, ": ",
               av_error_text(err));
  ctx->pkt_timebase = st->time_base;
  ctx->thread_count = 1;
  err = avcodec_open2(ctx.get(), codec, nullptr);
  STOKER_CHECK(err >= 0, DecodeError, "cannot open the ", codec->name, " decoder (",
               av_error_text(err), ")");
  return ctx;
}

}  // namespace stoker::detail
