#include "codecs/audio_decoder.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "codecs/detail/ffmpeg.h"
#include "common/clock.h"
#include "common/error.h"

namespace stoker {

using namespace detail;

namespace {

// Input samples resampled on either side of a range (NOTE [ Audio ranges ]):
// more than libswresample's default filter reaches (32 taps at the lower rate).
constexpr int64_t kResampleMargin = 256;

// Writes v at out[at] and returns the offset after it.
template <typename T>
size_t put(std::vector<uint8_t>& out, size_t at, const T& v) {
  std::memcpy(out.data() + at, &v, sizeof v);
  return at + sizeof v;
}

bool exact_seek(AVCodecID id) {
  const AVCodecDescriptor* d = avcodec_descriptor_get(id);
  return id == AV_CODEC_ID_FLAC || (d && std::strncmp(d->name, "pcm_", 4) == 0);
}

int find_audio_stream(const uint8_t* data, size_t n, bool* probe) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    MemoryInput in(data, n, attempt == 1);
    const int s = av_find_best_stream(in.fmt(), AVMEDIA_TYPE_AUDIO, -1, -1, nullptr, 0);
    if (s >= 0) {
      const AVCodecParameters* par = in.fmt()->streams[s]->codecpar;
      if (par->sample_rate > 0 && par->ch_layout.nb_channels > 0) {
        *probe = attempt == 1;
        return s;
      }
    }
    if (attempt == 1)
      STOKER_THROW(DecodeError, s < 0 ? "the file has no audio stream"
                                      : "the audio stream's rate or channels are unknown");
  }
  return -1;
}

// An opened file's audio stream and its decoder.
struct AudioInput {
  AudioInput(const uint8_t* data, size_t n, int stream, bool probe)
      : in(data, n, probe), st(in.stream(stream)), ctx(open_decoder(st)) {
    STOKER_CHECK(st->codecpar->codec_type == AVMEDIA_TYPE_AUDIO, DecodeError, "stream ", stream,
                 " is not audio");
    for (unsigned i = 0; i < in.fmt()->nb_streams; ++i)
      if (static_cast<int>(i) != stream) in.fmt()->streams[i]->discard = AVDISCARD_ALL;
  }

  // Calls fn(frame) for each decoded frame, in order, until fn returns false
  // or the file ends.
  template <typename Fn>
  void decode(Fn&& fn) {
    PacketPtr pkt = make_packet();
    FramePtr frame = make_frame();
    bool more = true;
    auto drain = [&] {
      for (;;) {
        const int err = avcodec_receive_frame(ctx.get(), frame.get());
        if (err == AVERROR(EAGAIN) || err == AVERROR_EOF) return true;
        STOKER_CHECK(err >= 0, DecodeError, "decoding the audio: ", av_error_text(err));
        const bool go = fn(frame.get());
        av_frame_unref(frame.get());
        if (!go) return false;
      }
    };
    while (more) {
      const int err = av_read_frame(in.fmt(), pkt.get());
      if (err == AVERROR_EOF) break;
      STOKER_CHECK(err >= 0, DecodeError, "reading the audio: ", av_error_text(err));
      if (pkt->stream_index == st->index) {
        const int sent = avcodec_send_packet(ctx.get(), pkt.get());
        STOKER_CHECK(sent >= 0 || sent == AVERROR_INVALIDDATA, DecodeError,
                     "decoding the audio: ", av_error_text(sent));
        more = drain();
      }
      av_packet_unref(pkt.get());
    }
    if (more) {
      avcodec_send_packet(ctx.get(), nullptr);
      drain();
    }
  }

  MemoryInput in;
  AVStream* st;
  CodecPtr ctx;
};

}  // namespace

std::vector<uint8_t> make_audio_record(const uint8_t* data, size_t n) {
  bool probe = false;
  const int s = find_audio_stream(data, n, &probe);
  AudioInput a(data, n, s, probe);
  int64_t samples = 0;
  int rate = 0, channels = 0;
  a.decode([&](const AVFrame* f) {
    if (rate == 0) {
      rate = f->sample_rate;
      channels = f->ch_layout.nb_channels;
      STOKER_CHECK(rate > 0 && rate <= kMaxSampleRate, DecodeError, "the audio's rate of ", rate,
                   " Hz is outside 1 to ", kMaxSampleRate, " Hz");
      STOKER_CHECK(channels > 0 && channels <= kMaxAudioChannels, DecodeError, "the audio has ",
                   channels, " channels: stoker reads 1 to ", kMaxAudioChannels);
    }
    STOKER_CHECK(f->sample_rate == rate && f->ch_layout.nb_channels == channels, DecodeError,
                 "the audio changes from ", rate, " Hz x ", channels, " to ", f->sample_rate,
                 " Hz x ", f->ch_layout.nb_channels, " at sample ", samples, " (not supported)");
    samples += f->nb_samples;
    return true;
  });
  STOKER_CHECK(samples > 0, DecodeError, "the audio stream decodes to no samples");
  STOKER_CHECK(n + kMediaHeaderBytes <= std::numeric_limits<uint32_t>::max(), DecodeError,
               "audio of ", n, " bytes is over a record's limit (4 GiB)");
  std::vector<uint8_t> out(kMediaHeaderBytes + n, 0);
  std::memcpy(out.data(), kAudioMagic, 4);
  out[4] = kMediaVersion;
  size_t at = put(out, 8, static_cast<uint32_t>(kMediaHeaderBytes));
  at = put(out, at, static_cast<int32_t>(s));
  at = put(out, at, static_cast<int32_t>(rate));
  at = put(out, at, static_cast<int32_t>(channels));
  at = put(out, at, samples);
  const int32_t flags = (exact_seek(a.st->codecpar->codec_id) ? kAudioExactSeek : 0) |
                        (probe ? kAudioProbeStreams : 0);
  put(out, at, flags);
  std::memcpy(out.data() + kMediaHeaderBytes, data, n);
  return out;
}

int64_t decode_audio(const AudioRecord& rec, int64_t start, int64_t count, int rate, int channels,
                     float* out, int64_t stride, int64_t* decode_ns) {
  const ScopedNs timer(decode_ns);
  STOKER_CHECK(rate > 0 && rate <= kMaxSampleRate, UsageError, "an audio rate of ", rate,
               " Hz is outside 1 to ", kMaxSampleRate, " Hz");
  STOKER_CHECK(channels > 0 && channels <= kMaxAudioChannels, UsageError, channels,
               " audio channels is outside 1 to ", kMaxAudioChannels);
  const int64_t total = resampled_length(rec, rate);
  count = std::min(count, total - start);
  if (count <= 0) return 0;
  // The input range, and the output samples its resampling gives before `start`.
  const int in_rate = rec.sample_rate;
  int64_t in_from = start, in_to = start + count, skip = 0;
  if (rate != in_rate) {
    const int64_t g = std::gcd<int64_t, int64_t>(in_rate, rate);
    const int64_t L = in_rate / g, M = rate / g;  // L input samples span M output samples
    const int64_t at = static_cast<int64_t>(static_cast<__int128>(start) * in_rate / rate);
    in_from = std::max<int64_t>(0, (at - kResampleMargin) / L * L);
    skip = start - in_from / L * M;
    in_to = std::min<int64_t>(
        rec.samples,
        static_cast<int64_t>((static_cast<__int128>(start + count) * in_rate + rate - 1) / rate) +
            kResampleMargin);
  }

  AudioInput a(rec.file, rec.file_size, rec.stream, (rec.flags & kAudioProbeStreams) != 0);
  // The resampler is made for the first decoded frame: its layout and sample format
  // are the decoder's output, which the stream's parameters need not say (HE-AAC's
  // rate and channels show in its frames). Every frame must have the record's rate and
  // channels, as each had when the record was written: a damaged record or file is
  // refused here, before a frame's channels size a buffer.
  SwrPtr swr;
  AVChannelLayout in_layout{}, out_layout{};
  struct Layouts {
    AVChannelLayout *a, *b;
    ~Layouts() {
      av_channel_layout_uninit(a);
      av_channel_layout_uninit(b);
    }
  } layouts{&in_layout, &out_layout};
  auto make_resampler = [&](const AVFrame* f) {
    if (f->ch_layout.order == AV_CHANNEL_ORDER_UNSPEC)
      av_channel_layout_default(&in_layout, f->ch_layout.nb_channels);
    else
      av_channel_layout_copy(&in_layout, &f->ch_layout);
    if (channels == in_layout.nb_channels)
      av_channel_layout_copy(&out_layout, &in_layout);
    else
      av_channel_layout_default(&out_layout, channels);
    SwrContext* raw = nullptr;
    int err = swr_alloc_set_opts2(&raw, &out_layout, AV_SAMPLE_FMT_FLTP, rate, &in_layout,
                                  static_cast<AVSampleFormat>(f->format), in_rate, 0, nullptr);
    swr.reset(raw);
    if (err >= 0 && channels == 1 && in_layout.nb_channels > 1) {
      // To mono: the mean of the channels (librosa's to_mono, torchaudio's mean), not
      // libswresample's default of each at -3 dB.
      std::vector<double> mean(static_cast<size_t>(in_layout.nb_channels),
                               1.0 / in_layout.nb_channels);
      err = swr_set_matrix(swr.get(), mean.data(), in_layout.nb_channels);
    }
    if (err >= 0) err = swr_init(swr.get());
    STOKER_CHECK(err >= 0, DecodeError, "libswresample cannot convert ", in_rate, " Hz x ",
                 in_layout.nb_channels, " to ", rate, " Hz x ", channels, " (", av_error_text(err),
                 ")");
  };

  int64_t written = 0;  // output samples kept
  int64_t dropped = 0;  // output samples dropped before `start`
  thread_local std::vector<float> conv;
  auto take = [&](int got) {  // conv holds `got` samples per channel, planar
    for (int64_t i = 0; i < got; ++i) {
      if (dropped < skip) {
        ++dropped;
        continue;
      }
      if (written >= count) return;
      for (int c = 0; c < channels; ++c)
        out[c * stride + written] = conv[static_cast<size_t>(c) * static_cast<size_t>(got) + i];
      ++written;
    }
  };
  auto convert = [&](const uint8_t* const* in, int n) {
    const int cap = swr_get_out_samples(swr.get(), n);
    if (cap <= 0) return;
    conv.resize(static_cast<size_t>(cap) * channels);
    uint8_t* planes[kMaxAudioChannels];
    for (int c = 0; c < channels; ++c)
      planes[c] = reinterpret_cast<uint8_t*>(conv.data() + static_cast<size_t>(c) * cap);
    // (const_cast: FFmpeg before 7 declares the input const uint8_t**)
    const int got = swr_convert(swr.get(), planes, cap, const_cast<const uint8_t**>(in), n);
    STOKER_CHECK(got >= 0, DecodeError, "resampling the audio: ", av_error_text(got));
    // planes are `cap` apart: compact to `got` apart for take()
    if (got < cap)
      for (int c = 1; c < channels; ++c)
        std::memmove(conv.data() + static_cast<size_t>(c) * got,
                     conv.data() + static_cast<size_t>(c) * cap, sizeof(float) * got);
    take(got);
  };

  const bool seek = (rec.flags & kAudioExactSeek) && in_from > 0;
  int64_t pos = 0;  // sample index of the next decoded frame's first sample
  const int64_t start_pts = a.st->start_time == AV_NOPTS_VALUE ? 0 : a.st->start_time;
  if (seek) {
    const int64_t ts = start_pts + av_rescale_q(in_from, AVRational{1, in_rate}, a.st->time_base);
    const int err = av_seek_frame(a.in.fmt(), rec.stream, ts, AVSEEK_FLAG_BACKWARD);
    STOKER_CHECK(err >= 0, DecodeError, "cannot seek in the audio (", av_error_text(err), ")");
  }
  bool placed = !seek;
  int format = AV_SAMPLE_FMT_NONE, bps = 0;
  bool planar = false;
  a.decode([&](const AVFrame* f) {
    STOKER_CHECK(f->sample_rate == in_rate && f->ch_layout.nb_channels == rec.channels, DecodeError,
                 "the audio decodes to ", f->sample_rate, " Hz x ", f->ch_layout.nb_channels,
                 ", its record says ", in_rate, " Hz x ", rec.channels,
                 " (the record or the file is damaged)");
    STOKER_CHECK(!swr || f->format == format, DecodeError,
                 "the audio's sample format changes from frame to frame");
    if (!placed) {  // after a seek: the frame's place from its time
      STOKER_CHECK(f->pts != AV_NOPTS_VALUE, DecodeError, "an audio frame has no time");
      pos = av_rescale_q(f->pts - start_pts, a.st->time_base, AVRational{1, in_rate});
      placed = true;
      STOKER_CHECK(pos <= in_from, DecodeError, "seek landed after sample ", in_from);
    }
    const int64_t lo = std::max(pos, in_from), hi = std::min(pos + f->nb_samples, in_to);
    if (lo < hi) {
      if (!swr) {
        make_resampler(f);
        format = f->format;
        bps = av_get_bytes_per_sample(static_cast<AVSampleFormat>(format));
        planar = av_sample_fmt_is_planar(static_cast<AVSampleFormat>(format));
      }
      const int64_t off = lo - pos;
      const uint8_t* in[kMaxAudioChannels];  // (each frame was checked: rec.channels)
      const int nch = f->ch_layout.nb_channels;
      for (int c = 0; c < (planar ? nch : 1); ++c)
        in[c] = f->extended_data[c] + off * bps * (planar ? 1 : nch);
      convert(in, static_cast<int>(hi - lo));
    }
    pos += f->nb_samples;
    return pos < in_to && written < count;
  });
  if (swr && written < count) convert(nullptr, 0);  // what the resampler holds back
  return written;
}

}  // namespace stoker
