// The loader core with automatic settings, end to end on a synthetic producer:
// the tuner parks workers and moves the window while batches flow (and the
// batches stay the same), the memory limit holds, explicit settings never
// move, and a slow first batch is reported. Run under TSan in CI: the tuner's
// moves race the workers on purpose.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/blocking.h"
#include "pipeline/loader_core.h"

using namespace stoker;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// While `on`, unit 0 of a batch waits as a read of a shard still downloading
// waits (ScopedBlocked), until the batch's other units have run or 10 s pass.
struct Download {
  std::atomic<bool> on{false};
  std::atomic<int> others{0};
  std::atomic<bool> lent{false};  // the others ran while unit 0 waited
};

// Batch k of epoch e: int64 values e * 1'000'000 + global sample index, one
// unit per sample; unit work can be slowed for the first batch.
class Counting final : public BatchProducer {
 public:
  Counting(int64_t n, int64_t batch, std::chrono::milliseconds first_unit_delay = 0ms,
           Download* download = nullptr)
      : n_(n), batch_(batch), delay_(first_unit_delay), download_(download) {}

  int64_t num_batches(int64_t, int64_t) const override { return (n_ + batch_ - 1) / batch_; }
  int64_t rank_samples(int64_t, int64_t) const override { return n_; }
  int64_t epoch_samples() const override { return n_; }
  int64_t consumed_after(const EpochKey& key, int64_t batches) const override {
    return std::min(n_, key.offset + batches * batch_);
  }

  struct Plan final : EpochPlan {
    uint64_t epoch = 0;
    int64_t offset = 0, batches = 0;
    int64_t num_batches() const override { return batches; }
  };
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const override {
    auto p = std::make_shared<Plan>();
    p->epoch = key.epoch;
    p->offset = key.offset;
    p->batches = (n_ - key.offset + batch_ - 1) / batch_;
    return p;
  }

  struct Work final : BatchWork {
    int64_t first = 0;
    uint64_t epoch = 0;
    std::chrono::milliseconds delay{0};
    Download* download = nullptr;
    void run(int u, uint8_t* base, WorkerContext& ctx) override {
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      if (download && download->on.load()) {
        if (u != 0) {
          ++download->others;
        } else {
          const ScopedBlocked waiting;
          const auto until = Clock::now() + 10s;
          while (download->others.load() < units - 1 && Clock::now() < until)
            std::this_thread::sleep_for(1ms);
          download->lent = download->others.load() >= units - 1;
        }
      }
      const int64_t v = static_cast<int64_t>(epoch) * 1'000'000 + first + u;
      std::memcpy(base + static_cast<size_t>(u) * 8, &v, 8);
      ctx.times.decode_ns += 1000;
    }
  };
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& e, int64_t k) const override {
    const auto& p = static_cast<const Plan&>(e);
    auto w = std::make_unique<Work>();
    w->first = p.offset + k * batch_;
    const int64_t len = std::min(batch_, n_ - w->first);
    w->epoch = p.epoch;
    w->delay = k == 0 && p.epoch == 0 ? delay_ : 0ms;
    w->download = download_;
    w->tensors.push_back(TensorDesc{"x", DType::kInt64, {len}, 0, static_cast<size_t>(len) * 8});
    w->bytes = static_cast<size_t>(len) * 8;
    w->units = static_cast<int>(len);
    w->samples = len;
    return w;
  }

 private:
  int64_t n_, batch_;
  std::chrono::milliseconds delay_;
  Download* download_;
};

std::vector<int64_t> values(const DeliveredBatch& b) {
  std::vector<int64_t> v(b.tensors.at(0).nbytes / 8);
  std::memcpy(v.data(), b.memory.get(), b.tensors.at(0).nbytes);
  return v;
}

// Runs epochs (sleeping `step` per batch) until `stop` says so; checks every value.
template <typename Stop>
int64_t run(LoaderCore& core, std::chrono::microseconds step, int64_t n, Stop stop) {
  int64_t seen = 0;
  for (uint64_t epoch = 0; epoch < 1000; ++epoch) {
    core.set_epoch(epoch);
    auto it = core.iter(0, 1);
    int64_t next_value = 0;
    for (;;) {
      DeliveredBatch b;
      const auto s = it->next(b, Clock::now() + 50ms);
      if (s == LoaderCore::Iterator::Status::kTimeout) continue;
      if (s == LoaderCore::Iterator::Status::kEnd) break;
      for (int64_t v : values(b))
        CHECK_EQ(v, static_cast<int64_t>(epoch) * 1'000'000 + next_value++);
      ++seen;
      std::this_thread::sleep_for(step);
      if (stop()) return seen;
    }
    CHECK_EQ(next_value, n);
  }
  return seen;
}

bool has_message(const std::vector<LogMessage>& msgs, const std::string& text, int level = -1) {
  for (const auto& m : msgs)
    if (m.text.find(text) != std::string::npos && (level < 0 || m.level == level)) return true;
  return false;
}

void consumer_bound_loop_is_tuned_down_within_the_memory_limit() {
  const int64_t n = 640, batch = 16;
  LoaderOptions o;
  o.num_threads = 4;
  o.prefetch = 64;
  o.auto_threads = o.auto_prefetch = true;
  o.max_memory = 3 * batch * 8 + 10;  // three batches
  o.linger = 20ms;
  Download download;
  auto core = LoaderCore::create(std::make_shared<Counting>(n, batch, 0ms, &download), o);
  CHECK_EQ(core->stats().num_threads, 4);
  std::vector<LogMessage> msgs;
  const auto t0 = Clock::now();
  // A step long enough that the loop stays the bottleneck on a loaded machine or
  // under a sanitizer.
  run(*core, 5ms, n, [&] {
    for (auto& m : core->take_messages()) msgs.push_back(m);
    return core->stats().settled || Clock::now() - t0 > 60s;
  });
  const LoaderStatsSnapshot s = core->stats();
  CHECK(s.settled);
  CHECK_EQ(s.num_threads, 1);  // microseconds of work behind a 5 ms step
  CHECK(s.prefetch >= 1 && s.prefetch <= 3);
  for (size_t d = 4; d < s.depth_hist.size(); ++d) CHECK_EQ(s.depth_hist[d], 0);
  CHECK_EQ(s.bottleneck, std::string("consumer"));
  CHECK(has_message(msgs, "autotuning settled on num_threads=1 (of 4 cores", 20));
  // One active worker, and a unit that waits for a download (common/blocking.h):
  // a parked worker takes its turn, so the batch's other units run meanwhile.
  download.on = true;
  const double busy_before = core->stats().worker_busy_seconds;
  core->set_epoch(5000);
  auto it = core->iter(0, 1);
  DeliveredBatch b;
  auto st = it->next(b, Clock::now() + 30s);
  CHECK(st == LoaderCore::Iterator::Status::kBatch);
  CHECK(download.lent.load());
  // ... and the wait counts as waiting, not as work.
  CHECK(core->stats().worker_busy_seconds - busy_before < 5.0);
  download.on = false;
  core->close();
}

void explicit_settings_never_move() {
  const int64_t n = 320, batch = 16;
  LoaderOptions o;
  o.num_threads = 3;
  o.prefetch = 5;
  o.linger = 20ms;
  auto core = LoaderCore::create(std::make_shared<Counting>(n, batch), o);
  int64_t batches = 0;
  run(*core, 1ms, n, [&] { return ++batches >= 200; });
  const LoaderStatsSnapshot s = core->stats();
  CHECK_EQ(s.num_threads, 3);
  CHECK_EQ(s.prefetch, 5);
  CHECK(!s.settled);
  for (const auto& m : core->take_messages()) CHECK(m.text.find("autotuning") == std::string::npos);
  core->close();
}

void slow_first_batch_is_reported() {
  LoaderOptions o;
  o.num_threads = 2;
  o.prefetch = 2;
  o.slow_first_batch = 20ms;
  o.linger = 20ms;
  // 4 units of 30 ms on 2 threads: the first batch takes 60 ms at least.
  auto core = LoaderCore::create(std::make_shared<Counting>(64, 4, 30ms), o);
  auto it = core->iter(0, 1);
  DeliveredBatch b;
  std::vector<LogMessage> msgs;
  while (it->next(b, Clock::now() + 5ms) != LoaderCore::Iterator::Status::kBatch)
    for (auto& m : core->take_messages()) msgs.push_back(m);
  for (auto& m : core->take_messages()) msgs.push_back(m);
  CHECK(has_message(msgs, "the first batch of epoch 0 is not ready after", 20));
  CHECK(has_message(msgs, "parts of the batch done") || has_message(msgs, "not planned yet"));
  CHECK(has_message(msgs, "the first batch of epoch 0 came after", 20));
  CHECK(core->stats().first_batch_seconds >= 0.06);
  it->close();
  core->close();
}

}  // namespace

TEST_MAIN(consumer_bound_loop_is_tuned_down_within_the_memory_limit();
          explicit_settings_never_move(); slow_first_batch_is_reported();)
