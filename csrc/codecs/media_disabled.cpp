// Built instead of media.cpp, video_decoder.cpp, audio_decoder.cpp and
// detail/ffmpeg.cpp when STOKER_WITH_VIDEO=OFF: the same functions, each
// refusing with the reason. Records still parse (media_record.cpp needs no
// codec), so a dataset with media fields opens and its other fields load.
#include "codecs/audio_decoder.h"
#include "codecs/media.h"
#include "codecs/video_decoder.h"
#include "common/error.h"

namespace stoker {

bool have_media_codecs() { return false; }

void require_media_codecs() {
  STOKER_THROW(Error,
               "this build of stoker has no video and audio support (built with "
               "-DSTOKER_WITH_VIDEO=OFF), so stoker.video() and stoker.audio() fields cannot be "
               "decoded; install the stoker wheel, or build from source with FFmpeg's libraries "
               "(the default; scripts/install-deps.sh installs them)");
}

std::string media_codec_versions() { return "none"; }

std::string media_decoders() { return ""; }

std::vector<uint8_t> make_video_record(const uint8_t*, size_t) {
  require_media_codecs();
  return {};
}

void decode_video_frames(const VideoRecord&, const int32_t*, size_t, size_t, const VideoFrameSink&,
                         int64_t*) {
  require_media_codecs();
}

std::vector<uint8_t> make_audio_record(const uint8_t*, size_t) {
  require_media_codecs();
  return {};
}

int64_t decode_audio(const AudioRecord&, int64_t, int64_t, int, int, float*, int64_t, int64_t*) {
  require_media_codecs();
  return 0;
}

}  // namespace stoker
