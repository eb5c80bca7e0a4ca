// Built only into the wheel's extension, with FFmpeg linked in statically
// (STOKER_FFMPEG_ROOT): FFmpeg calls hypot(), which glibc 2.35 gave a new
// symbol version; bound to it, the wheel would need glibc 2.35 and miss its
// manylinux_2_34 tag. The linker's --wrap=hypot sends FFmpeg's calls here,
// to the same function under its first version (the results are the same).
extern "C" double stoker_hypot_first(double x, double y);
__asm__(".symver stoker_hypot_first,hypot@GLIBC_2.2.5");

extern "C" double __wrap_hypot(double x, double y) { return stoker_hypot_first(x, y); }
