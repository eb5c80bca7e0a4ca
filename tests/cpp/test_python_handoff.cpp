// The Python stage's hand-off (stage/python_handoff.h) through a real
// LoaderCore, with C++ threads in the role of the stage's Python threads:
// batches arrive in order whatever order the finishers complete them in, the
// window bounds what is handed off, a stopped stream's batches are dropped
// (completing them is a no-op), a batch dropped unfinished fails instead of
// hanging, a failed batch carries its ticket, chunks cover every sample
// once, and the resume state counts what the consumer took. Run under
// ASan+UBSan and TSan in CI.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "pipeline/loader_core.h"
#include "sampler/sampler.h"
#include "stage/python_handoff.h"
#include "stage/python_producer.h"

using namespace stoker;
using namespace std::chrono_literals;
using Clock = LoaderCore::Clock;
using Status = LoaderCore::Iterator::Status;

namespace {

SamplerOptions sampler(int64_t batch, bool shuffle) {
  SamplerOptions s;
  s.batch_size = batch;
  s.shuffle = shuffle;
  s.seed = 5;
  return s;
}

std::vector<std::vector<int64_t>> expected(int64_t n, const SamplerOptions& s, uint64_t epoch,
                                           int64_t offset = 0) {
  EpochOrder order(n, s, epoch, 0, 1, offset);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(order.num_batches()));
  for (int64_t k = 0; k < order.num_batches(); ++k)
    for (int64_t p = 0; p < order.batch_length(k); ++p)
      out[static_cast<size_t>(k)].push_back(order.index(k, p));
  return out;
}

// What the stage's Python threads do, in C++: take chunks, "map" sample i to
// i * 10 into a per-task buffer, and let the last chunk's thread write the
// batch into memory from the pool and complete it.
class FakeStage {
 public:
  FakeStage(std::shared_ptr<PythonHandoff> h, int threads) : h_(std::move(h)) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { loop(); });
  }
  ~FakeStage() { stop(); }
  void stop() {
    stop_.store(true);
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  /// Batches whose number is in `slow` wait this long before completing.
  std::set<int64_t> slow;
  std::chrono::milliseconds slow_for{0};
  /// Batches that fail with ticket = number + 1000.
  std::set<int64_t> failing;
  std::atomic<int> in_flight{0}, max_in_flight{0};
  std::atomic<int64_t> samples_seen{0};

 private:
  struct Pending {
    std::vector<int64_t> values;
  };
  void loop() {
    while (!stop_.load()) {
      PythonHandoff::Chunk c;
      if (!h_->take(c, Clock::now() + 20ms)) continue;
      PythonTask& t = *c.task;
      if (c.lo == 0) {
        const int now = in_flight.fetch_add(1) + 1;
        int seen = max_in_flight.load();
        while (now > seen && !max_in_flight.compare_exchange_weak(seen, now)) {
        }
      }
      Pending* p;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto& slot = pending_[t.id];
        if (!slot)
          slot = std::make_unique<Pending>(
              Pending{std::vector<int64_t>(static_cast<size_t>(t.samples()), -1)});
        p = slot.get();
      }
      for (int64_t i = c.lo; i < c.hi; ++i) {
        p->values[static_cast<size_t>(i)] = t.indices[static_cast<size_t>(i)] * 10;
        samples_seen.fetch_add(1);
      }
      t.add_times(PythonTimes{1000, 500, 0, 0, 0, 0});
      if (!t.chunk_done()) continue;
      if (slow.count(t.number)) std::this_thread::sleep_for(slow_for);
      std::unique_ptr<Pending> mine;
      {
        std::lock_guard<std::mutex> lock(mu_);
        mine = std::move(pending_[t.id]);
        pending_.erase(t.id);
      }
      in_flight.fetch_sub(1);
      if (failing.count(t.number)) {
        t.fail(static_cast<uint64_t>(t.number + 1000), "failed in Python");
        continue;
      }
      const size_t bytes = mine->values.size() * 8;
      std::shared_ptr<uint8_t> m = t.allocate(bytes);
      if (bytes) std::memcpy(m.get(), mine->values.data(), bytes);
      t.complete({TensorDesc{"v", DType::kInt64, {t.samples()}, 0, bytes}}, bytes,
                 static_cast<uint64_t>(t.number + 1), 0);
    }
  }
  std::shared_ptr<PythonHandoff> h_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<Pending>> pending_;
};

struct Setup {
  std::shared_ptr<PythonHandoff> handoff;
  std::shared_ptr<LoaderCore> core;
};

Setup make(std::shared_ptr<const BatchProducer> producer, int64_t batch_size, int prefetch,
           int64_t chunk) {
  Setup out;
  out.handoff = std::make_shared<PythonHandoff>(chunk, batch_size);
  LoaderOptions o;
  o.num_threads = 2;
  o.prefetch = prefetch;
  o.prefetch_next_epoch = false;
  o.finisher = out.handoff;
  out.core = LoaderCore::create(std::move(producer), o);
  out.handoff->set_stats(out.core->stats_handle());
  return out;
}

Setup make(int64_t n, const SamplerOptions& s, int prefetch, int64_t chunk) {
  Setup out;
  out.handoff = std::make_shared<PythonHandoff>(chunk, s.batch_size);
  LoaderOptions o;
  o.num_threads = 2;
  o.prefetch = prefetch;
  o.prefetch_next_epoch = false;
  o.finisher = out.handoff;
  out.core = LoaderCore::create(std::make_shared<PythonProducer>(n, s), o);
  out.handoff->set_stats(out.core->stats_handle());
  return out;
}

std::vector<int64_t> values(const DeliveredBatch& b) {
  CHECK_EQ(b.tensors.size(), 1u);
  std::vector<int64_t> v(static_cast<size_t>(b.tensors[0].shape[0]));
  if (!v.empty()) std::memcpy(v.data(), b.memory.get(), v.size() * 8);
  return v;
}

Status next(LoaderCore::Iterator& it, DeliveredBatch& b) {
  return RETRY_WAITS(Status::kTimeout, it.next(b, Clock::now() + 5s));
}

// ---- tests ----------------------------------------------------------------------

void batches_in_order_whatever_order_they_finish() {
  const SamplerOptions s = sampler(7, true);
  Setup x = make(100, s, 4, 3);
  FakeStage stage(x.handoff, 3);
  stage.slow = {0, 2, 5};  // finished after later batches
  stage.slow_for = 30ms;
  auto it = x.core->iter(0, 1);
  const auto want = expected(100, s, 0);
  for (size_t k = 0; k < want.size(); ++k) {
    DeliveredBatch b;
    CHECK(next(*it, b) == Status::kBatch);
    CHECK_EQ(b.ticket, k + 1);
    std::vector<int64_t> w = want[k];
    for (auto& v : w) v *= 10;
    CHECK(values(b) == w);
  }
  DeliveredBatch end;
  CHECK(next(*it, end) == Status::kEnd);
  CHECK_EQ(stage.samples_seen.load(), 100);  // every sample of every chunk once
  CHECK(stage.max_in_flight.load() <= 4);    // the window bounds the stage's work
  const LoaderStatsSnapshot st = x.core->stats();
  CHECK(st.python_seconds > 0 && st.python_cpu_seconds > 0);
}

void failed_batch_carries_its_ticket_and_the_iterator_goes_on() {
  const SamplerOptions s = sampler(5, false);
  Setup x = make(40, s, 3, 2);
  FakeStage stage(x.handoff, 2);
  stage.failing = {3};
  auto it = x.core->iter(0, 1);
  for (int k = 0; k < 3; ++k) {
    DeliveredBatch b;
    CHECK(next(*it, b) == Status::kBatch);
  }
  bool threw = false;
  try {
    DeliveredBatch b;
    next(*it, b);
  } catch (const PythonStageError& e) {
    threw = true;
    CHECK_EQ(e.ticket(), 1003u);
    CHECK(std::string(e.what()) == "failed in Python");
  }
  CHECK(threw);
  // the failed batch is consumed (the state counts 4 batches of 5), and the iterator
  // goes on with the batches after it (NOTE [ After a failed batch ] in
  // stoker/_iterator.py)
  CHECK_EQ(x.core->state().offset, 20);
  for (int k = 4; k < 8; ++k) {
    DeliveredBatch b;
    CHECK(next(*it, b) == Status::kBatch);
  }
  DeliveredBatch b;
  CHECK(next(*it, b) == Status::kEnd);
}

void resume_hands_off_exactly_the_rest() {
  const SamplerOptions s = sampler(6, true);
  const auto want = expected(50, s, 0);
  Setup a = make(50, s, 4, 4);
  FakeStage sa(a.handoff, 2);
  auto it = a.core->iter(0, 1);
  for (int k = 0; k < 3; ++k) {
    DeliveredBatch b;
    CHECK(next(*it, b) == Status::kBatch);
  }
  std::this_thread::sleep_for(20ms);  // the stage prepares batches ahead meanwhile
  const LoaderState st = a.core->state();
  CHECK_EQ(st.offset, 18);
  Setup r = make(50, s, 4, 4);
  FakeStage sr(r.handoff, 3);
  r.core->load_state(st);
  auto rit = r.core->iter(0, 1);
  for (size_t k = 3; k < want.size(); ++k) {
    DeliveredBatch b;
    CHECK(next(*rit, b) == Status::kBatch);
    std::vector<int64_t> w = want[k];
    for (auto& v : w) v *= 10;
    CHECK(values(b) == w);
    CHECK_EQ(b.ticket, k + 1);  // numbered from the start of the epoch
  }
}

void stopped_stream_drops_its_batches_and_a_dropped_batch_fails() {
  const SamplerOptions s = sampler(4, false);
  // Nobody finishes: the batches wait in the hand-off; closing the iterator
  // stops the stream, take() drops them, completing one is a no-op.
  Setup x = make(40, s, 3, 4);
  auto it = x.core->iter(0, 1);
  DeliveredBatch b;
  CHECK(it->next(b, Clock::now() + 50ms) == Status::kTimeout);
  PythonHandoff::Chunk c;
  CHECK(x.handoff->take(c, Clock::now() + 1s));
  it->close();
  c.task->complete({}, 0, 7, 0);  // no-op: nobody reads it
  PythonHandoff::Chunk none;
  CHECK(!x.handoff->take(none, Clock::now() + 20ms));
  CHECK_EQ(x.handoff->waiting(), 0u);

  // A batch whose task is dropped unfinished fails at the consumer.
  Setup y = make(40, s, 2, 4);
  auto yit = y.core->iter(0, 1);
  CHECK(yit->next(b, Clock::now() + 20ms) == Status::kTimeout);
  // Both batches of the window are handed off (the pool's two workers may
  // finish them in either order); the front is the one the consumer reads next.
  const auto both = Clock::now() + 5s;
  while (y.handoff->waiting() < 2 && Clock::now() < both) std::this_thread::sleep_for(1ms);
  CHECK_EQ(y.handoff->waiting(), 2u);
  {
    PythonHandoff::Chunk d;
    CHECK(y.handoff->take(d, Clock::now() + 1s));
    CHECK(d.task->number == 0);
  }  // dropped: its handle fails the batch
  CHECK_THROWS(Error, next(*yit, b));
}

void drop_stopped_lets_go_of_a_stopped_streams_batches_at_once() {
  // The loader's close(): the batches waiting would hold their memory until the
  // next take(), perhaps never (a loader kept after close()).
  Setup x = make(40, sampler(4, false), 3, 4);
  auto it = x.core->iter(0, 1);
  DeliveredBatch b;
  CHECK(it->next(b, Clock::now() + 20ms) == Status::kTimeout);
  const auto all = Clock::now() + 5s;
  while (x.handoff->waiting() < 3 && Clock::now() < all) std::this_thread::sleep_for(1ms);
  CHECK_EQ(x.handoff->waiting(), 3u);
  CHECK_EQ(x.handoff->drop_stopped(), 0u);  // a live stream's batches stay
  CHECK_EQ(x.handoff->waiting(), 3u);
  it->close();
  CHECK_EQ(x.handoff->drop_stopped(), 3u);
  CHECK_EQ(x.handoff->waiting(), 0u);
  CHECK(!x.handoff->closed());  // the hand-off serves the next iterator
}

void empty_batches_are_one_empty_chunk() {
  SamplerOptions s = sampler(4, false);
  s.even_batches = false;
  // 5 samples on 3 ranks without padding: rank 2 holds one sample, its second batch... none
  auto handoff = std::make_shared<PythonHandoff>(2, 4);
  LoaderOptions o;
  o.num_threads = 1;
  o.prefetch = 2;
  o.prefetch_next_epoch = false;
  o.finisher = handoff;
  SamplerOptions one = s;
  one.batch_size = 1;
  auto core = LoaderCore::create(std::make_shared<PythonProducer>(5, one), o);
  handoff->set_stats(core->stats_handle());
  FakeStage stage(handoff, 1);
  auto it = core->iter(2, 3);  // rank 2 of 3: samples 2 and... 5 has none: [2], []
  DeliveredBatch b;
  CHECK(next(*it, b) == Status::kBatch);
  CHECK(values(b) == std::vector<int64_t>{20});
  CHECK(next(*it, b) == Status::kBatch);
  CHECK(values(b).empty());
  CHECK(next(*it, b) == Status::kEnd);
}

void closed_handoff_returns_at_once() {
  PythonHandoff h(4, 8);
  h.close();
  PythonHandoff::Chunk c;
  const auto t0 = Clock::now();
  CHECK(!h.take(c, Clock::now() + 2s));
  CHECK(Clock::now() - t0 < 1s);
}

// A handed-off batch without a stream: its planned batch and nothing else.
class LooseBatch final : public HandedOffBatch {
 public:
  LooseBatch(uint64_t epoch, int64_t index) {
    work_.indices = {index};
    work_.key.epoch = epoch;
    work_.index = index;
  }
  const BatchWork& work() const override { return work_; }
  std::shared_ptr<uint8_t> memory() const override { return nullptr; }
  bool stopped() const override { return false; }
  std::shared_ptr<uint8_t> allocate(size_t) override { return nullptr; }
  void complete(std::vector<TensorDesc>, size_t, uint64_t, int64_t, int64_t) override {}
  void fail(std::exception_ptr) override {}
  void set_samples(int64_t) override {}
  void end() override {}
  uint64_t stream_id() const override { return 1; }

 private:
  PythonBatch work_;
};

void chunks_are_served_in_the_order_the_consumer_reads() {
  // Workers hand batches off in whatever order they finish them; the stage
  // serves the earliest first (epoch, then number), not the first handed off.
  PythonHandoff h(4, 1);
  const std::vector<std::pair<uint64_t, int64_t>> handed = {{0, 2}, {1, 0}, {0, 0}, {0, 3}, {0, 1}};
  for (const auto& [epoch, index] : handed) h.hand_off(std::make_shared<LooseBatch>(epoch, index));
  std::vector<std::pair<uint64_t, int64_t>> served;
  PythonHandoff::Chunk c;
  while (h.take(c, Clock::now())) served.emplace_back(c.task->epoch, c.task->number);
  const std::vector<std::pair<uint64_t, int64_t>> want = {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}};
  CHECK(served == want);
}

// A producer whose batch `gated` is planned only once the gate opens (its
// worker is held there, as a descheduled worker would be), then planned, or
// failed.
class GatedProducer final : public BatchProducer {
 public:
  GatedProducer(std::shared_ptr<const BatchProducer> inner, int64_t gated, bool fail)
      : inner_(std::move(inner)), gated_(gated), fail_(fail) {}
  int64_t num_batches(int64_t rank, int64_t world_size) const override {
    return inner_->num_batches(rank, world_size);
  }
  int64_t rank_samples(int64_t rank, int64_t world_size) const override {
    return inner_->rank_samples(rank, world_size);
  }
  int64_t epoch_samples() const override { return inner_->epoch_samples(); }
  int64_t consumed_after(const EpochKey& key, int64_t batches) const override {
    return inner_->consumed_after(key, batches);
  }
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const override {
    return inner_->plan_epoch(key);
  }
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& epoch, int64_t k) const override {
    if (k == gated_) {
      entered.store(true);
      while (!open.load()) std::this_thread::sleep_for(1ms);
      if (fail_) throw Error("planning batch " + std::to_string(k) + " failed");
    }
    return inner_->plan_batch(epoch, k);
  }
  mutable std::atomic<bool> open{false}, entered{false};

 private:
  std::shared_ptr<const BatchProducer> inner_;
  int64_t gated_;
  bool fail_;
};

void a_batch_is_served_after_every_earlier_one_left_the_workers() {
  // The worker planning batch 0 is held; the other plans and hands off 1, 2, 3.
  // None of them is served before batch 0 (a chunk of batch 2 at a worker
  // process before batch 0's could hold batch 0 up behind a stuck sample).
  const SamplerOptions s = sampler(4, false);
  auto gated = std::make_shared<GatedProducer>(std::make_shared<PythonProducer>(40, s), 0, false);
  Setup x = make(gated, 4, 4, 4);
  auto it = x.core->iter(0, 1);
  const auto until = Clock::now() + 5s;
  while ((!gated->entered.load() || x.handoff->waiting() < 3) && Clock::now() < until)
    std::this_thread::sleep_for(1ms);
  CHECK(gated->entered.load());
  CHECK_EQ(x.handoff->waiting(), 3u);  // batches 1, 2 and 3, handed off
  PythonHandoff::Chunk c;
  CHECK(!x.handoff->take(c, Clock::now() + 50ms));
  gated->open.store(true);
  std::vector<int64_t> served;
  for (int k = 0; k < 4; ++k) {
    PythonHandoff::Chunk d;
    CHECK(x.handoff->take(d, Clock::now() + 5s));
    served.push_back(d.task->number);
    d.task->complete({}, 0, static_cast<uint64_t>(d.task->number + 1), 0);
  }
  CHECK((served == std::vector<int64_t>{0, 1, 2, 3}));
  for (uint64_t k = 0; k < 4; ++k) {
    DeliveredBatch b;
    CHECK(next(*it, b) == Status::kBatch);
    CHECK_EQ(b.ticket, k + 1);
  }
}

void a_batch_that_failed_before_its_hand_off_releases_the_later_ones() {
  // Batch 0's planning fails: it is published as its error, never handed off,
  // and the batches held back for it are served; the consumer gets the error,
  // then every later batch.
  const SamplerOptions s = sampler(4, false);
  auto gated = std::make_shared<GatedProducer>(std::make_shared<PythonProducer>(24, s), 0, true);
  Setup x = make(gated, 4, 3, 4);
  auto it = x.core->iter(0, 1);
  const auto until = Clock::now() + 5s;
  while ((!gated->entered.load() || x.handoff->waiting() < 2) && Clock::now() < until)
    std::this_thread::sleep_for(1ms);
  CHECK_EQ(x.handoff->waiting(), 2u);
  PythonHandoff::Chunk c;
  CHECK(!x.handoff->take(c, Clock::now() + 50ms));
  gated->open.store(true);
  CHECK(x.handoff->take(c, Clock::now() + 5s));
  CHECK_EQ(c.task->number, 1);
  c.task->fail(77, "batch 1 failed in Python");
  FakeStage stage(x.handoff, 2);
  DeliveredBatch b;
  CHECK_THROWS(Error, next(*it, b));  // batch 0: planning failed
  CHECK_THROWS(PythonStageError, next(*it, b));
  for (int64_t k = 2; k < 6; ++k) {
    CHECK(next(*it, b) == Status::kBatch);
    std::vector<int64_t> want;
    for (int64_t i = 4 * k; i < 4 * k + 4; ++i) want.push_back(i * 10);
    CHECK(values(b) == want);
  }
  CHECK(next(*it, b) == Status::kEnd);
}

}  // namespace

TEST_MAIN(chunks_are_served_in_the_order_the_consumer_reads();
          a_batch_is_served_after_every_earlier_one_left_the_workers();
          a_batch_that_failed_before_its_hand_off_releases_the_later_ones();
          batches_in_order_whatever_order_they_finish();
          failed_batch_carries_its_ticket_and_the_iterator_goes_on();
          resume_hands_off_exactly_the_rest();
          stopped_stream_drops_its_batches_and_a_dropped_batch_fails();
          drop_stopped_lets_go_of_a_stopped_streams_batches_at_once();
          empty_batches_are_one_empty_chunk(); closed_handoff_returns_at_once();)
