#!/usr/bin/env bash
# Builds the FFmpeg the wheel carries: decoders, demuxers and parsers only, for the video and
# audio fields' formats, from Debian's source package of the FFmpeg the system has (5.1 on
# Debian 12), as static PIC libraries linked into stoker._core. AV1 decodes with libdav1d
# (the system's shared library, which auditwheel then bundles). Why not the system's own
# libraries: Debian's libavcodec and libavformat link 130 other libraries (every encoder,
# network protocols, hardware APIs, subtitle renderers), 167 MB that auditwheel would copy
# into the wheel; this build is a few MB (README, "The wheel").
#
#   bash scripts/build-ffmpeg.sh        # -> build/ffmpeg-min/{include,lib}; about 3 min on 2 cores
#
# scripts/build-wheel.sh runs it (once: the result is kept) and builds against it. The
# README's test command does not: a source build there uses the system's FFmpeg.
# Needs: deb-src access to Debian's archive (added here as its own list), dpkg-dev, nasm,
# libdav1d-dev, a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/build/ffmpeg-min"
[ -f "$out/lib/libavcodec.a" ] && { echo "build-ffmpeg: $out is there"; exit 0; }

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
src_list=/etc/apt/sources.list.d/stoker-deb-src.sources
if ! apt-get source --print-uris ffmpeg >/dev/null 2>&1; then
  # the archives the system already uses, as source lists
  for f in /etc/apt/sources.list.d/*.sources; do
    [ "$f" = "$src_list" ] || sed -n 's/^Types: deb$/Types: deb-src/; p' "$f"
    echo
  done | $sudo tee "$src_list" >/dev/null
  $sudo apt-get update -q
fi
command -v dpkg-source >/dev/null || $sudo apt-get install -y -q --no-install-recommends dpkg-dev
command -v nasm >/dev/null || $sudo apt-get install -y -q --no-install-recommends nasm
[ -f /usr/include/dav1d/dav1d.h ] || \
  $sudo apt-get install -y -q --no-install-recommends libdav1d-dev

work="$PWD/build/ffmpeg-src"
rm -rf "$work" && mkdir -p "$work"
(cd "$work" && apt-get source -q ffmpeg >/dev/null)
dir=$(ls -d "$work"/ffmpeg-*/ | head -n 1)
version=$(basename "$dir")
echo "build-ffmpeg: $version, decoders only, into $out"
cd "$dir"
# The fields' formats (docs/video.md): video H.264, H.265, VP8, VP9, AV1 (libdav1d), MPEG-4
# part 2; audio AAC, MP3, Opus, Vorbis, FLAC, PCM; containers mp4/mov, Matroska/WebM, AVI,
# MPEG-TS, Ogg, WAV, FLAC, MP3, ADTS AAC.
./configure --prefix="$out" --enable-static --disable-shared --enable-pic \
  --disable-programs --disable-doc --disable-network --disable-everything \
  --disable-avdevice --disable-avfilter --disable-postproc --disable-autodetect \
  --enable-avformat --enable-avcodec --enable-swscale --enable-swresample \
  --enable-libdav1d --enable-protocol=file \
  --enable-decoder=h264,hevc,vp8,vp9,libdav1d,mpeg4,aac,mp3float,mp3,opus,vorbis,flac \
  --enable-decoder='pcm_s16le,pcm_s16be,pcm_s24le,pcm_s32le,pcm_f32le,pcm_f64le,pcm_u8,pcm_alaw,pcm_mulaw' \
  --enable-demuxer=mov,matroska,avi,mpegts,ogg,wav,flac,mp3,aac \
  --enable-parser=h264,hevc,vp8,vp9,av1,mpeg4video,aac,mpegaudio,opus,vorbis,flac \
  --enable-bsf=vp9_superframe_split,av1_frame_split >/dev/null
make -j"$(nproc)" >/dev/null
make install >/dev/null
echo "build-ffmpeg: done: $(du -sh "$out/lib" | cut -f1) of static libraries"
