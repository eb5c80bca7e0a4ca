// A mutex whose lock gives up at a deadline: an atomic word and the futex
// (common/detail/futex.h), like the ring's waits.
//
// Not std::timed_mutex: its try_lock_until() on the steady clock calls
// pthread_mutex_clocklock, which ThreadSanitizer does not intercept
// (google/sanitizers#1620, llvm-project#62623). TSan then sees every unlock as
// "of an unlocked mutex" and misses the order the lock gives, so each test
// that calls next() fails under TSan. Destroying this one in a forked child
// waits for nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/detail/futex.h"

namespace stoker::detail {

class TimedMutex {
 public:
  using Clock = std::chrono::steady_clock;

  TimedMutex() = default;
  TimedMutex(const TimedMutex&) = delete;
  TimedMutex& operator=(const TimedMutex&) = delete;

  [[nodiscard]] bool try_lock() {
    uint32_t free = kFree;
    return word_.compare_exchange_strong(free, kLocked, std::memory_order_acquire,
                                         std::memory_order_relaxed);
  }

  template <typename Duration>
  [[nodiscard]] bool try_lock_until(const std::chrono::time_point<Clock, Duration>& deadline) {
    if (try_lock()) return true;
    // Mark the word contended before sleeping, so that unlock() wakes a
    // sleeper; finding it free this way takes the lock (a spare wake at most).
    while (word_.exchange(kContended, std::memory_order_acquire) != kFree) {
      const auto now = Clock::now();
      if (now >= deadline) return false;
      futex_wait(word_, kContended, deadline - now);
    }
    return true;
  }

  void lock() {
    while (!try_lock_until(Clock::now() + std::chrono::hours(1))) {
    }
  }

  void unlock() {
    if (word_.exchange(kFree, std::memory_order_release) == kContended) futex_wake(word_, 1);
  }

 private:
  static constexpr uint32_t kFree = 0, kLocked = 1, kContended = 2;
  std::atomic<uint32_t> word_{kFree};
};

}  // namespace stoker::detail
