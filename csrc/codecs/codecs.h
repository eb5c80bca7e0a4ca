// Which image codecs this build of the core has. With the CMake option
// STOKER_WITH_IMAGES=OFF the core is built without libjpeg-turbo and libpng
// (codecs_disabled.cpp stands in for the decoders), for users who load only
// arrays and tokens; using an image field then fails with a clear error.
#pragma once

#include <string>

namespace stoker {

/// True when the JPEG and PNG decoders are built in.
bool have_image_codecs();

/// Throws stoker::Error saying that this build has no image support and how to
/// get one; does nothing when the codecs are built in.
void require_image_codecs();

/// The codecs' versions, e.g. "libjpeg-turbo 2.1.5, libpng 1.6.39" (libpng's
/// as loaded at run time), or "none" without them.
std::string image_codec_versions();

}  // namespace stoker
