// SpscQueue: semantics, and a two-thread stress test that TSan checks.
#include <atomic>
#include <thread>

#include "check.h"
#include "pipeline/spsc_queue.h"

using namespace stoker;

static void single_thread() {
  SpscQueue<int> q(3);
  int v;
  CHECK(!q.try_pop(v));
  CHECK(q.try_push(1));
  CHECK(q.try_push(2));
  CHECK(q.try_push(3));
  CHECK(!q.try_push(4));
  CHECK_EQ(q.size(), 3u);
  CHECK(q.try_pop(v) && v == 1);
  CHECK(q.try_push(4));
  for (int want : {2, 3, 4}) CHECK(q.try_pop(v) && v == want);
  CHECK_EQ(q.size(), 0u);
}

static void two_threads_keep_order() {
  SpscQueue<uint64_t> q(64);
  std::atomic<bool> stop{false};
  constexpr uint64_t kN = 2'000'000;
  std::thread producer([&] {
    for (uint64_t i = 0; i < kN; ++i) CHECK(q.push(i, stop));
  });
  uint64_t v, expect = 0;
  while (expect < kN) {
    CHECK(q.pop(v, stop));
    CHECK_EQ(v, expect);
    ++expect;
  }
  producer.join();
}

static void stop_unblocks() {
  SpscQueue<int> q(1);
  std::atomic<bool> stop{false};
  int v;
  std::thread t([&] { CHECK(!q.pop(v, stop)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.store(true, std::memory_order_release);
  t.join();
}

TEST_MAIN(single_thread(); two_threads_keep_order(); stop_unblocks())
