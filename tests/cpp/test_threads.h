// Helpers for the C++ tests of concurrent code: thread counts by name, polling
// for a condition with a limit, and how much stress a build can afford.
#pragma once

#include <dirent.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace stoker::test {

/// Threads of this process whose name (comm) starts with `prefix`. A joined
/// thread can still be listed for a moment (the kernel reaps its task after
/// join() returns), so check that threads are gone with eventually().
inline int threads_named(const std::string& prefix) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string comm;
    std::getline(f, comm);
    if (comm.compare(0, prefix.size(), prefix) == 0) ++n;
  }
  closedir(d);
  return n;
}

/// Threads of this process.
inline int threads_alive() { return threads_named(""); }

/// Polls `pred` until it holds or `limit` passes; returns its last value.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

enum class Sanitizer { kNone, kAddress, kThread };

inline constexpr Sanitizer sanitizer() {
#if defined(__SANITIZE_THREAD__)
  return Sanitizer::kThread;
#elif defined(__SANITIZE_ADDRESS__)
  return Sanitizer::kAddress;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  return Sanitizer::kThread;
#elif __has_feature(address_sanitizer)
  return Sanitizer::kAddress;
#else
  return Sanitizer::kNone;
#endif
#else
  return Sanitizer::kNone;
#endif
}

/// STOKER_STRESS_SCALE if set (e.g. 10 for a longer local soak), else 1.
inline double env_scale() {
  if (const char* env = std::getenv("STOKER_STRESS_SCALE")) {
    const double f = std::atof(env);
    if (f > 0) return f;
  }
  return 1.0;
}

/// How much of a stress test this build runs: 1 for a plain build, less under
/// the sanitizers (TSan runs such code 5-15x slower), times env_scale().
inline double stress_scale() {
  const double s = sanitizer() == Sanitizer::kThread    ? 0.2
                   : sanitizer() == Sanitizer::kAddress ? 0.5
                                                        : 1.0;
  return s * env_scale();
}

inline int64_t scaled(int64_t n, int64_t at_least = 1) {
  const auto v = static_cast<int64_t>(static_cast<double>(n) * stress_scale());
  return v < at_least ? at_least : v;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace stoker::test
