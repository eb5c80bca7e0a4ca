// STOKER_MULTIVERSION: a loop compiled for AVX2 and for the baseline, the best
// picked at load time (GCC's function multi-versioning), so the wheel stays
// portable. Sanitizer builds define STOKER_NO_MULTIVERSION: the IFUNC
// resolvers run before a sanitizer runtime is up.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(STOKER_NO_MULTIVERSION)
#define STOKER_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define STOKER_MULTIVERSION
#endif
