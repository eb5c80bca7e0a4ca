#include "codecs/video_decoder.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "codecs/detail/ffmpeg.h"
#include "common/clock.h"
#include "common/error.h"

namespace stoker {

using namespace detail;

namespace {

struct Packet {
  int64_t pts, dts;
  bool key;
  bool discard;
};

// Writes v at out[at] and returns the offset after it.
template <typename T>
size_t put(std::vector<uint8_t>& out, size_t at, const T& v) {
  std::memcpy(out.data() + at, &v, sizeof v);
  return at + sizeof v;
}

// The first video stream, the file opened with a stream probe only where the
// container's header does not say the codec and size.
int find_video_stream(const uint8_t* data, size_t n, bool* probe) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    MemoryInput in(data, n, attempt == 1);
    const int s = av_find_best_stream(in.fmt(), AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
    if (s >= 0) {
      const AVCodecParameters* par = in.fmt()->streams[s]->codecpar;
      if (par->width > 0 && par->height > 0 && par->format != AV_PIX_FMT_NONE) {
        *probe = attempt == 1;
        return s;
      }
    }
    if (attempt == 1)
      STOKER_THROW(DecodeError, s < 0 ? "the file has no video stream"
                                      : "the video stream's size or pixel format is unknown");
  }
  return -1;
}

// Stream `rec.stream` of `in`, with what the stream probe would have found
// (kVideoStoredProbe): the decoder then starts as after a probe, holding back
// as many frames for reordering as it did when the record was written (a
// decoder that learns the delay while decoding drops the frames it already
// let out of order).
AVStream* stream_as_probed(const MemoryInput& in, const VideoRecord& rec) {
  AVStream* st = in.stream(rec.stream);
  if (rec.flags & kVideoStoredProbe) st->codecpar->video_delay = rec.reorder_delay;
  return st;
}

bool skips_nonref(AVCodecID id) {
  return id == AV_CODEC_ID_H264 || id == AV_CODEC_ID_HEVC || id == AV_CODEC_ID_VP9;
}

}  // namespace

std::vector<uint8_t> make_video_record(const uint8_t* data, size_t n) {
  bool probe = false;
  const int s = find_video_stream(data, n, &probe);
  MemoryInput in(data, n, probe);
  const AVStream* st = in.stream(s);
  open_decoder(st);  // a codec this FFmpeg decodes, or the error now rather than at load
  std::vector<Packet> packets;
  PacketPtr pkt = make_packet();
  int err;
  while ((err = av_read_frame(in.fmt(), pkt.get())) >= 0) {
    if (pkt->stream_index == s) {
      STOKER_CHECK(pkt->pts != AV_NOPTS_VALUE, DecodeError, "video packet ", packets.size(),
                   " has no presentation time (a raw elementary stream?); remux the file "
                   "into mp4 or mkv (ffmpeg -i IN -c copy OUT.mp4)");
      packets.push_back({pkt->pts, pkt->dts == AV_NOPTS_VALUE ? pkt->pts : pkt->dts,
                         (pkt->flags & AV_PKT_FLAG_KEY) != 0,
                         (pkt->flags & AV_PKT_FLAG_DISCARD) != 0});
    }
    av_packet_unref(pkt.get());
  }
  STOKER_CHECK(err == AVERROR_EOF, DecodeError,
               "reading the video's packets: ", av_error_text(err));
  // Key frames in decode order; each frame's: the last at or before its packet.
  std::vector<VideoKeyEntry> keys;
  std::vector<int64_t> frame_pts;
  std::vector<uint32_t> frame_key;
  for (const Packet& p : packets) {
    if (p.key) keys.push_back({p.pts, p.dts});
    if (keys.empty() || p.discard) continue;  // before the first key frame: not decodable
    uint32_t k = static_cast<uint32_t>(keys.size() - 1);
    if (p.pts < keys[k].pts && k > 0) --k;  // a leading frame of an open GOP
    frame_pts.push_back(p.pts);
    frame_key.push_back(k);
  }
  STOKER_CHECK(!frame_pts.empty(), DecodeError, "the video stream has no decodable frame");
  std::vector<size_t> order(frame_pts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return frame_pts[a] < frame_pts[b]; });
  std::vector<VideoFrameEntry> frames;
  frames.reserve(order.size());
  for (size_t i : order) {
    if (!frames.empty() && frames.back().pts == frame_pts[i]) continue;  // a repeated pts
    frames.push_back({frame_pts[i], frame_key[i], 0});
  }
  const uint64_t head = kMediaHeaderBytes + frames.size() * sizeof(VideoFrameEntry) +
                        keys.size() * sizeof(VideoKeyEntry);
  STOKER_CHECK(head + n <= std::numeric_limits<uint32_t>::max(), DecodeError, "video of ", n,
               " bytes is over a record's limit (4 GiB)");
  std::vector<uint8_t> out(head + n, 0);
  const AVCodecParameters* par = st->codecpar;
  std::memcpy(out.data(), kVideoMagic, 4);
  out[4] = kMediaVersion;
  size_t at = put(out, 8, static_cast<uint32_t>(head));
  at = put(out, at, static_cast<uint32_t>(frames.size()));
  at = put(out, at, static_cast<uint32_t>(keys.size()));
  at = put(out, at, static_cast<int32_t>(s));
  at = put(out, at, static_cast<int32_t>(st->time_base.num));
  at = put(out, at, static_cast<int32_t>(st->time_base.den));
  at = put(out, at, static_cast<int32_t>(par->width));
  at = put(out, at, static_cast<int32_t>(par->height));
  // What the stream probe found, kept, so that a clip's decode opens the file
  // without one (the probe decodes frames: a few percent of a clip's time).
  at = put(out, at, static_cast<int32_t>(probe ? kVideoProbeStreams | kVideoStoredProbe : 0));
  put(out, at, static_cast<int32_t>(std::clamp(par->video_delay, 0, kMaxReorderDelay)));
  at = kMediaHeaderBytes;
  for (const VideoFrameEntry& f : frames) at = put(out, at, f);
  for (const VideoKeyEntry& k : keys) at = put(out, at, k);
  std::memcpy(out.data() + at, data, n);
  return out;
}

namespace {

// PyAV's frame.to_ndarray(format="rgb24"): bilinear flags, the source's colour
// space (BT.601 when unspecified) and range, full-range RGB out.
class RgbConverter {
 public:
  ~RgbConverter() { sws_freeContext(sws_); }

  void convert(const AVFrame* f, uint8_t* out) {
    sws_ = sws_getCachedContext(sws_, f->width, f->height, static_cast<AVPixelFormat>(f->format),
                                f->width, f->height, AV_PIX_FMT_RGB24, SWS_BILINEAR, nullptr,
                                nullptr, nullptr);
    STOKER_CHECK(sws_ != nullptr, DecodeError, "libswscale cannot convert ",
                 av_get_pix_fmt_name(static_cast<AVPixelFormat>(f->format)), " to RGB");
    int cs = SWS_CS_DEFAULT;
    switch (f->colorspace) {
      case AVCOL_SPC_BT709:
        cs = SWS_CS_ITU709;
        break;
      case AVCOL_SPC_FCC:
        cs = SWS_CS_FCC;
        break;
      case AVCOL_SPC_SMPTE240M:
        cs = SWS_CS_SMPTE240M;
        break;
      case AVCOL_SPC_BT2020_NCL:
      case AVCOL_SPC_BT2020_CL:
        cs = SWS_CS_BT2020;
        break;
      default:
        break;
    }
    const int* coefs = sws_getCoefficients(cs);
    const int src_full = f->color_range == AVCOL_RANGE_JPEG ? 1 : 0;
    sws_setColorspaceDetails(sws_, coefs, src_full, sws_getCoefficients(SWS_CS_DEFAULT), 1, 0,
                             1 << 16, 1 << 16);
    uint8_t* dst[4] = {out, nullptr, nullptr, nullptr};
    int stride[4] = {f->width * 3, 0, 0, 0};
    sws_scale(sws_, f->data, f->linesize, 0, f->height, dst, stride);
  }

 private:
  SwsContext* sws_ = nullptr;
};

class ClipDecode {
 public:
  ClipDecode(const VideoRecord& rec, const int32_t* ids, size_t count, size_t headroom,
             const VideoFrameSink& sink)
      : rec_(rec),
        ids_(ids),
        count_(count),
        headroom_(headroom),
        sink_(sink),
        in_(rec.file, rec.file_size,
            (rec.flags & kVideoProbeStreams) != 0 && (rec.flags & kVideoStoredProbe) == 0),
        st_(stream_as_probed(in_, rec)),
        ctx_(open_decoder(st_)),
        pkt_(make_packet()),
        frame_(make_frame()),
        skip_(skips_nonref(st_->codecpar->codec_id)),
        sent_(count, 0) {
    STOKER_CHECK(st_->codecpar->codec_type == AVMEDIA_TYPE_VIDEO, DecodeError, "stream ",
                 rec.stream, " is not video");
    // every other stream's packets are dropped by the demuxer
    for (unsigned i = 0; i < in_.fmt()->nb_streams; ++i)
      if (static_cast<int>(i) != rec.stream) in_.fmt()->streams[i]->discard = AVDISCARD_ALL;
  }

  void run() {
    while (next_ < count_) {
      const uint32_t key = rec_.frame(ids_[next_]).key;
      if (!started_ || key > fed_key_) seek_to(key);
      // The end of the file, or every wanted frame's packet sent: the
      // decoder's delayed frames come out without decoding what follows.
      if (!feed() || all_sent()) {
        avcodec_send_packet(ctx_.get(), nullptr);
        receive();
        if (next_ < count_) missing();
      }
    }
  }

 private:
  void seek_to(uint32_t key) {
    const VideoKeyEntry k = rec_.key(static_cast<int32_t>(key));
    // Never past the key frame: the last seek point at or before its time
    // (pts or dts, whichever the container indexes by).
    seek_ts(std::min(k.pts, k.dts));
    avcodec_flush_buffers(ctx_.get());
    std::fill(sent_.begin(), sent_.end(), 0);
    started_ = true;
    waiting_for_ = key;
    seeking_ = true;
  }

  // Reads and decodes one packet of the stream; false at the end of the file.
  bool feed() {
    for (;;) {
      const int err = av_read_frame(in_.fmt(), pkt_.get());
      if (err == AVERROR_EOF) return false;
      STOKER_CHECK(err >= 0, DecodeError, "reading the video: ", av_error_text(err));
      struct Unref {
        AVPacket* p;
        ~Unref() { av_packet_unref(p); }
      } unref{pkt_.get()};
      if (pkt_->stream_index != rec_.stream) continue;
      if (seeking_) {  // drop what comes before the key frame
        const VideoKeyEntry k = rec_.key(static_cast<int32_t>(waiting_for_));
        const int64_t dts = pkt_->dts == AV_NOPTS_VALUE ? pkt_->pts : pkt_->dts;
        if (pkt_->pts != k.pts || !(pkt_->flags & AV_PKT_FLAG_KEY)) {
          if (dts > k.dts) restart();  // the demuxer landed after it
          continue;
        }
        seeking_ = false;
        fed_key_ = waiting_for_;
      } else if (pkt_->flags & AV_PKT_FLAG_KEY) {
        while (fed_key_ + 1 < static_cast<uint32_t>(rec_.num_keys) &&
               rec_.key(static_cast<int32_t>(fed_key_ + 1)).pts <= pkt_->pts)
          ++fed_key_;
      }
      const size_t w = wanted(pkt_->pts);
      if (skip_) ctx_->skip_frame = w < count_ ? AVDISCARD_DEFAULT : AVDISCARD_NONREF;
      const int sent = avcodec_send_packet(ctx_.get(), pkt_.get());
      STOKER_CHECK(sent >= 0 || sent == AVERROR_INVALIDDATA, DecodeError,
                   "decoding the video: ", av_error_text(sent));
      if (w < count_) sent_[w] = 1;
      receive();
      return true;
    }
  }

  bool all_sent() const {
    for (size_t i = next_; i < count_; ++i)
      if (!sent_[i]) return false;
    return true;
  }

  void seek_ts(int64_t ts) {
    int err =
        avformat_seek_file(in_.fmt(), rec_.stream, std::numeric_limits<int64_t>::min(), ts, ts, 0);
    if (err < 0) err = av_seek_frame(in_.fmt(), rec_.stream, ts, AVSEEK_FLAG_BACKWARD);
    STOKER_CHECK(err >= 0, DecodeError, "cannot seek in the video (", av_error_text(err), ")");
  }

  // The demuxer landed after the key frame: from the first one, dropping
  // packets up to it (right, only slower).
  void restart() {
    STOKER_CHECK(!restarted_, DecodeError, "the video's key frame at pts ",
                 rec_.key(static_cast<int32_t>(waiting_for_)).pts, " is not in the file");
    restarted_ = true;
    const VideoKeyEntry first = rec_.key(0);
    seek_ts(std::min(first.pts, first.dts));
    avcodec_flush_buffers(ctx_.get());
    std::fill(sent_.begin(), sent_.end(), 0);
  }

  // The index among the wanted frames still to come of the one at `pts`, or count_.
  size_t wanted(int64_t pts) const {
    for (size_t i = next_; i < count_; ++i) {
      const int64_t p = rec_.frame(ids_[i]).pts;
      if (p == pts) return i;
      if (p > pts) break;
    }
    return count_;
  }

  void receive() {
    for (;;) {
      const int err = avcodec_receive_frame(ctx_.get(), frame_.get());
      if (err == AVERROR(EAGAIN) || err == AVERROR_EOF) return;
      STOKER_CHECK(err >= 0, DecodeError, "decoding the video: ", av_error_text(err));
      struct Unref {
        AVFrame* f;
        ~Unref() { av_frame_unref(f); }
      } unref{frame_.get()};
      const int64_t pts =
          frame_->pts != AV_NOPTS_VALUE ? frame_->pts : frame_->best_effort_timestamp;
      if (next_ >= count_ || pts != rec_.frame(ids_[next_]).pts) continue;
      STOKER_CHECK(frame_->width == rec_.width && frame_->height == rec_.height, DecodeError,
                   "frame ", ids_[next_], " is ", frame_->width, "x", frame_->height,
                   " where the video's header says ", rec_.width, "x", rec_.height,
                   " (a stream that changes size is not supported)");
      thread_local std::vector<uint8_t> rgb;
      rgb.resize(headroom_ + static_cast<size_t>(rec_.width) * rec_.height * 3);
      converter().convert(frame_.get(), rgb.data() + headroom_);
      sink_(next_, rgb.data() + headroom_);
      ++next_;
    }
  }

  [[noreturn]] void missing() const {
    STOKER_THROW(DecodeError, "frame ", ids_[next_], " (pts ", rec_.frame(ids_[next_]).pts, ", ",
                 rec_.seconds(ids_[next_]), " s) was not produced by the decoder");
  }

  static RgbConverter& converter() {
    thread_local RgbConverter c;
    return c;
  }

  const VideoRecord& rec_;
  const int32_t* ids_;
  size_t count_;
  size_t headroom_;
  const VideoFrameSink& sink_;
  MemoryInput in_;
  AVStream* st_;
  CodecPtr ctx_;
  PacketPtr pkt_;
  FramePtr frame_;
  bool skip_;
  std::vector<uint8_t> sent_;  // whether wanted frame i's packet went to the decoder
  size_t next_ = 0;            // the next wanted frame
  bool started_ = false;
  bool seeking_ = false;  // dropping packets up to waiting_for_
  bool restarted_ = false;
  uint32_t waiting_for_ = 0;
  uint32_t fed_key_ = 0;  // the last key frame whose packet was decoded
};

}  // namespace

void decode_video_frames(const VideoRecord& rec, const int32_t* ids, size_t count, size_t headroom,
                         const VideoFrameSink& sink, int64_t* decode_ns) {
  const ScopedNs timer(decode_ns);
  if (count == 0) return;
  ClipDecode(rec, ids, count, headroom, sink).run();
}

}  // namespace stoker
