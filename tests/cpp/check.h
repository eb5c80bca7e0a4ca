// Minimal assertions for the C++ unit tests (run by ctest, also under
// sanitizers). A failed CHECK prints where and exits non-zero.
#pragma once

#include <chrono>
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

// Calls `wait` (a wait with a deadline of its own) again while it returns
// `timeout`, for at most two minutes: a wait that never ends fails the test at
// the line that waits, not at ctest's timeout with nothing said.
template <class F, class S>
S retry_waits(F wait, S timeout, const char* file, int line) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  for (;;) {
    const S s = wait();
    if (s != timeout) return s;
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "%s:%d: still waiting after two minutes\n", file, line);
      std::exit(1);
    }
  }
}

#define RETRY_WAITS(timeout, ...) \
  retry_waits([&] { return __VA_ARGS__; }, timeout, __FILE__, __LINE__)

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
