// Minimal assertions for the C++ unit tests (run by ctest, also under
// sanitizers). A failed CHECK prints where and exits non-zero.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

#define CHECK_EQ(a, b) CHECK((a) == (b))

#define CHECK_THROWS(Type, expr)                                                              \
  do {                                                                                        \
    bool thrown_ = false;                                                                     \
    try {                                                                                     \
      expr;                                                                                   \
    } catch (const Type&) {                                                                   \
      thrown_ = true;                                                                         \
    }                                                                                         \
    if (!thrown_) {                                                                           \
      std::fprintf(stderr, "%s:%d: expected %s from %s\n", __FILE__, __LINE__, #Type, #expr); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

#define TEST_MAIN(...)                                            \
  int main() {                                                    \
    try {                                                         \
      __VA_ARGS__;                                                \
    } catch (const std::exception& e) {                           \
      std::fprintf(stderr, "uncaught exception: %s\n", e.what()); \
      return 1;                                                   \
    }                                                             \
    std::printf("all checks passed\n");                           \
    return 0;                                                     \
  }
