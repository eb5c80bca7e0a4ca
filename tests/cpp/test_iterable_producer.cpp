// Open-ended epochs (NOTE [ Open-ended epochs ] in pipeline/batch_producer.h)
// through a real LoaderCore: an IterableProducer's batches are filled by C++
// threads in the role of the Python stage, from a "source" of `rows` rows
// (row i is i * 10), which end the epoch at the first batch with no row left.
// The core keeps its rules with a count it learns at the end: the last batch
// partial, the epoch's end where the source ends it (at a batch boundary too),
// the next epoch after it, the resume state and skip() mid-epoch, several live
// iterators (each on a stream of its own), set_epoch confirming the running
// epoch, and the stats counting the rows delivered. Run under ASan+UBSan and
// TSan in CI.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "check.h"
#include "cuda/device_delivery.h"
#include "cuda/fake_device_api.h"
#include "pipeline/loader_core.h"
#include "stage/iterable_producer.h"
#include "stage/python_handoff.h"

using namespace stoker;
using namespace std::chrono_literals;
using Clock = LoaderCore::Clock;
using Status = LoaderCore::Iterator::Status;

namespace {

// The stage's threads: one chunk per batch (chunk_samples = batch size).
class FakeStage {
 public:
  FakeStage(std::shared_ptr<PythonHandoff> h, int64_t rows, int threads)
      : h_(std::move(h)), rows_(rows) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { loop(); });
  }
  ~FakeStage() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
  }
  std::set<uint64_t> streams() {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_;
  }

 private:
  void loop() {
    while (!stop_.load()) {
      PythonHandoff::Chunk c;
      if (!h_->take(c, Clock::now() + 20ms)) continue;
      PythonTask& t = *c.task;
      {
        std::lock_guard<std::mutex> lock(mu_);
        streams_.insert(t.stream);
      }
      if (!t.chunk_done()) continue;
      std::vector<int64_t> v;
      for (int64_t row : t.indices)
        if (row < rows_) v.push_back(row * 10);
      if (v.empty()) {
        t.end();  // no row left for this batch: the epoch ends before it
        continue;
      }
      if (static_cast<int64_t>(v.size()) < t.samples())
        t.set_samples(static_cast<int64_t>(v.size()));
      const size_t bytes = v.size() * 8;
      std::shared_ptr<uint8_t> m = t.allocate(bytes);
      std::memcpy(m.get(), v.data(), bytes);
      t.complete({TensorDesc{"v", DType::kInt64, {static_cast<int64_t>(v.size())}, 0, bytes}},
                 bytes, static_cast<uint64_t>(t.number + 1), 0);
    }
  }
  std::shared_ptr<PythonHandoff> h_;
  const int64_t rows_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::set<uint64_t> streams_;
};

struct Setup {
  std::shared_ptr<PythonHandoff> handoff;
  std::shared_ptr<LoaderCore> core;
  std::unique_ptr<FakeStage> stage;
};

Setup make(int64_t rows, int64_t batch, int prefetch = 3, bool device = false) {
  Setup out;
  out.handoff = std::make_shared<PythonHandoff>(batch, batch);
  LoaderOptions o;
  o.num_threads = 2;
  o.prefetch = prefetch;
  o.finisher = out.handoff;
  // the host fake's "device" memory is host memory: the values read the same
  if (device) o.delivery = std::make_shared<DeviceDelivery>(fake_device_api({0, 10us}), prefetch);
  out.core = LoaderCore::create(std::make_shared<IterableProducer>(batch), o);
  out.handoff->set_stats(out.core->stats_handle());
  out.stage = std::make_unique<FakeStage>(out.handoff, rows, 2);
  return out;
}

Status next(LoaderCore::Iterator& it, DeliveredBatch& b) {
  return RETRY_WAITS(Status::kTimeout, it.next(b, Clock::now() + 5s));
}

std::vector<int64_t> values(const DeliveredBatch& b) {
  CHECK_EQ(b.tensors.size(), 1u);
  std::vector<int64_t> v(static_cast<size_t>(b.tensors[0].shape[0]));
  std::memcpy(v.data(), b.memory.get(), v.size() * 8);
  return v;
}

// Rows [lo, hi) as a batch's values.
std::vector<int64_t> rows(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t i = lo; i < hi; ++i) v.push_back(i * 10);
  return v;
}

// The rest of an epoch: its batches' values, until the iterator ends.
std::vector<std::vector<int64_t>> rest(LoaderCore::Iterator& it) {
  std::vector<std::vector<int64_t>> out;
  DeliveredBatch b;
  while (next(it, b) == Status::kBatch) out.push_back(values(b));
  return out;
}

// ---- tests ----------------------------------------------------------------------

void epoch_ends_where_the_source_does() {
  for (const bool device : {false, true})     // the copy thread passes the end on
    for (const int64_t n : {23, 20, 3, 0}) {  // a partial last batch, a boundary, one, none
      Setup x = make(n, 5, 3, device);
      for (uint64_t epoch = 0; epoch < 2; ++epoch) {
        auto it = x.core->iter(0, 1);
        const auto got = rest(*it);
        std::vector<std::vector<int64_t>> want;
        for (int64_t lo = 0; lo < n; lo += 5) want.push_back(rows(lo, std::min(n, lo + 5)));
        CHECK(got == want);
        CHECK_EQ(it->epoch(), epoch);
        DeliveredBatch b;
        CHECK(next(*it, b) == Status::kEnd);  // and stays ended
        CHECK_EQ(x.core->state().epoch, epoch + 1);
        CHECK_EQ(x.core->state().offset, 0);
      }
      const LoaderStatsSnapshot st = x.core->stats();
      CHECK_EQ(st.samples, 2 * n);  // the last batch counts its rows, not the planned ones
    }
}

void resume_and_skip_mid_epoch() {
  Setup a = make(23, 5);
  auto it = a.core->iter(0, 1);
  DeliveredBatch b;
  for (int k = 0; k < 2; ++k) CHECK(next(*it, b) == Status::kBatch);
  std::this_thread::sleep_for(20ms);  // the stage fills batches ahead meanwhile
  const LoaderState st = a.core->state();
  CHECK_EQ(st.epoch, 0u);
  CHECK_EQ(st.offset, 10);  // rows consumed: the rest of the epoch reads on from there
  const std::vector<std::vector<int64_t>> want = {rows(10, 15), rows(15, 20), rows(20, 23)};
  Setup r = make(23, 5);
  r.core->load_state(st);
  auto rit = r.core->iter(0, 1);
  CHECK(rest(*rit) == want);
  CHECK_EQ(r.core->state().epoch, 1u);
  Setup s = make(23, 5);
  s.core->skip(2, 0, 1);
  auto sit = s.core->iter(0, 1);
  CHECK(rest(*sit) == want);
}

void several_live_iterators_each_read_the_epoch() {
  Setup x = make(17, 4);
  auto a = x.core->iter(0, 1);
  auto b = x.core->iter(0, 1);
  DeliveredBatch ba, bb;
  std::vector<std::vector<int64_t>> got_a, got_b;
  for (;;) {  // zip(loader, loader)
    const Status sa = next(*a, ba);
    const Status sb = next(*b, bb);
    CHECK(sa == sb);
    if (sa != Status::kBatch) break;
    got_a.push_back(values(ba));
    got_b.push_back(values(bb));
  }
  CHECK(got_a == got_b);
  CHECK_EQ(got_a.size(), 5u);
  CHECK_EQ(a->epoch(), 0u);
  CHECK_EQ(b->epoch(), 0u);
  CHECK(x.stage->streams().size() >= 2);  // one reading of the source per stream
  CHECK_EQ(x.core->state().epoch, 1u);
}

void set_epoch_while_it_runs_confirms_it() {
  Setup x = make(12, 4);
  x.core->set_epoch(3);
  auto it = x.core->iter(0, 1);
  DeliveredBatch b;
  CHECK(next(*it, b) == Status::kBatch);
  x.core->set_epoch(3);  // a framework's call at the start of its epoch
  CHECK_EQ(rest(*it).size(), 2u);
  auto again = x.core->iter(0, 1);
  CHECK(next(*again, b) == Status::kBatch);
  CHECK_EQ(again->epoch(), 4u);
}

void ranks_take_their_rows_of_each_step() {
  // At world size 2, rank 1's batch k is the second run of batch_size rows of step k.
  Setup x = make(22, 4);
  auto it = x.core->iter(1, 2);
  const std::vector<std::vector<int64_t>> want = {rows(4, 8), rows(12, 16), rows(20, 22)};
  CHECK(rest(*it) == want);
  CHECK_EQ(x.core->state().epoch, 1u);
  IterableProducer p(4);
  CHECK_EQ(p.consumed_after(EpochKey{0, 1, 2, 8}, 2), 8 + 2 * 4 * 2);
  CHECK_EQ(p.num_batches(0, 1), kUnknownBatches);
}

void a_break_stops_the_stream_and_the_next_epoch_starts_fresh() {
  Setup x = make(40, 4, 4);
  {
    auto it = x.core->iter(0, 1);
    DeliveredBatch b;
    CHECK(next(*it, b) == Status::kBatch);
  }  // dropped mid-epoch: its stream stops, whatever the stage read ahead
  CHECK_EQ(x.core->state().epoch, 0u);
  CHECK_EQ(x.core->state().offset, 4);
  auto it = x.core->iter(0, 1);
  const auto got = rest(*it);
  CHECK_EQ(it->epoch(), 1u);  // as DataLoader: the next iterator runs the next epoch
  CHECK_EQ(got.size(), 10u);
  CHECK(got.front() == rows(0, 4));
  x.core->close();
}

}  // namespace

TEST_MAIN(epoch_ends_where_the_source_does(); resume_and_skip_mid_epoch();
          several_live_iterators_each_read_the_epoch(); set_epoch_while_it_runs_confirms_it();
          ranks_take_their_rows_of_each_step();
          a_break_stops_the_stream_and_the_next_epoch_starts_fresh();)
