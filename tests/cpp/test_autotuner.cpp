// The autotuner's decisions and the diagnosis, on made-up measurements: a
// small model of a loop (workers needing `work` seconds per batch, a consumer
// needing `step` seconds) stands in for the loader, so convergence, settling,
// hysteresis and the limits are checked without a clock.
#include <algorithm>
#include <cstdio>
#include <string>

#include "check.h"
#include "pipeline/autotuner.h"

using namespace stoker;

namespace {

// One interval of a steady loop: `work` worker-seconds per batch on `threads`
// workers (at most `cores` of them run at once), a consumer needing `step`
// seconds per batch; the queue holds up to `window` batches.
TuneInterval model(int threads, int window, double work, double step, int cores,
                   int max_threads = 8, int max_window = 64) {
  TuneInterval iv;
  const double producer = std::min(threads, cores) / work;  // batches per second
  const double consumer = 1.0 / step;
  const double rate = std::min(producer, consumer);
  iv.batches = 40;
  iv.wall = iv.batches / rate;
  iv.wait = std::max(0.0, iv.wall - iv.batches * step);
  iv.busy = iv.batches * work;
  iv.decode = iv.busy * 0.7;
  iv.read = iv.busy * 0.2;
  iv.ops = iv.busy * 0.1;
  iv.threads = threads;
  iv.max_threads = max_threads;
  iv.window = window;
  iv.max_window = max_window;
  // A loop that keeps up finds the window full; one that waits finds nothing.
  iv.min_depth = producer > consumer * 1.05 ? window : 0;
  return iv;
}

void consumer_bound_loop_sheds_idle_workers() {
  // Workers need 10 ms per batch, the loop 20 ms: one worker is enough.
  Autotuner t({true, false, 8}, 8, 4);
  int settled_at = -1, settles = 0;
  for (int i = 0; i < 30; ++i) {
    const auto s = t.step(model(t.threads(), t.window(), 0.010, 0.020, 8));
    if (s.settled) {
      settled_at = i;
      ++settles;
    }
  }
  CHECK_EQ(settles, 1);  // settles once, and says so once
  CHECK(settled_at > 0 && settled_at < 12);
  // Enough workers that the loop never waits, and no more than the busy time
  // needs at the target utilization.
  const TuneInterval end = model(t.threads(), t.window(), 0.010, 0.020, 8);
  CHECK(end.stall() < Autotuner::kStallLow);
  CHECK(t.threads() >= 1 && t.threads() <= 2);
  CHECK_EQ(t.window(), 4);  // not tuned: never moved
}

void loader_bound_loop_keeps_every_core() {
  Autotuner t({true, true, 4}, 4, 4);
  bool settled = false;
  for (int i = 0; i < 20; ++i) {
    const auto s = t.step(model(t.threads(), t.window(), 0.040, 0.001, 4, 4));
    CHECK(!s.changed);  // saturated workers and a waiting loop: nothing to take away
    settled = settled || s.settled;
  }
  CHECK(settled);
  CHECK_EQ(t.threads(), 4);
  const Diagnosis d = diagnose(model(4, 4, 0.040, 0.001, 4, 4), Autotuner::kStallHigh);
  CHECK(d.kind == Bottleneck::kLoader);
  CHECK_EQ(d.stage, std::string("decode"));
  CHECK(d.text.find("loader-bound") == 0);
  CHECK(d.text.find("decoding takes 70%") != std::string::npos);
}

void too_few_workers_are_raised_and_never_dropped_again() {
  // Started low (as after a drop): each worker gives 25 batches/s, the loop
  // wants 70: three workers are needed.
  Autotuner t({true, false, 8}, 8, 4);
  // First a consumer-bound stretch drops the pool...
  for (int i = 0; i < 6; ++i) t.step(model(t.threads(), 4, 0.040, 0.200, 8));
  CHECK(t.threads() <= 2);
  // ...then the loop speeds up: the tuner raises the workers until it keeps up.
  int moves_down_after = 0;
  int prev = t.threads();
  for (int i = 0; i < 40; ++i) {
    t.step(model(t.threads(), 4, 0.040, 1.0 / 70, 8));
    if (t.threads() < prev) ++moves_down_after;
    prev = t.threads();
  }
  CHECK(t.threads() >= 3);
  CHECK_EQ(moves_down_after, 0);
  CHECK(model(t.threads(), 4, 0.040, 1.0 / 70, 8).stall() < Autotuner::kStallHigh);
  // The floor holds: an idle stretch does not take it below what the busy
  // loop needed.
  const int floor = t.threads();
  for (int i = 0; i < 10; ++i) t.step(model(t.threads(), 4, 0.040, 1.0, 8));
  CHECK(t.threads() >= floor);
}

void cheaper_batches_lift_the_floor() {
  // An epoch that decodes every image sets a floor of workers; a cached epoch
  // after it needs a quarter of the work per batch (Loader(cache="decoded")).
  Autotuner t({true, false, 8}, 8, 4);
  for (int i = 0; i < 6; ++i) t.step(model(t.threads(), 4, 0.040, 0.200, 8));
  for (int i = 0; i < 40; ++i) t.step(model(t.threads(), 4, 0.040, 1.0 / 70, 8));
  const int floor = t.threads();
  CHECK(floor >= 3);
  // Half the work is not cheaper enough: the floor holds.
  for (int i = 0; i < 10; ++i) t.step(model(t.threads(), 4, 0.021, 1.0 / 70, 8));
  CHECK(t.threads() >= floor);
  // A quarter: the floors go, and the tuner sheds what the cheaper batches do not need.
  for (int i = 0; i < 20; ++i) t.step(model(t.threads(), 4, 0.010, 1.0 / 70, 8));
  CHECK(t.threads() < floor);
  CHECK(model(t.threads(), 4, 0.010, 1.0 / 70, 8).stall() < Autotuner::kStallHigh);
  CHECK(t.settled());
}

void one_noisy_interval_moves_nothing() {
  Autotuner t({true, true, 8}, 8, 4);
  CHECK(!t.step(model(8, 4, 0.010, 0.100, 8)).changed);  // idle: a first vote only
  CHECK(!t.step(model(8, 4, 0.100, 0.001, 8)).changed);  // the opposite: votes reset
  CHECK(!t.step(model(8, 4, 0.010, 0.100, 8)).changed);
  CHECK_EQ(t.threads(), 8);
  CHECK(t.step(model(8, 4, 0.010, 0.100, 8)).changed);  // twice in a row: it moves
  CHECK(t.threads() < 8);
}

void window_grows_within_its_cap_and_shrinks_to_what_is_used() {
  Autotuner t({false, true, 2}, 2, 4);
  // The loop waits with no batch ready while the workers idle: larger window,
  // but never past the cap (the memory limit).
  TuneInterval iv;
  iv.batches = 20;
  iv.wall = 1.0;
  iv.wait = 0.3;
  iv.busy = 0.5;  // 25% of two workers
  iv.threads = 2;
  iv.max_threads = 2;
  iv.min_depth = 0;
  iv.max_window = 6;
  for (int i = 0; i < 10; ++i) {
    iv.window = t.window();
    t.step(iv);
    CHECK(t.window() <= 6);
  }
  CHECK_EQ(t.window(), 6);
  const Diagnosis d = diagnose(iv, Autotuner::kStallHigh);
  CHECK(d.kind == Bottleneck::kLoader && d.stage == "prefetch");
  // The memory limit drops (a larger batch seen): the window follows at once.
  iv.max_window = 3;
  iv.window = 3;
  iv.wait = 0;
  iv.min_depth = 1;
  t.step(iv);
  CHECK_EQ(t.window(), 3);
  // The loop never waits and 3 batches are always ready: shrink, not below 2.
  Autotuner u({false, true, 2}, 2, 16);
  iv.max_window = 64;
  for (int i = 0; i < 10; ++i) {
    iv.window = u.window();
    iv.min_depth = u.window();
    u.step(iv);
  }
  CHECK_EQ(u.window(), Autotuner::kMinWindow);
  CHECK(!u.step(iv).changed);
}

void explicit_settings_never_move() {
  Autotuner t({false, false, 8}, 3, 5);
  for (int i = 0; i < 20; ++i) {
    const auto s = t.step(model(3, 5, i % 2 ? 0.001 : 0.100, 0.010, 8));
    CHECK(!s.changed && !s.settled);
  }
  CHECK_EQ(t.threads(), 3);
  CHECK_EQ(t.window(), 5);
  CHECK(!t.tuning());
}

void copy_bound_loop_gets_no_more_workers() {
  TuneInterval iv = model(2, 4, 0.020, 0.001, 8, 8);
  iv.device = true;
  iv.copies = iv.batches;
  iv.copy = iv.batches * 0.050;  // 50 ms per copy, workers 10 ms per batch
  const Diagnosis d = diagnose(iv, Autotuner::kStallHigh);
  CHECK(d.kind == Bottleneck::kCopy);
  CHECK_EQ(d.stage, std::string("copy"));
  Autotuner t({true, false, 8}, 2, 4);
  for (int i = 0; i < 6; ++i) CHECK(!t.step(iv).changed);
  CHECK_EQ(t.threads(), 2);
}

void diagnosis_of_nothing_and_of_a_fast_loader() {
  CHECK(diagnose(TuneInterval{}, 0.05).kind == Bottleneck::kUnknown);
  const Diagnosis d = diagnose(model(2, 4, 0.010, 0.050, 8), 0.05);
  CHECK(d.kind == Bottleneck::kConsumer);
  CHECK(d.stage.empty());
  CHECK(d.text.find("consumer-bound") == 0);
  CHECK(d.text.find("next() itself") == std::string::npos);
  // The consumer's own time in next() (batch_map on its thread) is named from 10% of the
  // loop; the verdict stays consumer-bound: no worker would shorten it.
  TuneInterval slow_next = model(2, 4, 0.010, 0.050, 8);
  slow_next.handoff = 0.4 * slow_next.wall;
  const Diagnosis named = diagnose(slow_next, 0.05);
  CHECK(named.kind == Bottleneck::kConsumer);
  CHECK(named.text.find("next() itself took 40% of the loop") != std::string::npos);
  slow_next.handoff = 0.05 * slow_next.wall;
  CHECK(diagnose(slow_next, 0.05).text.find("next() itself") == std::string::npos);
  // Loader-bound below the maximum: the advice is more threads.
  const Diagnosis more = diagnose(model(2, 4, 0.040, 0.001, 2, 8), 0.05);
  CHECK(more.text.find("num_threads=8") != std::string::npos);
  // No image ops at all: no images, and "decode" is copying arrays.
  TuneInterval arrays = model(2, 4, 0.040, 0.001, 2, 2);
  arrays.decode += arrays.ops;
  arrays.ops = 0;
  const Diagnosis copy = diagnose(arrays, 0.05);
  CHECK_EQ(copy.stage, std::string("decode"));
  CHECK(copy.text.find("copying the fields into the batch takes 80%") != std::string::npos);
  CHECK(copy.text.find("fewer bytes per sample") != std::string::npos);
  // Planning on top: the advice names what planning reads, image headers or the
  // lengths of variable-length fields.
  TuneInterval planning = arrays;
  planning.plan = 4 * planning.decode;
  const Diagnosis lengths = diagnose(planning, 0.05);
  CHECK_EQ(lengths.stage, std::string("plan"));
  CHECK(lengths.text.find("variable-length fields") != std::string::npos);
  CHECK(lengths.text.find("Resize") == std::string::npos);
  planning.ops = 0.001;
  const Diagnosis headers = diagnose(planning, 0.05);
  CHECK_EQ(headers.stage, std::string("plan"));
  CHECK(headers.text.find("have their headers read") != std::string::npos);
}

void python_stage_named_and_gil_bound_when_threads_take_turns() {
  // The Python stage dominates: 2 threads, wall time in user code 90% of the
  // work. Threads that ran in parallel used about as much CPU as wall time.
  TuneInterval iv = model(2, 4, 0.040, 0.001, 2, 2);
  iv.python = iv.busy * 0.9;
  iv.read = iv.decode = iv.ops = iv.busy * 0.03;
  iv.python_cpu = iv.python * 0.95;
  const Diagnosis parallel = diagnose(iv, 0.05);
  CHECK_EQ(parallel.stage, std::string("python"));
  CHECK(parallel.text.find("your Python code") != std::string::npos);
  CHECK(parallel.text.find("GIL-bound") == std::string::npos);
  CHECK(!gil_bound(iv));
  // Starved of CPU by other work: runnable half the time, not the GIL.
  iv.python_cpu = iv.python * 0.5;
  iv.python_wait = iv.python * 0.5;
  CHECK(!gil_bound(iv));
  const Diagnosis starved = diagnose(iv, 0.05);
  CHECK(starved.text.find("GIL-bound") == std::string::npos);
  CHECK(starved.text.find("waited for a free core 50%") != std::string::npos);
  // Taking turns on the GIL: each thread is blocked as long as it runs.
  iv.python_wait = iv.python * 0.02;
  CHECK(gil_bound(iv));
  const Diagnosis gil = diagnose(iv, 0.05);
  CHECK_EQ(gil.stage, std::string("python"));
  CHECK(gil.text.find("GIL-bound: 2 threads ran it at 1 cores") != std::string::npos);
  CHECK(gil.text.find("python_workers='process'") != std::string::npos);
  // Blocked as long, but on I/O or sleeps: far less than a core between them.
  TuneInterval io = iv;
  io.python_cpu = io.python * 0.05;
  CHECK(!gil_bound(io));
  // One thread cannot take turns with itself.
  iv.threads = 1;
  CHECK(!gil_bound(iv));
}

}  // namespace

TEST_MAIN(python_stage_named_and_gil_bound_when_threads_take_turns();
          consumer_bound_loop_sheds_idle_workers(); loader_bound_loop_keeps_every_core();
          too_few_workers_are_raised_and_never_dropped_again(); cheaper_batches_lift_the_floor();
          one_noisy_interval_moves_nothing();
          window_grows_within_its_cap_and_shrinks_to_what_is_used(); explicit_settings_never_move();
          copy_bound_loop_gets_no_more_workers(); diagnosis_of_nothing_and_of_a_fast_loader();)
