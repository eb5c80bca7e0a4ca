// Which media codecs this build of the core has. With the CMake option
// STOKER_WITH_VIDEO=OFF the core is built without FFmpeg (media_disabled.cpp
// stands in for the decoders), and using a stoker.video() or stoker.audio()
// field fails with a clear error, as image fields do without the image codecs.
#pragma once

#include <string>

namespace stoker {

/// True when FFmpeg's decoders are built in.
bool have_media_codecs();

/// Throws stoker::Error saying that this build has no video and audio support
/// and how to get one; does nothing when FFmpeg is built in.
void require_media_codecs();

/// FFmpeg's library versions as loaded, e.g. "libavcodec 59.37.100, ...", or "none".
std::string media_codec_versions();

/// The names of the video and audio decoders this FFmpeg has, among those the
/// fields are documented for (h264, hevc, vp9, av1, ...; tests ask which to cover).
std::string media_decoders();

}  // namespace stoker
