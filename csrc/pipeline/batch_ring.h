// The ordered hand-off of batches: a ring of N slots in which position p (the
// p-th batch of a stream) lives in slot p % N. Producers fill positions in any
// order, the one consumer takes them strictly in order, and at most N
// positions are in flight. Used twice: workers -> consumer (or copy thread),
// and copy thread -> consumer.
//
// NOTE [ Batch ring ]
// Each slot has one 32-bit sequence word, seq = 4p + state (mod 2^32):
//
//   4p + 0  free for p      --try_claim(p)-->  4p + 1  claimed (being filled)
//   4p + 1  claimed         --publish(p)---->  4p + 2  ready
//   4p + 2  ready           --release(p)---->  4(p+N)  free for p + N
//
// A position's owner is whoever moved it out of "free" (one CAS, so exactly one
// claimer); it fills the slot's value and publishes with a release store; the
// consumer reads with acquire, so it sees everything written before publish().
// Nothing else guards the value: no mutex on any path. A producer asks about
// position p only while p < consumed + N, and a slot's word moves by 4N per
// reuse, so comparing words modulo 2^32 is exact.
//
// Waiting spins briefly, then sleeps on the slot's word with a futex and a
// deadline (common/detail/futex.h): the caller returns to check for signals or stop
// flags, and nothing sleep-polls. A waker issues the wake syscall only when
// some thread announced that it sleeps (a Dekker pair of seq_cst accesses on
// the word and the waiter count, so no wake is lost). close() writes every
// word, which fails or ends every sleep at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#include "common/cache_line.h"
#include "common/detail/futex.h"

namespace stoker {

template <typename T>
class BatchRing {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Wait { kOk, kTimeout, kClosed };

  /// @param capacity slots (>= 1): positions that can be in flight at once
  /// @param spins busy-wait iterations before a wait sleeps
  /// @param first the first position (>= 0); positions before it count as released
  explicit BatchRing(size_t capacity, int spins = 64, int64_t first = 0)
      : n_(capacity < 1 ? 1 : capacity), spins_(spins), slots_(new Slot[n_]) {
    for (size_t i = 0; i < n_; ++i) {
      const int64_t p = first + static_cast<int64_t>(i);
      slots_[index(p)].seq.store(seq(p, kFree), std::memory_order_relaxed);
    }
  }
  BatchRing(const BatchRing&) = delete;
  BatchRing& operator=(const BatchRing&) = delete;

  size_t capacity() const { return n_; }

  /// The value of position p's slot. The claimer owns it from try_claim() to
  /// publish(); the consumer from a successful wait_ready() to release().
  T& at(int64_t p) { return slots_[index(p)].value; }
  const T& at(int64_t p) const { return slots_[index(p)].value; }

  // -- producers ----------------------------------------------------------

  /// True when position p's slot is free for p (the consumer released p - N).
  bool is_free(int64_t p) const { return word(p) == seq(p, kFree); }

  /// Claims position p if its slot is free for it. One caller wins.
  [[nodiscard]] bool try_claim(int64_t p) {
    uint32_t want = seq(p, kFree);
    return slots_[index(p)].seq.compare_exchange_strong(
        want, seq(p, kClaimed), std::memory_order_acquire, std::memory_order_relaxed);
  }

  /// Waits until position p's slot is free for p, up to `deadline`.
  Wait wait_free(int64_t p, Clock::time_point deadline) {
    return wait(p, seq(p, kFree), producer_waiters_, deadline);
  }

  /// Hands claimed position p to the consumer.
  void publish(int64_t p) { store_and_wake(p, seq(p, kReady), consumer_waiters_); }

  // -- the consumer ---------------------------------------------------------

  bool is_ready(int64_t p) const { return word(p) == seq(p, kReady); }

  /// Waits until position p is published, up to `deadline`.
  Wait wait_ready(int64_t p, Clock::time_point deadline) {
    return wait(p, seq(p, kReady), consumer_waiters_, deadline);
  }

  /// Gives position p's slot back for position p + N.
  void release(int64_t p) {
    store_and_wake(p, seq(p + static_cast<int64_t>(n_), kFree), producer_waiters_);
  }

  // -- both -----------------------------------------------------------------

  /// Ends every wait, now and later, with kClosed. Idempotent, any thread.
  void close() {
    closed_.store(true, std::memory_order_seq_cst);
    for (size_t i = 0; i < n_; ++i) {
      // A word no waiter expects: a sleep that has not started yet fails at
      // once, and one that has is woken below.
      slots_[i].seq.fetch_or(3, std::memory_order_seq_cst);
      detail::futex_wake(slots_[i].seq);
    }
  }
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  static constexpr uint32_t kFree = 0, kClaimed = 1, kReady = 2;

  struct alignas(kCacheLineSize) Slot {
    std::atomic<uint32_t> seq{0};
    T value{};
  };

  size_t index(int64_t p) const { return static_cast<size_t>(p) % n_; }
  static uint32_t seq(int64_t p, uint32_t state) {
    return static_cast<uint32_t>(static_cast<uint64_t>(p) * 4 + state);
  }
  uint32_t word(int64_t p) const { return slots_[index(p)].seq.load(std::memory_order_acquire); }

  void store_and_wake(int64_t p, uint32_t value, std::atomic<int>& waiters) {
    std::atomic<uint32_t>& w = slots_[index(p)].seq;
    w.store(value, std::memory_order_seq_cst);
    if (waiters.load(std::memory_order_seq_cst) > 0) detail::futex_wake(w);
  }

  Wait wait(int64_t p, uint32_t want, std::atomic<int>& waiters, Clock::time_point deadline) {
    std::atomic<uint32_t>& w = slots_[index(p)].seq;
    // After close(), a publish() or release() that was under way rewrites a
    // word: the flag, read after the word (seq_cst, so it sees close()'s
    // store), keeps such a wait closed.
    for (int i = 0; i < spins_; ++i) {
      if (w.load(std::memory_order_seq_cst) == want)
        return closed_.load(std::memory_order_seq_cst) ? Wait::kClosed : Wait::kOk;
      detail::cpu_relax();
    }
    waiters.fetch_add(1, std::memory_order_seq_cst);
    Wait result;
    for (;;) {
      const uint32_t cur = w.load(std::memory_order_seq_cst);
      if (closed_.load(std::memory_order_seq_cst)) {
        result = Wait::kClosed;
        break;
      }
      if (cur == want) {
        result = Wait::kOk;
        break;
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        result = Wait::kTimeout;
        break;
      }
      detail::futex_wait(w, cur, deadline - now);
    }
    waiters.fetch_sub(1, std::memory_order_relaxed);
    // No fence here: the seq_cst load of `w` that saw `want` is the acquire that
    // pairs with publish()/release() (and TSan does not model fences).
    return result;
  }

  const size_t n_;
  const int spins_;
  std::unique_ptr<Slot[]> slots_;
  alignas(kCacheLineSize) std::atomic<int> consumer_waiters_{0};
  alignas(kCacheLineSize) std::atomic<int> producer_waiters_{0};
  alignas(kCacheLineSize) std::atomic<bool> closed_{false};
};

static_assert(sizeof(std::atomic<uint32_t>) == 4, "the sequence word is a futex word");

}  // namespace stoker
