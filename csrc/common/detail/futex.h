// Sleeping on a 32-bit atomic with a deadline: the Linux futex, which
// std::atomic::wait uses underneath but without a timeout. Every blocking wait
// in the pipeline goes through here, so no wait is unbounded (Ctrl-C, stop
// flags and forked children are checked between slices) and nothing polls.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace stoker::detail {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "the futex word must be a plain 32-bit integer");

/// Sleeps while `*word == expected`, at most `timeout`. Returns on a wake, a
/// change, a timeout, a signal or spuriously: callers re-check their condition.
inline void futex_wait(const std::atomic<uint32_t>& word, uint32_t expected,
                       std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts,
            nullptr, 0);
}

/// Wakes up to `n` threads sleeping on `word`.
inline void futex_wake(const std::atomic<uint32_t>& word, int n = INT_MAX) {
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAKE_PRIVATE, n, nullptr,
            nullptr, 0);
}

/// A CPU hint for spin loops.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace stoker::detail
