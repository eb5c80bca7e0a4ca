// Bounded single-producer single-consumer queue, lock-free.
//
// The producer owns tail_, the consumer head_. Each side loads its own index
// relaxed and the other's with acquire, publishes with release, and caches
// the other side's index so the common case touches one shared line.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <new>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace stoker {

constexpr size_t kCacheLineSize = 64;

template <typename T>
class SpscQueue {
 public:
  /// @param capacity number of elements the queue holds (>= 1)
  explicit SpscQueue(size_t capacity) : capacity_(capacity + 1), slots_(capacity_) {}

  SpscQueue(const SpscQueue&) = delete;
  SpscQueue& operator=(const SpscQueue&) = delete;

  /// Producer: enqueue if there is room. @return false when full.
  template <typename U>
  [[nodiscard]] bool try_push(U&& v) {
    const size_t tail = tail_.load(std::memory_order_relaxed);
    const size_t next = tail + 1 == capacity_ ? 0 : tail + 1;
    if (next == head_cache_) {
      head_cache_ = head_.load(std::memory_order_acquire);
      if (next == head_cache_) return false;
    }
    slots_[tail].emplace(std::forward<U>(v));
    tail_.store(next, std::memory_order_release);
    return true;
  }

  /// Consumer: dequeue if not empty.
  [[nodiscard]] bool try_pop(T& out) {
    const size_t head = head_.load(std::memory_order_relaxed);
    if (head == tail_cache_) {
      tail_cache_ = tail_.load(std::memory_order_acquire);
      if (head == tail_cache_) return false;
    }
    out = std::move(*slots_[head]);
    slots_[head].reset();
    head_.store(head + 1 == capacity_ ? 0 : head + 1, std::memory_order_release);
    return true;
  }

  /// Producer: blocks (spin, then sleep) until pushed or `stop` becomes true.
  /// @return false if stopped before the element went in.
  template <typename U>
  bool push(U&& v, const std::atomic<bool>& stop) {
    for (int spins = 0;; ++spins) {
      if (try_push(std::forward<U>(v))) return true;
      if (stop.load(std::memory_order_acquire)) return false;
      backoff(spins);
    }
  }

  /// Consumer: blocks until an element arrives or `stop` becomes true.
  bool pop(T& out, const std::atomic<bool>& stop) {
    for (int spins = 0;; ++spins) {
      if (try_pop(out)) return true;
      if (stop.load(std::memory_order_acquire)) return false;
      backoff(spins);
    }
  }

  /// Approximate number of elements (exact when called by either side alone).
  size_t size() const {
    const size_t h = head_.load(std::memory_order_acquire);
    const size_t t = tail_.load(std::memory_order_acquire);
    return t >= h ? t - h : t + capacity_ - h;
  }
  size_t capacity() const { return capacity_ - 1; }

 private:
  static void backoff(int spins) {
    if (spins < 64) return;
    if (spins < 256) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 1024 ? 20 : 200));
  }

  const size_t capacity_;
  std::vector<std::optional<T>> slots_;
  alignas(kCacheLineSize) std::atomic<size_t> head_{0};
  alignas(kCacheLineSize) size_t tail_cache_ = 0;  // consumer's copy of tail_
  alignas(kCacheLineSize) std::atomic<size_t> tail_{0};
  alignas(kCacheLineSize) size_t head_cache_ = 0;  // producer's copy of head_
  char pad_[kCacheLineSize - sizeof(size_t)];
};

static_assert(alignof(SpscQueue<int>) >= kCacheLineSize,
              "head and tail must be a cache line apart to prevent false sharing");

}  // namespace stoker
