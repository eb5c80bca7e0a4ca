#include "codecs/media.h"

#include "codecs/detail/ffmpeg.h"

namespace stoker {

namespace {

std::string version(const char* name, unsigned v) {
  return std::string(name) + " " + std::to_string(AV_VERSION_MAJOR(v)) + "." +
         std::to_string(AV_VERSION_MINOR(v)) + "." + std::to_string(AV_VERSION_MICRO(v));
}

}  // namespace

bool have_media_codecs() { return true; }

void require_media_codecs() {}

std::string media_codec_versions() {
  return version("libavformat", avformat_version()) + ", " +
         version("libavcodec", avcodec_version()) + ", " +
         version("libswscale", swscale_version()) + ", " +
         version("libswresample", swresample_version());
}

std::string media_decoders() {
  static const AVCodecID kIds[] = {AV_CODEC_ID_H264,   AV_CODEC_ID_HEVC, AV_CODEC_ID_VP8,
                                   AV_CODEC_ID_VP9,    AV_CODEC_ID_AV1,  AV_CODEC_ID_MPEG4,
                                   AV_CODEC_ID_AAC,    AV_CODEC_ID_MP3,  AV_CODEC_ID_OPUS,
                                   AV_CODEC_ID_VORBIS, AV_CODEC_ID_FLAC, AV_CODEC_ID_PCM_S16LE};
  std::string out;
  for (AVCodecID id : kIds) {
    if (!avcodec_find_decoder(id)) continue;
    if (!out.empty()) out += ",";
    out += avcodec_get_name(id);
  }
  return out;
}

}  // namespace stoker
