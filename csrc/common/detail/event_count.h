// An event count: lets threads sleep until "something may have changed"
// without losing a wake-up. A waiter reads the count, looks for work, and
// sleeps only if the count is still what it read; a notifier bumps the count
// (so a sleep about to start fails at once) and issues the wake syscall only
// when someone sleeps.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/detail/futex.h"

namespace stoker::detail {

class EventCount {
 public:
  using Clock = std::chrono::steady_clock;

  /// The count to pass to wait(), read before looking for work.
  uint32_t prepare() const { return word_.load(std::memory_order_seq_cst); }

  /// Sleeps until notify() is called after prepare() returned `seen`, or `deadline`.
  void wait(uint32_t seen, Clock::time_point deadline) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    while (word_.load(std::memory_order_seq_cst) == seen) {
      const auto now = Clock::now();
      if (now >= deadline) break;
      futex_wait(word_, seen, deadline - now);
    }
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }

  /// Wakes every sleeper; a wait() whose prepare() came before this returns.
  void notify() {
    word_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake(word_);
  }

 private:
  std::atomic<uint32_t> word_{0};
  std::atomic<int> sleepers_{0};
};

}  // namespace stoker::detail
