// BatchRing (NOTE [ Batch ring ]): in-order hand-off from producers that
// publish out of order, one claimer per position, the capacity bound,
// deadlines, close(), sequence words that wrap 2^32, and a many-thread stress
// test whose values TSan and the content checks watch.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "check.h"
#include "pipeline/batch_ring.h"
#include "test_threads.h"

using namespace stoker;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

/// A value large enough to be torn if a hand-off were not ordered.
struct Item {
  int64_t pos = -1;
  uint64_t a = 0, b = 0, c = 0;
};

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

Item make_item(int64_t p) {
  const uint64_t h = mix(static_cast<uint64_t>(p));
  return Item{p, h, ~h, h * 3 + 1};
}

bool intact(const Item& v, int64_t p) {
  const Item w = make_item(p);
  return v.pos == w.pos && v.a == w.a && v.b == w.b && v.c == w.c;
}

template <typename T>
using Wait = typename BatchRing<T>::Wait;

/// Waits without a deadline of its own: a long one, retried on timeout (for at
/// most two minutes: RETRY_WAITS).
template <typename T>
Wait<T> wait_ready(BatchRing<T>& r, int64_t p) {
  return RETRY_WAITS(Wait<T>::kTimeout, r.wait_ready(p, Clock::now() + 10s));
}
template <typename T>
Wait<T> wait_free(BatchRing<T>& r, int64_t p) {
  return RETRY_WAITS(Wait<T>::kTimeout, r.wait_free(p, Clock::now() + 10s));
}

/// `producers` threads take positions [first, first + count) from a shared
/// counter (so they publish out of order), with random pauses between claim
/// and publish; one consumer takes them in order and checks every value.
/// Checks the capacity bound at every claim.
void hand_off(int64_t first, int64_t count, int producers, size_t capacity, int spins) {
  BatchRing<Item> ring(capacity, spins, first);
  std::atomic<int64_t> next{first};
  std::atomic<int64_t> released{first};  // positions the consumer gave back (before release())
  std::atomic<int64_t> inversions{0};    // a position published before a lower one
  std::atomic<int64_t> last_published{first - 1};
  std::atomic<int> failures{0};
  const auto n = static_cast<int64_t>(capacity);

  std::vector<std::thread> threads;
  for (int t = 0; t < producers; ++t) {
    threads.emplace_back([&, t] {
      uint64_t rng = mix(static_cast<uint64_t>(t) + 1);
      for (;;) {
        const int64_t p = next.fetch_add(1, std::memory_order_relaxed);
        if (p >= first + count) return;
        if (wait_free(ring, p) != Wait<Item>::kOk) {
          failures.fetch_add(1);
          return;
        }
        if (!ring.try_claim(p)) {  // every position has exactly one producer here
          failures.fetch_add(1);
          return;
        }
        // The capacity bound: p's slot was free only after p - N was released.
        if (released.load(std::memory_order_relaxed) < p - n + 1) failures.fetch_add(1);
        rng = mix(rng);
        for (uint64_t i = 0, k = rng % 64; i < k; ++i) detail::cpu_relax();
        if ((rng >> 20) % 97 == 0) std::this_thread::yield();
        ring.at(p) = make_item(p);
        if (last_published.exchange(p, std::memory_order_relaxed) > p)
          inversions.fetch_add(1, std::memory_order_relaxed);
        ring.publish(p);
      }
    });
  }
  int64_t bad = 0;
  for (int64_t p = first; p < first + count; ++p) {
    if (wait_ready(ring, p) != Wait<Item>::kOk) {
      ++bad;
      break;
    }
    if (!intact(ring.at(p), p)) ++bad;
    ring.at(p) = Item{};
    released.store(p + 1, std::memory_order_relaxed);
    ring.release(p);
  }
  for (auto& t : threads) t.join();
  CHECK_EQ(bad, 0);
  CHECK_EQ(failures.load(), 0);
  CHECK(!ring.is_ready(first + count));
  std::printf(
      "  hand_off first=%lld count=%lld producers=%d capacity=%zu spins=%d: %lld "
      "out-of-order publishes\n",
      static_cast<long long>(first), static_cast<long long>(count), producers, capacity, spins,
      static_cast<long long>(inversions.load()));
}

// Published out of order on one thread: the consumer still takes positions in
// order, and a later position's readiness says nothing about an earlier one.
void in_order_hand_off() {
  BatchRing<int64_t> r(4);
  CHECK_EQ(r.capacity(), 4u);
  for (int64_t p = 0; p < 4; ++p) {
    CHECK(r.is_free(p));
    CHECK(r.try_claim(p));
    CHECK(!r.is_free(p));
    r.at(p) = 10 * p;
  }
  for (int64_t p : {3, 1, 2}) r.publish(p);
  CHECK(!r.is_ready(0));
  for (int64_t p : {1, 2, 3}) CHECK(r.is_ready(p));
  CHECK(r.wait_ready(0, Clock::now() + 10ms) == Wait<int64_t>::kTimeout);
  r.publish(0);
  for (int64_t p = 0; p < 4; ++p) {
    CHECK(r.wait_ready(p, Clock::now() + 1s) == Wait<int64_t>::kOk);
    CHECK_EQ(r.at(p), 10 * p);
    r.release(p);
    CHECK(!r.is_ready(p));
    CHECK(r.is_free(p + 4));  // the slot is free for the position N later
  }
  // A capacity of 0 is one slot.
  BatchRing<int> one(0);
  CHECK_EQ(one.capacity(), 1u);

  // Several producers, one consumer, both the spinning and the sleeping paths.
  hand_off(0, test::scaled(20000, 2000), 3, 4, 64);
  hand_off(0, test::scaled(20000, 2000), 3, 1, 0);
  hand_off(0, test::scaled(20000, 2000), 1, 2, 0);
}

// try_claim: of threads racing for the same position, exactly one wins; a
// late claim of a position already reused fails.
void one_claimer_per_position() {
  const int64_t rounds = test::scaled(20000, 500);
  constexpr int kThreads = 4;
  BatchRing<int> ring(1);
  std::vector<std::atomic<int>> wins(static_cast<size_t>(rounds));
  for (auto& w : wins) w.store(0);
  std::atomic<int> failures{0};
  std::atomic<int64_t> claimed{0};  // positions some thread has won
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t p = 0; p < rounds; ++p) {
        // Each thread tries every position once: as soon as it is claimable,
        // or (a slow thread) after another won it, when the try must fail.
        while (!ring.is_free(p) && claimed.load(std::memory_order_acquire) <= p)
          (void)ring.wait_free(p, Clock::now() + 1ms);
        if (ring.try_claim(p)) {
          claimed.store(p + 1, std::memory_order_release);
          wins[static_cast<size_t>(p)].fetch_add(1, std::memory_order_relaxed);
          ring.at(p) = t;
          ring.publish(p);
        }
      }
    });
  }
  for (int64_t p = 0; p < rounds; ++p) {
    if (wait_ready(ring, p) != Wait<int>::kOk) failures.fetch_add(1);
    ring.release(p);
  }
  for (auto& t : threads) t.join();
  CHECK_EQ(failures.load(), 0);
  for (int64_t p = 0; p < rounds; ++p) CHECK_EQ(wins[static_cast<size_t>(p)].load(), 1);
  // Positions behind the ring's current use cannot be claimed again.
  CHECK(!ring.try_claim(rounds - 1));
  CHECK(!ring.try_claim(0));
  CHECK(ring.try_claim(rounds));
}

// A producer of p >= consumed + N cannot claim: the slot still holds p - N.
void capacity_bound() {
  BatchRing<int> r(4);
  for (int64_t p = 0; p < 4; ++p) CHECK(r.try_claim(p));
  for (int64_t p = 4; p < 8; ++p) {
    CHECK(!r.is_free(p));
    CHECK(!r.try_claim(p));
  }
  const auto t0 = Clock::now();
  CHECK(r.wait_free(4, t0 + 20ms) == Wait<int>::kTimeout);
  CHECK(Clock::now() - t0 >= 20ms);
  r.publish(0);
  CHECK(!r.try_claim(4));  // published is not released
  CHECK(r.wait_free(4, Clock::now() + 5ms) == Wait<int>::kTimeout);
  CHECK(r.wait_ready(0, Clock::now() + 1s) == Wait<int>::kOk);
  CHECK(!r.try_claim(4));  // taken by the consumer is not released either
  r.release(0);
  CHECK(r.wait_free(4, Clock::now() + 1s) == Wait<int>::kOk);
  CHECK(!r.try_claim(5));  // 1 is still in flight
  CHECK(!r.try_claim(8));  // two laps ahead
  CHECK(r.try_claim(4));
  CHECK(!r.try_claim(4));  // one claimer
  CHECK(!r.try_claim(0));  // the old position is gone

  // A blocked producer wakes when the consumer releases.
  BatchRing<int> q(1);
  CHECK(q.try_claim(0));
  q.publish(0);
  std::atomic<bool> got{false};
  std::thread producer(
      [&] { got.store(q.wait_free(1, Clock::now() + 30s) == Wait<int>::kOk && q.try_claim(1)); });
  std::this_thread::sleep_for(20ms);
  CHECK(!got.load());
  CHECK(q.wait_ready(0, Clock::now() + 1s) == Wait<int>::kOk);
  q.release(0);
  producer.join();
  CHECK(got.load());
}

// A wait that times out returns at its deadline: not before, and not long after.
void deadlines() {
  BatchRing<int> r(2);
  CHECK(r.try_claim(0) && r.try_claim(1));
  double worst_late = 0;
  for (auto d : {1ms, 20ms, 50ms}) {
    for (int producer = 0; producer < 2; ++producer) {
      const auto t0 = Clock::now();
      const auto deadline = t0 + d;
      const auto w = producer ? r.wait_free(2, deadline) : r.wait_ready(0, deadline);
      const auto t1 = Clock::now();
      CHECK(w == Wait<int>::kTimeout);
      CHECK(t1 >= deadline);      // never early
      CHECK(t1 - deadline < 2s);  // and not asleep far past it
      worst_late = std::max(worst_late, std::chrono::duration<double>(t1 - deadline).count());
    }
  }
  // A deadline already past returns at once.
  const auto t0 = Clock::now();
  CHECK(r.wait_ready(0, t0 - 1s) == Wait<int>::kTimeout);
  CHECK(r.wait_free(2, Clock::time_point{}) == Wait<int>::kTimeout);
  CHECK(Clock::now() - t0 < 1s);
  std::printf("  deadlines: worst lateness %.2f ms\n", worst_late * 1e3);
}

// close() ends a consumer's and a producer's sleep promptly, and every later
// wait returns kClosed, even on a slot that changes afterwards.
void close_wakes_waiters() {
  constexpr int kRounds = 5;
  std::vector<double> latencies;
  for (int round = 0; round < kRounds; ++round) {
    BatchRing<int> r(3, round % 2 ? 0 : 64);
    for (int64_t p = 0; p < 3; ++p) CHECK(r.try_claim(p));
    r.publish(0);
    CHECK(r.wait_ready(0, Clock::now() + 1s) == Wait<int>::kOk);  // held by this thread
    std::atomic<int> consumer_result{-1}, producer_result{-1};
    Clock::time_point consumer_done{}, producer_done{};
    std::thread consumer([&] {
      consumer_result.store(static_cast<int>(r.wait_ready(1, Clock::now() + 30s)));
      consumer_done = Clock::now();
    });
    std::thread producer([&] {
      producer_result.store(static_cast<int>(r.wait_free(3, Clock::now() + 30s)));
      producer_done = Clock::now();
    });
    std::this_thread::sleep_for(50ms);  // both are asleep in the futex by now
    CHECK_EQ(consumer_result.load(), -1);
    CHECK_EQ(producer_result.load(), -1);
    const auto t_close = Clock::now();
    r.close();
    consumer.join();
    producer.join();
    CHECK(consumer_result.load() == static_cast<int>(Wait<int>::kClosed));
    CHECK(producer_result.load() == static_cast<int>(Wait<int>::kClosed));
    const double worst =
        std::chrono::duration<double>(std::max(consumer_done, producer_done) - t_close).count();
    CHECK(worst < 5.0);  // a lost wake would sleep to the 30 s deadline
    latencies.push_back(worst);

    // Later waits: closed at once, whatever the slot's state.
    CHECK(r.closed());
    const auto t0 = Clock::now();
    CHECK(r.wait_ready(0, t0 + 10s) == Wait<int>::kClosed);
    CHECK(r.wait_ready(1, t0 + 10s) == Wait<int>::kClosed);
    CHECK(r.wait_ready(7, t0 + 10s) == Wait<int>::kClosed);
    CHECK(r.wait_free(3, t0 + 10s) == Wait<int>::kClosed);
    CHECK(r.wait_free(4, t0 + 10s) == Wait<int>::kClosed);
    CHECK(!r.try_claim(3));
    CHECK(!r.is_ready(0));
    CHECK(!r.is_free(3));
    // A producer that claimed before close() publishes after it: the
    // consumer gets kClosed, not the batch.
    r.publish(2);
    CHECK(r.wait_ready(2, t0 + 10s) == Wait<int>::kClosed);
    // The consumer gives back what it took before close(): a producer
    // waiting for that slot still gets kClosed.
    r.release(0);
    CHECK(r.wait_free(3, t0 + 10s) == Wait<int>::kClosed);
    r.close();  // idempotent
    CHECK(r.wait_ready(2, t0 + 10s) == Wait<int>::kClosed);
    CHECK(Clock::now() - t0 < 5s);
  }
  std::sort(latencies.begin(), latencies.end());
  const double median = latencies[latencies.size() / 2];
  std::printf("  close: wake-up latency median %.2f ms, worst %.2f ms\n", median * 1e3,
              latencies.back() * 1e3);
  CHECK(median < 0.1);
}

// Sequence words are 4p + state mod 2^32: positions whose 4p wraps 2^32 (p
// near 2^30, and p past 2^32) hand off the same way.
void positions_wrap_the_sequence_word() {
  const int64_t k30 = int64_t{1} << 30, k32 = int64_t{1} << 32;
  for (int64_t first : {k30 - 37, 3 * k30 - 1000, k32 - 5, 5 * k32 + k30 - 3}) {
    const int64_t count = 5000;
    // The run crosses a multiple of 2^30, where 4p wraps.
    CHECK(static_cast<uint32_t>(4 * (first + count)) < static_cast<uint32_t>(4 * first));
    BatchRing<int64_t> r(7, 64, first);
    for (int64_t p = first; p < first + 7; ++p) CHECK(r.is_free(p));
    CHECK(!r.is_free(first + 7));
    CHECK(!r.try_claim(first + 7));
    CHECK(!r.try_claim(first - 1));
    // Single-threaded across the wrap, with the slots a full lap ahead.
    for (int64_t p = first; p < first + count; ++p) {
      CHECK(r.try_claim(p));
      CHECK(!r.try_claim(p + 7));
      r.at(p) = p;
      r.publish(p);
      CHECK(r.wait_ready(p, Clock::now() + 1s) == Wait<int64_t>::kOk);
      CHECK_EQ(r.at(p), p);
      r.release(p);
    }
    hand_off(first, count, 2, 3, 64);
  }
}

// Many positions through a small ring with several producers; every value
// arrives intact and in order. Bounded in time under the sanitizers.
void stress() {
  const int64_t n = test::scaled(1'500'000, 20'000);
  const auto t0 = Clock::now();
  hand_off(0, n, 3, 64, 64);
  hand_off(int64_t{1} << 30, n / 6, 2, 2, 0);
  std::printf("  stress: %.2f s\n", test::seconds_since(t0));
}

}  // namespace

TEST_MAIN(in_order_hand_off(); one_claimer_per_position(); capacity_bound(); deadlines();
          close_wakes_waiters(); positions_wrap_the_sequence_word(); stress())
