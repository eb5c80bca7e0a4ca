#include "codecs/media_record.h"

#include <cstring>

#include "common/error.h"

namespace stoker {

namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // little-endian hosts only (the shard format's rule)
  return v;
}

void check_header(const uint8_t* data, size_t n, const uint8_t* magic, const char* what) {
  if (n < 4 || std::memcmp(data, magic, 4) != 0)
    STOKER_THROW(DecodeError, "not a stoker.", what,
                 "() record (written as another field type?); starts with ",
                 n >= 1 ? int(data[0]) : -1, " ...");
  STOKER_CHECK(n >= kMediaHeaderBytes, DecodeError, what, " record cut short (", n,
               " bytes, the header alone is ", kMediaHeaderBytes, ")");
  STOKER_CHECK(data[4] == kMediaVersion, DecodeError, what, " record of version ", int(data[4]),
               " (this stoker reads version ", int(kMediaVersion), ")");
}

}  // namespace

bool is_video_record(const uint8_t* data, size_t n) {
  return n >= 4 && std::memcmp(data, kVideoMagic, 4) == 0;
}

bool is_audio_record(const uint8_t* data, size_t n) {
  return n >= 4 && std::memcmp(data, kAudioMagic, 4) == 0;
}

VideoFrameEntry VideoRecord::frame(int32_t i) const {
  return load<VideoFrameEntry>(frames + static_cast<size_t>(i) * sizeof(VideoFrameEntry));
}

VideoKeyEntry VideoRecord::key(int32_t i) const {
  return load<VideoKeyEntry>(keys + static_cast<size_t>(i) * sizeof(VideoKeyEntry));
}

double VideoRecord::seconds(int32_t i) const {
  return static_cast<double>(frame(i).pts) * tb_num / tb_den;
}

VideoRecord parse_video_record(const uint8_t* data, size_t n) {
  check_header(data, n, kVideoMagic, "video");
  VideoRecord r;
  const uint32_t head = load<uint32_t>(data + 8);
  const uint32_t frames = load<uint32_t>(data + 12), keys = load<uint32_t>(data + 16);
  r.stream = load<int32_t>(data + 20);
  r.tb_num = load<int32_t>(data + 24);
  r.tb_den = load<int32_t>(data + 28);
  r.width = load<int32_t>(data + 32);
  r.height = load<int32_t>(data + 36);
  r.flags = load<int32_t>(data + 40);
  r.reorder_delay = load<int32_t>(data + 44);
  const uint64_t want = kMediaHeaderBytes + uint64_t{frames} * sizeof(VideoFrameEntry) +
                        uint64_t{keys} * sizeof(VideoKeyEntry);
  STOKER_CHECK(frames >= 1 && keys >= 1 && frames < (1u << 30) && keys <= frames && head == want &&
                   head <= n,
               DecodeError, "video record index is inconsistent (", frames, " frames, ", keys,
               " key frames, ", head, " index bytes of ", n, ")");
  STOKER_CHECK(r.tb_num > 0 && r.tb_den > 0 && r.width > 0 && r.height > 0 && r.stream >= 0,
               DecodeError, "video record declares time base ", r.tb_num, "/", r.tb_den, ", size ",
               r.width, "x", r.height);
  STOKER_CHECK(r.reorder_delay >= 0 && r.reorder_delay <= kMaxReorderDelay, DecodeError,
               "video record declares a reorder delay of ", r.reorder_delay, " frames");
  r.num_frames = static_cast<int32_t>(frames);
  r.num_keys = static_cast<int32_t>(keys);
  r.frames = data + kMediaHeaderBytes;
  r.keys = r.frames + size_t{frames} * sizeof(VideoFrameEntry);
  r.file = data + head;
  r.file_size = n - head;
  int64_t last = 0;
  for (int32_t i = 0; i < r.num_frames; ++i) {
    const VideoFrameEntry e = r.frame(i);
    STOKER_CHECK(e.key < keys && (i == 0 || e.pts > last), DecodeError,
                 "video record index is corrupt at frame ", i);
    last = e.pts;
  }
  return r;
}

AudioRecord parse_audio_record(const uint8_t* data, size_t n) {
  check_header(data, n, kAudioMagic, "audio");
  AudioRecord r;
  const uint32_t head = load<uint32_t>(data + 8);
  r.stream = load<int32_t>(data + 12);
  r.sample_rate = load<int32_t>(data + 16);
  r.channels = load<int32_t>(data + 20);
  r.samples = load<int64_t>(data + 24);
  r.flags = load<int32_t>(data + 32);
  STOKER_CHECK(head == kMediaHeaderBytes && r.stream >= 0 && r.sample_rate > 0 &&
                   r.sample_rate <= kMaxSampleRate && r.channels > 0 &&
                   r.channels <= kMaxAudioChannels && r.samples >= 0,
               DecodeError, "audio record header is inconsistent (", r.sample_rate, " Hz, ",
               r.channels, " channels, ", r.samples, " samples)");
  r.file = data + head;
  r.file_size = n - head;
  return r;
}

int64_t resampled_length(const AudioRecord& rec, int rate) {
  if (rate == rec.sample_rate) return rec.samples;
  return static_cast<int64_t>(static_cast<__int128>(rec.samples) * rate / rec.sample_rate);
}

}  // namespace stoker
