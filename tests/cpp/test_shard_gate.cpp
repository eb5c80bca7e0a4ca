// The shard gate of a remote dataset (format/shard_gate.h), the fetch plan
// that drives it (sampler/fetch_plan.h), and the format layer's locks across
// fork (format/detail/fork_locks.h).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "common/stop_flag.h"
#include "format/dataset.h"
#include "sampler/fetch_plan.h"
#include "test_util.h"

using namespace stoker;

namespace {

int64_t label_of(const Dataset& ds, int64_t i) {
  std::vector<RecordView> f(3);
  const Dataset::Location loc = ds.locate(i);
  const Dataset::ShardPin held = ds.pin(loc.shard);
  ds.read(loc, f.data());
  int64_t v;
  std::memcpy(&v, f[1].data, 8);
  return v;
}

std::vector<int64_t> shard_bytes(const Dataset& ds) {
  std::vector<int64_t> b;
  for (size_t s = 0; s < ds.num_shards(); ++s) b.push_back(ds.shard_info(s).bytes);
  return b;
}

void wait_for_demand(const Dataset& ds, size_t s) {
  for (int i = 0; i < 200000; ++i) {
    for (size_t d : ds.demands())
      if (d == s) return;
    std::this_thread::yield();
  }
  CHECK(!"no demand came");
}

}  // namespace

// NOTE [ Deferred shards ]: a failure reaches every reader that waited for the
// download, even when the shard is reset before the reader wakes; demands come
// in the order readers asked.
static void failures_reach_waiters_through_a_reset() {
  auto shards = test::write_shards(test::temp_dir(), 30, 10);
  Dataset::Options opts;
  opts.deferred = true;
  Dataset ds(test::test_schema(), shards, opts);
  std::atomic<bool> stop{false};
  std::atomic<int> outcome{0};
  std::thread t([&] {
    const ScopedStop bound(&stop);
    try {
      (void)label_of(ds, 25);
      outcome = 1;
    } catch (const FetchError& e) {
      outcome = std::strcmp(e.what(), "https://host/s2: HTTP 503") == 0 ? 2 : -2;
    }
  });
  wait_for_demand(ds, 2);
  ds.fail(2, "https://host/s2: HTTP 503");
  CHECK(ds.reset(2));  // at once: the waiting reader still gets the failure
  t.join();
  CHECK_EQ(outcome.load(), 2);
  CHECK(ds.gate()->state(2) == ShardGate::kPending);

  // Demand order: first asked, first listed.
  std::vector<std::thread> readers;
  for (int64_t i : {25, 5, 15}) {
    const size_t s = static_cast<size_t>(i / 10);
    readers.emplace_back([&, i] {
      const ScopedStop bound(&stop);
      try {
        (void)label_of(ds, i);
      } catch (const Error&) {
      }
    });
    wait_for_demand(ds, s);
  }
  CHECK(ds.demands() == (std::vector<size_t>{2, 0, 1}));
  for (size_t s : {0, 1, 2}) ds.provide(s);
  for (auto& r : readers) r.join();
  CHECK(ds.demands().empty() && ds.gate()->provided_count() == 3);
}

// NOTE [ Fetch plan ]: in use first (demands, holds, pins), then the followers'
// schedules within the budget; provided shards not walked are given back.
static void fetch_plan_keeps_what_is_in_use_and_the_window() {
  auto shards = test::write_shards(test::temp_dir(), 60, 10);  // 6 shards of 10
  Dataset::Options opts;
  opts.releasable = true;
  auto ds = std::make_shared<Dataset>(test::test_schema(), shards, opts);
  const std::vector<int64_t> bytes = shard_bytes(*ds);
  FetchPlan plan(ds, bytes);
  std::vector<int64_t> records(6, 10);
  std::atomic<int> orders{0};
  std::atomic<int64_t> offset{25};
  std::atomic<bool> alive{true};
  FetchPlan::Follower f;
  f.position = [&]() -> std::optional<ReadPosition> {
    if (!alive) return std::nullopt;
    return ReadPosition{0, offset.load(), 1};
  };
  f.order = [&](uint64_t epoch, int64_t world) {
    ++orders;
    SamplerOptions so;
    so.batch_size = 4;
    return EpochOrder(std::span<const int64_t>(records), so, epoch, 0, world, 0);
  };
  plan.follow(1, f);
  CHECK_EQ(plan.followers(), 1u);
  for (size_t s : {0, 1, 2}) ds->provide(s);
  const int64_t three = bytes[2] + bytes[3] + bytes[4];
  FetchPlan::Options o;
  for (size_t s = 0; s < 6; ++s) CHECK_EQ(bytes[s], bytes[0]);  // equal shards
  o.budget = 5 * bytes[0];
  FetchPlan::Turn t = plan.turn(o);
  // From offset 25 (shard 2) on: 2, 3, 4, 5, then the next epoch's 0 fit; only 1 (not
  // walked) goes back, and only as much as the coming shards need.
  CHECK(t.fetch == (std::vector<size_t>{3, 4, 5}) && t.released == (std::vector<size_t>{1}));
  ds->provide(1);
  o.budget = three;
  t = plan.turn(o);
  // 2, 3, 4 fit; 0 and 1 go back to make room for 3 and 4.
  CHECK(t.fetch == (std::vector<size_t>{3, 4}) && t.urgent == 0);
  CHECK(t.released == (std::vector<size_t>{0, 1}) || t.released == (std::vector<size_t>{1, 0}));
  CHECK(t.following && t.wanted_bytes == three && t.must_bytes == 0);
  CHECK(ds->gate()->state(0) == ShardGate::kPending && !ds->is_mapped(0));
  // A pinned shard stays, whatever the budget; a download in flight is not fetched again.
  ds->provide(0);
  {
    const Dataset::ShardPin held = ds->pin(0);
    o.inflight = {3};
    t = plan.turn(o);
    // 0 (in use), 2, 3 (in flight) fill the budget: 4 waits for room.
    CHECK(t.must_bytes == bytes[0] && t.fetch.empty());
    CHECK(t.released.empty() && ds->is_mapped(0));
  }
  o.inflight.clear();
  // A demand comes first, and counts as in use.
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    const ScopedStop bound(&stop);
    CHECK_EQ(label_of(*ds, 57), 57);
  });
  wait_for_demand(*ds, 5);
  t = plan.turn(o);
  CHECK(t.urgent == 1 && t.fetch.front() == 5);
  ds->provide(5);
  reader.join();
  // Holds come first too.
  o.holds = {1};
  t = plan.turn(o);
  CHECK(t.urgent == 1 && t.fetch.front() == 1);
  o.holds.clear();
  // The epoch order is built once per epoch, not per turn.
  const int before = orders.load();
  for (int k = 0; k < 20; ++k) (void)plan.turn(o);
  CHECK_EQ(orders.load(), before);
  // Near the end of the epoch, the next one's start follows.
  for (size_t s = 0; s < 6; ++s) (void)ds->try_release(s);
  ds->provide(5);
  offset = 55;
  o.budget = bytes[5] + bytes[0] + bytes[1];
  t = plan.turn(o);
  CHECK(t.fetch == (std::vector<size_t>{0, 1}) && t.released.empty());
  CHECK_EQ(orders.load(), before);  // epoch 1's order was built once, at the first turn
  // No budget: nothing is given back, and shards are fetched ahead up to max_fetch.
  o.budget = -1;
  o.max_fetch = 2;
  t = plan.turn(o);
  CHECK(t.released.empty() && t.fetch.size() == 2);
  // A follower that is gone is dropped.
  alive = false;
  t = plan.turn(o);
  CHECK(!t.following && plan.followers() == 0);
}

// NOTE [ Locks across fork ]: a fork while other threads map and release
// shards (holding the dataset's stripes and the registry of mappings) leaves
// the child able to read and to exit; each child runs under an alarm, so a
// lock inherited held fails the test instead of hanging it.
static void fork_while_mapping_never_hangs_the_child() {
  auto shards = test::write_shards(test::temp_dir(), 80, 10);
  Dataset::Options opts;
  opts.releasable = true;
  Dataset ds(test::test_schema(), shards, opts);
  for (size_t s = 0; s < 8; ++s) ds.provide(s);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  test::UnexpectedErrors unexpected;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      const ScopedStop bound(&stop);
      uint64_t x = 99 + static_cast<uint64_t>(t);
      while (!stop.load()) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t i = static_cast<int64_t>((x >> 33) % 80);
        try {
          if (label_of(ds, i) != i) std::abort();
        } catch (const Error& e) {
          unexpected.check(e, stop);
        }
      }
    });
  threads.emplace_back([&] {  // the fetcher: gives shards back and provides them again
    while (!stop.load()) {
      for (size_t s = 0; s < 8; ++s) {
        (void)ds.try_release(s);
        ds.provide(s);
      }
    }
  });
  int forks = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(600);
  while (std::chrono::steady_clock::now() < until || forks < 20) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(5);  // a hang dies of SIGALRM
      // The child's own reader: no pins inherited, so the shard can be given
      // back and provided again; then a read maps it.
      for (size_t s = 0; s < 8; ++s)
        if (ds.pins(s) != 0) ::_exit(3);
      (void)ds.try_release(3);
      ds.provide(3);
      const ScopedStop bound(&stop);
      ::_exit(label_of(ds, 35) == 35 ? 0 : 4);
    }
    CHECK(pid > 0);
    int status = 0;
    CHECK_EQ(::waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      std::fprintf(stderr, "child %d: status %d\n", forks, status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ++forks;
  }
  stop = true;
  for (auto& th : threads) th.join();
  CHECK_EQ(unexpected.count(), 0);
}

TEST_MAIN(failures_reach_waiters_through_a_reset();
          fetch_plan_keeps_what_is_in_use_and_the_window();
          fork_while_mapping_never_hangs_the_child())
