// The loader core end to end: RecordProducer over datasets written in-process,
// and a synthetic producer whose units can be slow, blocked or failing.
// Order and content, determinism across thread counts, the rules of NOTE
// [ Epochs and iterators ], exact resume (also at another world size), the
// next epoch flowing on in the same stream, errors at their batch, concurrent
// close()/next(), batches cut short by stop, worker lifetime, and a bounded
// stress test from two threads. Run under ASan+UBSan and TSan in CI.
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "cuda/device_delivery.h"
#include "cuda/fake_device_api.h"
#include "format/shard_reader.h"
#include "pipeline/loader_core.h"
#include "pipeline/placeholder_producer.h"
#include "producers/record_producer.h"
#include "sampler/sampler.h"
#include "test_threads.h"
#include "test_util.h"

using namespace stoker;
using namespace std::chrono_literals;
using Clock = LoaderCore::Clock;
using Status = LoaderCore::Iterator::Status;
using Iterator = LoaderCore::Iterator;
using Batches = std::vector<std::vector<int64_t>>;
using test::eventually;
using test::threads_named;

namespace {

// ---- datasets and producers ----------------------------------------------------

std::shared_ptr<Dataset> make_dataset(int64_t n, std::vector<ShardInfo>* shards_out = nullptr) {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, n, 37);
  if (shards_out) *shards_out = shards;
  return std::make_shared<Dataset>(test::test_schema(), shards);
}

SamplerOptions sampler(int64_t batch, bool shuffle, bool drop_last = false) {
  SamplerOptions s;
  s.batch_size = batch;
  s.shuffle = shuffle;
  s.seed = 9;
  s.drop_last = drop_last;
  return s;
}

std::shared_ptr<RecordProducer> records(std::shared_ptr<Dataset> ds, const SamplerOptions& s,
                                        int threads = 2, bool skip = false) {
  RecordOptions o;
  o.sampler = s;
  o.threads_hint = threads;
  o.skip_errors = skip;
  return std::make_shared<RecordProducer>(std::move(ds), o);
}

LoaderOptions options(int threads, int prefetch, bool next_epoch = true,
                      std::chrono::milliseconds linger = 100ms) {
  LoaderOptions o;
  o.num_threads = threads;
  o.prefetch = prefetch;
  o.prefetch_next_epoch = next_epoch;
  o.linger = linger;
  return o;
}

/// Batches of one rank's share of an epoch (or of its rest from `offset`),
/// as dataset indices: what the loader must deliver, computed without it.
Batches expected(int64_t n, const SamplerOptions& s, uint64_t epoch, int64_t rank = 0,
                 int64_t world = 1, int64_t offset = 0, int64_t pad_from = 0) {
  EpochOrder order(n, s, epoch, rank, world, offset, pad_from);
  Batches out(static_cast<size_t>(order.num_batches()));
  for (int64_t k = 0; k < order.num_batches(); ++k)
    for (int64_t p = 0; p < order.batch_length(k); ++p)
      out[static_cast<size_t>(k)].push_back(order.index(k, p));
  return out;
}

/// The epoch's global order (every rank's samples in turn), as dataset indices.
std::vector<int64_t> global_order(int64_t n, SamplerOptions s, uint64_t epoch) {
  s.batch_size = n;
  s.drop_last = false;
  return expected(n, s, epoch)[0];
}

Batches tail(const Batches& b, size_t from) { return Batches(b.begin() + from, b.end()); }
Batches head(const Batches& b, int64_t n) { return Batches(b.begin(), b.begin() + n); }

// ---- reading batches ---------------------------------------------------------------

const TensorDesc& tensor(const DeliveredBatch& b, const std::string& name) {
  for (const auto& t : b.tensors)
    if (t.name == name) return t;
  std::fprintf(stderr, "no tensor %s\n", name.c_str());
  std::exit(1);
}

std::vector<int64_t> int64s(const DeliveredBatch& b, const std::string& name) {
  const TensorDesc& t = tensor(b, name);
  std::vector<int64_t> out(static_cast<size_t>(t.shape[0]));
  std::memcpy(out.data(), b.memory.get() + t.offset, t.nbytes);
  return out;
}

std::vector<int64_t> labels(const DeliveredBatch& b) { return int64s(b, "label"); }

/// Every field of every sample of a record batch agrees with make_record(label).
bool content_ok(const DeliveredBatch& b) {
  const auto ls = labels(b);
  const TensorDesc& x = tensor(b, "x");
  const TensorDesc& tok = tensor(b, "tok");
  const TensorDesc& len = tensor(b, "tok_lengths");
  const int64_t maxlen = tok.shape[1];
  const uint8_t* m = b.memory.get();
  for (size_t j = 0; j < ls.size(); ++j) {
    const int64_t i = ls[j];
    for (int c = 0; c < 16; ++c)
      if (m[x.offset + j * 16 + c] != static_cast<uint8_t>(i % 251)) return false;
    int64_t n;
    std::memcpy(&n, m + len.offset + j * 8, 8);
    if (n != i % 5) return false;
    for (int64_t t = 0; t < maxlen; ++t) {
      int32_t v;
      std::memcpy(&v, m + tok.offset + (j * static_cast<size_t>(maxlen) + t) * 4, 4);
      if (v != (t < n ? static_cast<int32_t>(t) : 0)) return false;
    }
  }
  return true;
}

/// next(), retried while it times out.
Status next(Iterator& it, DeliveredBatch& b) {
  return RETRY_WAITS(Status::kTimeout, it.next(b, Clock::now() + 200ms));
}

/// Up to `max` batches of a record iterator, content checked.
Batches take(Iterator& it, int64_t max = INT64_MAX) {
  Batches out;
  DeliveredBatch b;
  int64_t prev = -1;
  while (static_cast<int64_t>(out.size()) < max && next(it, b) == Status::kBatch) {
    CHECK(content_ok(b));
    CHECK(!b.error);
    if (prev >= 0) CHECK_EQ(b.index, prev + 1);  // batch numbers follow each other
    prev = b.index;
    out.push_back(labels(b));
  }
  return out;
}

Batches run_epoch(LoaderCore& core, int64_t rank = 0, int64_t world = 1) {
  auto it = core.iter(rank, world);
  return take(*it);
}

std::vector<int64_t> flat(const Batches& bs) {
  std::vector<int64_t> out;
  for (const auto& b : bs) out.insert(out.end(), b.begin(), b.end());
  return out;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// ---- a synthetic producer --------------------------------------------------------

/// Batch k of epoch e holds int64 values e * 1e6 + (sample index), written by
/// `units` units; units may sleep (in 1 ms slices, returning early on stop),
/// block until stopped, and planning may fail at a chosen batch or epoch.
struct SynthConfig {
  int64_t samples = 60;
  int64_t batch = 6;
  int units = 3;
  std::atomic<int64_t> fail_plan_batch{-1};
  std::atomic<uint64_t> fail_batch_epoch{UINT64_MAX};  // fail_plan_batch in this epoch only
  uint64_t fail_plan_epoch = UINT64_MAX;
  std::atomic<int> unit_sleep_ms{0};
  std::atomic<int> stubborn_sleep_ms{0};  // a sleep that does not look at the stop flag
  std::atomic<bool> block_units{false};   // units wait until stopped (at most 10 s)
  std::atomic<int64_t> slow_batch{-1};    // units of this batch (of any epoch) sleep ...
  std::atomic<int> slow_batch_ms{0};      // ... this long, looking at the stop flag
  std::atomic<int64_t> units_started{0}, units_cut{0}, units_done{0};

  SamplerOptions sampler() const { return ::sampler(batch, false); }
};

int64_t synth_value(uint64_t epoch, int64_t index) {
  return static_cast<int64_t>(epoch) * 1000000 + index;
}

class SynthEpoch final : public EpochPlan {
 public:
  SynthEpoch(EpochOrder o, uint64_t e) : order(std::move(o)), epoch(e) {}
  int64_t num_batches() const override { return order.num_batches(); }
  const EpochOrder order;
  const uint64_t epoch;
};

class SynthWork final : public BatchWork {
 public:
  SynthWork(std::shared_ptr<SynthConfig> cfg, std::vector<int64_t> values, int64_t k)
      : cfg_(std::move(cfg)), values_(std::move(values)), k_(k) {}
  void run(int u, uint8_t* base, WorkerContext& ctx) override {
    cfg_->units_started.fetch_add(1);
    const int64_t len = static_cast<int64_t>(values_.size());
    const int64_t lo = len * u / units, hi = len * (u + 1) / units;
    std::this_thread::sleep_for(std::chrono::milliseconds(cfg_->stubborn_sleep_ms.load()));
    const int sleep_ms = cfg_->unit_sleep_ms.load() +
                         (k_ == cfg_->slow_batch.load() ? cfg_->slow_batch_ms.load() : 0);
    for (int i = 0; i < sleep_ms; ++i) {
      if (ctx.stopped()) {
        cfg_->units_cut.fetch_add(1);
        return;
      }
      std::this_thread::sleep_for(1ms);
    }
    if (cfg_->block_units.load()) {
      const auto end = Clock::now() + 10s;
      while (!ctx.stopped() && Clock::now() < end) std::this_thread::sleep_for(1ms);
      if (ctx.stopped()) {
        cfg_->units_cut.fetch_add(1);
        return;
      }
    }
    for (int64_t j = lo; j < hi; ++j)
      std::memcpy(base + j * 8, &values_[static_cast<size_t>(j)], 8);
    cfg_->units_done.fetch_add(1);
  }

 private:
  std::shared_ptr<SynthConfig> cfg_;
  std::vector<int64_t> values_;
  int64_t k_;
};

class SynthProducer final : public BatchProducer {
 public:
  explicit SynthProducer(std::shared_ptr<SynthConfig> cfg) : cfg_(std::move(cfg)) {}
  int64_t rank_samples(int64_t rank, int64_t world) const override {
    return EpochOrder(cfg_->samples, cfg_->sampler(), 0, rank, world, 0).num_samples();
  }
  int64_t num_batches(int64_t rank, int64_t world) const override {
    return EpochOrder(cfg_->samples, cfg_->sampler(), 0, rank, world, 0).num_batches();
  }
  int64_t epoch_samples() const override { return cfg_->samples; }
  int64_t consumed_after(const EpochKey& k, int64_t batches) const override {
    return order(k).consumed_after(batches);
  }
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& k) const override {
    if (k.epoch == cfg_->fail_plan_epoch)
      throw DataError("cannot plan epoch " + std::to_string(k.epoch));
    return std::make_shared<SynthEpoch>(order(k), k.epoch);
  }
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& plan, int64_t k) const override {
    const auto& e = static_cast<const SynthEpoch&>(plan);
    if (k == cfg_->fail_plan_batch &&
        (cfg_->fail_batch_epoch == UINT64_MAX || cfg_->fail_batch_epoch == e.epoch))
      throw DataError("cannot plan batch " + std::to_string(k));
    std::vector<int64_t> values;
    for (int64_t p = 0; p < e.order.batch_length(k); ++p)
      values.push_back(synth_value(e.epoch, e.order.index(k, p)));
    const auto len = static_cast<int64_t>(values.size());
    auto w = std::make_unique<SynthWork>(cfg_, std::move(values), k);
    w->tensors.push_back(TensorDesc{"v", DType::kInt64, {len}, 0, static_cast<size_t>(len) * 8});
    w->bytes = static_cast<size_t>(len) * 8;
    w->units = static_cast<int>(std::min<int64_t>(cfg_->units, len));
    w->samples = len;
    return w;
  }

 private:
  EpochOrder order(const EpochKey& k) const {
    return EpochOrder(cfg_->samples, cfg_->sampler(), k.epoch, k.rank, k.world_size, k.offset);
  }
  std::shared_ptr<SynthConfig> cfg_;
};

std::vector<int64_t> synth_expected(const SynthConfig& c, uint64_t epoch, int64_t k) {
  const Batches all = expected(c.samples, c.sampler(), epoch);
  std::vector<int64_t> out;
  for (int64_t i : all[static_cast<size_t>(k)]) out.push_back(synth_value(epoch, i));
  return out;
}

// ---- order, content, determinism ------------------------------------------------

void order_and_content() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(301);
  auto core = LoaderCore::create(records(ds, sampler(16, false)), options(3, 2));
  {
    // Before any batch the derived numbers are zeros, not divisions by zero.
    const LoaderStatsSnapshot st = core->stats();
    CHECK(st.samples_per_second == 0 && st.data_stall == 0 && st.copy_gbps == 0);
    CHECK(st.stage_seconds_per_batch.read == 0 && st.stage_seconds_per_batch.copy == 0);
    CHECK_EQ(st.bottleneck, std::string("unknown"));
  }
  CHECK_EQ(core->num_batches(0, 1), 19);
  auto it = core->iter(0, 1);
  CHECK_EQ(it->remaining(), 19);
  Batches got;
  DeliveredBatch b;
  while (next(*it, b) == Status::kBatch) {
    CHECK(content_ok(b));
    CHECK_EQ(b.index, static_cast<int64_t>(got.size()));
    CHECK_EQ(b.device, -1);
    CHECK(!b.error);
    got.push_back(labels(b));
  }
  CHECK_EQ(got.size(), 19u);
  CHECK(got == expected(301, sampler(16, false), 0));
  int64_t want = 0;
  for (int64_t v : flat(got)) CHECK_EQ(v, want++);
  CHECK(next(*it, b) == Status::kEnd);  // stays ended
  CHECK_EQ(it->remaining(), 0);
  const LoaderStatsSnapshot st = core->stats();
  CHECK_EQ(st.batches, 19);
  CHECK_EQ(st.samples, 301);
  CHECK(st.bytes_read > 0);
  CHECK_EQ(st.num_threads, 3);
  CHECK_EQ(st.prefetch, 2);
  CHECK(st.first_batch_seconds >= 0);
  CHECK(st.host_blocks >= 1);
  // What Python reports is derived here (pipeline/loader_telemetry.h).
  const auto near = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::abs(b); };
  CHECK(st.run_seconds > 0 && st.read_seconds > 0);
  CHECK(near(st.samples_per_second, 301 / st.run_seconds));
  CHECK(near(st.data_stall, std::min(1.0, st.wait_seconds / st.run_seconds)));
  CHECK(st.data_stall > 0 && st.data_stall <= 1);
  CHECK(near(st.stage_seconds_per_batch.read, st.read_seconds / 19));
  CHECK(near(st.stage_seconds_per_batch.decode, st.decode_seconds / 19));
  CHECK(near(st.stage_seconds_per_batch.plan, st.plan_seconds / 19));
  CHECK(st.stage_seconds_per_batch.ops == 0 && st.stage_seconds_per_batch.copy == 0);
  CHECK(st.copy_gbps == 0);

  // Shuffled, ranks and drop_last: what the sampler says, nothing else.
  for (bool drop_last : {false, true})
    for (int64_t world : {1, 3}) {
      const SamplerOptions s = sampler(16, true, drop_last);
      auto c = LoaderCore::create(records(ds, s), options(2, 3));
      for (int64_t rank = 0; rank < world; ++rank) {
        CHECK_EQ(c->num_batches(rank, world),
                 static_cast<int64_t>(expected(301, s, 0, rank, world).size()));
        c->set_epoch(4);
        CHECK(run_epoch(*c, rank, world) == expected(301, s, 4, rank, world));
      }
    }
  // Kept batches stay intact while later ones are assembled.
  auto keep = LoaderCore::create(records(ds, sampler(8, true)), options(3, 2));
  std::vector<DeliveredBatch> kept;
  {
    auto k = keep->iter(0, 1);
    while (next(*k, b) == Status::kBatch) kept.push_back(b);
  }
  CHECK_EQ(kept.size(), 38u);
  Batches kept_labels;
  for (const auto& kb : kept) {
    CHECK(content_ok(kb));
    kept_labels.push_back(labels(kb));
  }
  CHECK(kept_labels == expected(301, sampler(8, true), 0));
}

// The same batches for any thread count and prefetch, host or fake device.
void determinism() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(203);
  const SamplerOptions s = sampler(10, true);
  const Batches want0 = expected(203, s, 0), want1 = expected(203, s, 1);
  for (int threads : {1, 2, 5})
    for (int prefetch : {1, 3, 8})
      for (bool device : {false, true}) {
        if (device && threads == 2) continue;  // enough coverage, less time
        LoaderOptions o = options(threads, prefetch);
        std::shared_ptr<FakeDeviceApi> api;
        if (device) {
          api = fake_device_api({0, 20us});
          o.delivery = std::make_shared<DeviceDelivery>(api, prefetch);
        }
        auto core = LoaderCore::create(records(ds, s, threads), o);
        CHECK(run_epoch(*core) == want0);
        CHECK(run_epoch(*core) == want1);
        if (device) {
          CHECK(eventually([&] { return core->stats().copies >= 42; }));
          const LoaderStatsSnapshot st = core->stats();
          CHECK(st.device_buffers >= 1);
          CHECK(st.copy_seconds > 0);
          CHECK(std::abs(st.copy_gbps - st.copy_bytes / st.copy_seconds * 1e-9) <=
                1e-9 * st.copy_gbps);
          CHECK(std::abs(st.stage_seconds_per_batch.copy - st.copy_seconds / st.copies) <=
                1e-9 * st.stage_seconds_per_batch.copy);
        }
      }
}

// ---- NOTE [ Epochs and iterators ] -------------------------------------------------

void epochs_and_iterators() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(100);
  const SamplerOptions s = sampler(10, true);
  auto exp = [&](uint64_t e) { return expected(100, s, e); };
  auto core = LoaderCore::create(records(ds, s), options(2, 3));
  DeliveredBatch b;

  // An iterator never advanced uses no epoch, whether dropped or closed.
  CHECK_EQ(core->epoch(), 0u);
  {
    auto it = core->iter(0, 1);
    CHECK(!it->claimed());
    CHECK_EQ(it->epoch(), 0u);
    CHECK_EQ(it->remaining(), 10);
  }
  {
    auto it = core->iter(0, 1);
    it->close();
    CHECK(it->next(b, Clock::now() + 1s) == Status::kEnd);
    CHECK(!it->claimed());
  }
  CHECK_EQ(core->epoch(), 0u);
  CHECK_EQ(core->state().epoch, 0u);
  CHECK_EQ(core->state().offset, 0);
  CHECK(run_epoch(*core) == exp(0));
  CHECK_EQ(core->epoch(), 1u);

  // set_epoch(e): the next iterator runs e, then e + 1.
  core->set_epoch(3);
  CHECK_EQ(core->epoch(), 3u);
  CHECK(run_epoch(*core) == exp(3));
  CHECK_EQ(core->epoch(), 4u);

  // set_epoch of the running epoch confirms it: the next iterator runs the one after.
  {
    auto it = core->iter(0, 1);
    Batches got = take(*it, 1);
    CHECK(it->claimed());
    CHECK_EQ(it->epoch(), 4u);
    core->set_epoch(4);
    CHECK_EQ(core->epoch(), 5u);
    Batches rest = take(*it);
    got.insert(got.end(), rest.begin(), rest.end());
    CHECK(got == exp(4));
  }
  CHECK(run_epoch(*core) == exp(5));

  // set_epoch of another epoch while one runs applies to the next iterator.
  {
    auto it = core->iter(0, 1);
    Batches got = take(*it, 2);
    core->set_epoch(8);
    CHECK_EQ(core->epoch(), 8u);
    CHECK_EQ(it->epoch(), 6u);
    Batches rest = take(*it);
    got.insert(got.end(), rest.begin(), rest.end());
    CHECK(got == exp(6));
  }
  CHECK(run_epoch(*core) == exp(8));
  CHECK(run_epoch(*core) == exp(9));
  // After an epoch is over, set_epoch of it runs it again (an explicit request).
  core->set_epoch(9);
  CHECK(run_epoch(*core) == exp(9));
  CHECK_EQ(core->epoch(), 10u);
}

// Several live iterators each yield their full epoch: zip(loader, loader),
// and peeking with next(iter(loader)) inside a loop changes nothing for it.
void concurrent_iterators() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(100);
  const SamplerOptions s = sampler(10, true);
  auto core = LoaderCore::create(records(ds, s), options(2, 2));
  core->set_epoch(2);
  {
    auto a = core->iter(0, 1), c = core->iter(0, 1);
    Batches ga, gc;
    DeliveredBatch b;
    for (;;) {
      const Status sa = next(*a, b);
      if (sa == Status::kBatch) {
        CHECK(content_ok(b));
        ga.push_back(labels(b));
      }
      const Status sc = next(*c, b);
      if (sc == Status::kBatch) {
        CHECK(content_ok(b));
        gc.push_back(labels(b));
      }
      if (sa == Status::kEnd && sc == Status::kEnd) break;
    }
    CHECK(ga == expected(100, s, 2));
    CHECK(gc == expected(100, s, 2));
  }
  CHECK_EQ(core->epoch(), 3u);  // the epoch ran once
  {
    auto it = core->iter(0, 1);
    Batches got = take(*it, 3);
    CHECK((core->state().epoch == 3 && core->state().offset == 30));
    {
      auto peek = core->iter(0, 1);
      Batches p = take(*peek, 1);
      CHECK(p[0] == expected(100, s, 3)[0]);
      CHECK_EQ(peek->epoch(), 3u);
    }
    CHECK((core->state().epoch == 3 && core->state().offset == 30));  // the peek changed nothing
    Batches rest = take(*it);
    got.insert(got.end(), rest.begin(), rest.end());
    CHECK(got == expected(100, s, 3));
  }
  CHECK_EQ(core->epoch(), 4u);
  CHECK((core->state().epoch == 4 && core->state().offset == 0));
}

// state()/load_state(): the rest of the epoch exactly, with another thread
// count, and at another world size.
void resume() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(101);
  const SamplerOptions s = sampler(4, true);
  const Batches ref = expected(101, s, 2);
  LoaderState st;
  {
    auto core = LoaderCore::create(records(ds, s), options(2, 3));
    core->set_epoch(2);
    auto it = core->iter(0, 1);
    CHECK(take(*it, 5) == head(ref, 5));
    st = core->state();
    CHECK_EQ(st.epoch, 2u);
    CHECK_EQ(st.offset, 20);
  }
  {
    auto core = LoaderCore::create(records(ds, s, 5), options(5, 1));
    core->load_state(st);
    CHECK_EQ(core->epoch(), 2u);
    CHECK_EQ(core->state().offset, 20);
    core->set_epoch(2);  // a training loop calls set_epoch again: the resume point holds
    auto it = core->iter(0, 1);
    CHECK_EQ(it->remaining(), static_cast<int64_t>(ref.size()) - 5);
    CHECK(take(*it) == tail(ref, 5));
    CHECK((core->state().epoch == 3 && core->state().offset == 0));
    CHECK(run_epoch(*core) == expected(101, s, 3));  // then whole epochs again
  }
  {
    // set_epoch of another epoch drops the resume point.
    auto core = LoaderCore::create(records(ds, s), options(2, 2));
    core->load_state(st);
    core->set_epoch(7);
    CHECK(run_epoch(*core) == expected(101, s, 7));
    // A complete epoch resumes at the next one; bad offsets are refused.
    core->load_state(LoaderState{4, 101});
    CHECK_EQ(core->epoch(), 5u);
    CHECK(run_epoch(*core) == expected(101, s, 5));
    CHECK_THROWS(UsageError, core->load_state(LoaderState{4, 102}));
    CHECK_THROWS(UsageError, core->load_state(LoaderState{4, -1}));
    // load_state while an iterator runs: the next iterator resumes there.
    auto it = core->iter(0, 1);
    take(*it, 2);
    core->load_state(st);
    CHECK(run_epoch(*core) == tail(ref, 5));
  }

  // World size 2 -> 3. Each rank has its own core, as separate processes do.
  const std::vector<int64_t> order = global_order(101, s, 1);
  std::vector<int64_t> consumed;
  std::vector<LoaderState> states;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto core = LoaderCore::create(records(ds, s), options(2, 2));
    core->set_epoch(1);
    auto it = core->iter(rank, 2);
    const Batches got = take(*it, 5);
    CHECK(got == head(expected(101, s, 1, rank, 2), 5));
    for (int64_t v : flat(got)) consumed.push_back(v);
    states.push_back(core->state());
  }
  CHECK((states[0].epoch == states[1].epoch && states[0].offset == states[1].offset));
  CHECK_EQ(states[0].offset, 40);  // 5 batches of 4 on each of 2 ranks
  CHECK(sorted(consumed) == sorted(std::vector<int64_t>(order.begin(), order.begin() + 40)));
  std::vector<int64_t> rest;
  for (int64_t rank = 0; rank < 3; ++rank) {
    auto core = LoaderCore::create(records(ds, s, 3), options(3, 2));
    core->load_state(states[0]);
    const Batches got = run_epoch(*core, rank, 3);
    // At another world size the padding restarts at the first unconsumed sample.
    CHECK(got == expected(101, s, 1, rank, 3, 40, 40));
    for (int64_t v : flat(got)) rest.push_back(v);
  }
  // The unconsumed 61 samples, each once, plus the wrap padding: 3 ranks of
  // ceil(61 / 3) = 21 samples take 2 more, from the start of the unconsumed part
  // (never a sample the job has consumed already).
  std::vector<int64_t> want(order.begin() + 40, order.end());
  want.insert(want.end(), order.begin() + 40, order.begin() + 42);
  CHECK_EQ(rest.size(), 63u);
  CHECK(sorted(rest) == sorted(want));
}

// skip(n): the next iterator starts at batch n of its epoch; a set_epoch before it
// moves the skip to that epoch; an iterator takes it; load_state drops it.
void skip_batches() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(101);
  const SamplerOptions s = sampler(4, true);
  auto core = LoaderCore::create(records(ds, s), options(2, 3));
  core->skip(3, 0, 1);
  CHECK((core->state().epoch == 0 && core->state().offset == 12));
  CHECK(run_epoch(*core) == tail(expected(101, s, 0), 3));
  CHECK(run_epoch(*core) == expected(101, s, 1));  // taken: the next epoch is whole
  core->skip(2, 0, 1);
  core->set_epoch(5);  // transformers' Trainer skips first, sets the epoch after
  CHECK((core->state().epoch == 5 && core->state().offset == 8));
  CHECK(run_epoch(*core) == tail(expected(101, s, 5), 2));
  core->skip(4, 1, 2);  // rank 1 of 2: four batches of every rank, 32 samples
  CHECK_EQ(core->state().offset, 32);
  core->load_state(LoaderState{9, 0, 1});
  core->set_epoch(9);  // the skip was dropped: nothing moves to epoch 9
  CHECK(run_epoch(*core) == expected(101, s, 9));
  CHECK_THROWS(UsageError, core->skip(-1, 0, 1));
}

// run_part(key, first, count): the next iterator yields exactly batches [first, first +
// count) of segment `key`, for a whole epoch's key and for a resumed one at another
// world size (pad_from), on a core that has run other epochs; then it ends, and the
// core runs whole epochs again (NOTE [ Parts ]).
void parts() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(101);
  const SamplerOptions s = sampler(4, true);
  auto core = LoaderCore::create(records(ds, s, 3), options(3, 4));
  CHECK(run_epoch(*core) == expected(101, s, 0));
  struct Case {
    EpochKey key;
    int64_t first, count;
  };
  const std::vector<Case> cases = {
      {EpochKey{3, 0, 1, 0, 0}, 0, 26},   // a whole epoch
      {EpochKey{3, 0, 1, 0, 0}, 5, 3},    // from its middle
      {EpochKey{3, 0, 1, 0, 0}, 25, 1},   // its last, short batch
      {EpochKey{4, 2, 3, 0, 0}, 7, 2},    // rank 2 of 3, padded at the end
      {EpochKey{4, 1, 3, 40, 40}, 2, 4},  // resumed at another world size: padding from 40
      {EpochKey{4, 0, 2, 40, 0}, 1, 7},   // resumed at the same world size
  };
  for (const Case& c : cases) {
    const Batches all =
        expected(101, s, c.key.epoch, c.key.rank, c.key.world_size, c.key.offset, c.key.pad_from);
    core->run_part(c.key, c.first, c.count);
    auto it = core->iter(c.key.rank, c.key.world_size);
    if (c.first == 0) CHECK(it->key() == c.key);
    CHECK_EQ(it->remaining(), c.count);
    const Batches got = take(*it);
    CHECK(got == Batches(all.begin() + c.first, all.begin() + c.first + c.count));
  }
  // The next iterator runs the epoch after the last part's, whole.
  CHECK(run_epoch(*core) == expected(101, s, 5));
  {
    // The stream of a part ends with it: with a window of 8 and slow units, the
    // workers ran the part's 2 batches and nothing past them.
    auto cfg = std::make_shared<SynthConfig>();
    cfg->unit_sleep_ms = 2;
    auto synth = LoaderCore::create(std::make_shared<SynthProducer>(cfg), options(2, 8));
    synth->run_part(EpochKey{1, 0, 1, 0, 0}, 3, 2);
    auto it = synth->iter(0, 1);
    DeliveredBatch b;
    CHECK(next(*it, b) == Status::kBatch);
    CHECK(next(*it, b) == Status::kBatch);
    CHECK(next(*it, b) == Status::kEnd);
    std::this_thread::sleep_for(30ms);
    CHECK_EQ(cfg->units_started.load(), 2 * cfg->units);
  }
  // A part outside its segment is refused; load_state() and another epoch drop it.
  CHECK_THROWS(UsageError, core->run_part(EpochKey{1, 0, 1, 0, 0}, 20, 7));
  CHECK_THROWS(UsageError, core->run_part(EpochKey{1, 3, 2, 0, 0}, 0, 1));
  core->run_part(EpochKey{1, 0, 1, 0, 0}, 2, 2);
  core->load_state(LoaderState{6, 0, 1});
  CHECK(run_epoch(*core) == expected(101, s, 6));
  core->run_part(EpochKey{1, 0, 1, 0, 0}, 2, 2);
  core->set_epoch(8);
  CHECK(run_epoch(*core) == expected(101, s, 8));
}

// A core over placeholders keeps the epochs, counts and resume state of the real
// producer (NOTE [ Placeholder batches ]): its iterators' keys are the segments the
// real loader's would run, and its state follows the placeholders taken.
void placeholders() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(101);
  const SamplerOptions s = sampler(4, true);
  auto real = records(ds, s);
  auto core = LoaderCore::create(std::make_shared<PlaceholderProducer>(real), options(1, 4));
  CHECK_EQ(core->num_batches(1, 2), real->num_batches(1, 2));
  core->load_state(LoaderState{2, 40, 2});
  auto it = core->iter(1, 3);
  CHECK((it->key() == EpochKey{2, 1, 3, 40, 40}));  // before the claim: the one it would claim
  it->claim();
  CHECK_EQ(core->state().offset, 0 + 40);
  CHECK_EQ(it->remaining(), static_cast<int64_t>(expected(101, s, 2, 1, 3, 40, 40).size()));
  DeliveredBatch b;
  for (int k = 0; k < 3; ++k) {
    CHECK(next(*it, b) == Status::kBatch);
    CHECK(b.tensors.empty());
  }
  CHECK_EQ(core->state().offset, 40 + 3 * 4 * 3);
  CHECK((it->key() == EpochKey{2, 1, 3, 40, 40}));
}

// The next epoch flows on in the same stream (NOTE [ Next-epoch prefetch ]).
void next_epoch_flows_on() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(90);
  const SamplerOptions s = sampler(10, true);
  for (bool call_set_epoch : {false, true}) {
    auto core = LoaderCore::create(records(ds, s), options(2, 3));
    for (uint64_t e = 0; e < 4; ++e) {
      if (call_set_epoch) core->set_epoch(e);
      CHECK(run_epoch(*core) == expected(90, s, e));
    }
    CHECK_EQ(core->stats().streams, 1);
  }
  {
    // The next epoch's first batches are assembled before any iter() asks,
    // within the window: prefetch batches, no more.
    auto cfg = std::make_shared<SynthConfig>();
    auto core = LoaderCore::create(std::make_shared<SynthProducer>(cfg), options(2, 3));
    {
      auto it = core->iter(0, 1);
      DeliveredBatch b;
      while (next(*it, b) == Status::kBatch) {
      }
    }
    CHECK(eventually([&] { return cfg->units_done.load() == 3 * (10 + 3); }));
    std::this_thread::sleep_for(30ms);
    CHECK_EQ(cfg->units_done.load(), 3 * (10 + 3));
    auto it = core->iter(0, 1);
    DeliveredBatch b;
    CHECK(next(*it, b) == Status::kBatch);
    CHECK_EQ(it->epoch(), 1u);
    CHECK(int64s(b, "v") == synth_expected(*cfg, 1, 0));
    CHECK_EQ(core->stats().streams, 1);
  }
  {
    auto core = LoaderCore::create(records(ds, s), options(2, 3, false));
    for (uint64_t e = 0; e < 3; ++e) CHECK(run_epoch(*core) == expected(90, s, e));
    CHECK_EQ(core->stats().streams, 3);
  }
  // Leaving an epoch early: the next iterator still gets exactly its epoch,
  // and set_epoch to another epoch, load_state and another world size drop
  // the stream that flowed on.
  auto core = LoaderCore::create(records(ds, s), options(2, 3));
  for (int64_t k : {2, 8, 0, 9}) {
    const uint64_t e = core->epoch();
    {
      auto it = core->iter(0, 1);
      CHECK(take(*it, k) == head(expected(90, s, e), k));
      if (k == 8) std::this_thread::sleep_for(20ms);  // the workers reach the next epoch
    }
    const uint64_t next_epoch = k == 0 ? e : e + 1;
    CHECK(run_epoch(*core) == expected(90, s, next_epoch));
  }
  core->set_epoch(20);
  CHECK(run_epoch(*core) == expected(90, s, 20));
  core->load_state(LoaderState{30, 50});
  CHECK(run_epoch(*core) == expected(90, s, 30, 0, 1, 50));
  CHECK(run_epoch(*core, 1, 2) == expected(90, s, 31, 1, 2));
  CHECK(run_epoch(*core) == expected(90, s, 32));
}

// ---- errors ------------------------------------------------------------------

// A corrupt record's error arrives at its batch and ends the iterator; with
// skip_errors the sample is replaced by the next valid one.
void corrupt_record_error_at_its_batch() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  std::vector<ShardInfo> shards;
  make_dataset(100, &shards);
  // Corrupt a payload byte of global record 50 (shard 1, record 13).
  {
    ShardReader r(shards[1].path, test::test_schema().hash, -1, -1);
    RecordView v = r.record(13);
    const long off = static_cast<long>(v.data - r.record(0).data) + 64 + 14;
    std::FILE* f = std::fopen(shards[1].path.c_str(), "r+b");
    std::fseek(f, off, SEEK_SET);
    int c = std::fgetc(f);
    std::fseek(f, off, SEEK_SET);
    std::fputc(c ^ 1, f);
    std::fclose(f);
  }
  auto ds = std::make_shared<Dataset>(test::test_schema(), shards);
  for (int threads : {1, 4}) {
    auto core = LoaderCore::create(records(ds, sampler(10, false), threads), options(threads, 3));
    for (int round = 0; round < 2; ++round) {  // and again for a new iterator
      auto it = core->iter(0, 1);
      CHECK_EQ(take(*it, 5).size(), 5u);
      bool thrown = false;
      DeliveredBatch b;
      try {
        next(*it, b);
      } catch (const DataError& err) {
        thrown = std::strstr(err.what(), "record 13") != nullptr &&
                 std::strstr(err.what(), "shard-1") != nullptr;
      }
      CHECK(thrown);
      // the failed batch is consumed; the batches after it follow, then the end
      CHECK_EQ(take(*it, 10).size(), 4u);
    }
  }
  auto skip = LoaderCore::create(records(ds, sampler(10, false), 4, true), options(4, 3));
  const Batches got = run_epoch(*skip);
  CHECK_EQ(got.size(), 10u);
  CHECK_EQ(got[5][0], 51);
  CHECK_EQ(skip->stats().skipped, 1);
}

// A planning error reaches the consumer at its batch instead of hanging it;
// an epoch that cannot be planned fails the next() that claims it.
void planning_errors() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto cfg = std::make_shared<SynthConfig>();
  cfg->fail_plan_batch = 3;
  auto core = LoaderCore::create(std::make_shared<SynthProducer>(cfg), options(2, 4));
  for (uint64_t e = 0; e < 2; ++e) {
    auto it = core->iter(0, 1);
    DeliveredBatch b;
    for (int64_t k = 0; k < 3; ++k) {
      CHECK(next(*it, b) == Status::kBatch);
      CHECK(int64s(b, "v") == synth_expected(*cfg, e, k));
    }
    bool thrown = false;
    try {
      next(*it, b);
    } catch (const DataError& err) {
      thrown = std::strstr(err.what(), "cannot plan batch 3") != nullptr;
    }
    CHECK(thrown);
    // the failed batch is consumed; the batches after it follow, then the end
    for (int64_t k = 4; k < 10; ++k) {
      CHECK(next(*it, b) == Status::kBatch);
      CHECK(int64s(b, "v") == synth_expected(*cfg, e, k));
    }
    CHECK(next(*it, b) == Status::kEnd);
  }

  auto cfg2 = std::make_shared<SynthConfig>();
  cfg2->fail_plan_epoch = 1;
  auto core2 = LoaderCore::create(std::make_shared<SynthProducer>(cfg2), options(2, 4));
  {
    auto it = core2->iter(0, 1);
    DeliveredBatch b;
    int n = 0;
    while (next(*it, b) == Status::kBatch) ++n;
    CHECK_EQ(n, 10);
  }
  for (int round = 0; round < 2; ++round) {  // the flow-on failed; the claim reports it
    auto it = core2->iter(0, 1);
    DeliveredBatch b;
    CHECK_THROWS(DataError, it->next(b, Clock::now() + 5s));
  }
  core2->set_epoch(2);
  {
    auto it = core2->iter(0, 1);
    DeliveredBatch b;
    CHECK(next(*it, b) == Status::kBatch);
    CHECK(int64s(b, "v") == synth_expected(*cfg2, 2, 0));
  }
}

// An error near an epoch's end, when the stream has already flowed into the
// next epoch: the next iterator starts cleanly, with host and device delivery.
void error_at_epoch_end_then_new_iterator() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  for (bool device : {false, true}) {
    auto cfg = std::make_shared<SynthConfig>();
    cfg->units = 1;
    cfg->fail_plan_batch = 8;
    cfg->fail_batch_epoch = 0;
    LoaderOptions o = options(2, 3);
    std::shared_ptr<FakeDeviceApi> api;
    if (device) {
      api = fake_device_api({0, 0us});
      o.delivery = std::make_shared<DeviceDelivery>(api, o.prefetch);
    }
    auto core = LoaderCore::create(std::make_shared<SynthProducer>(cfg), o);
    std::printf("  %s delivery\n", device ? "device" : "host");
    {
      auto it = core->iter(0, 1);
      DeliveredBatch b;
      for (int k = 0; k < 8; ++k) CHECK(next(*it, b) == Status::kBatch);
      std::this_thread::sleep_for(50ms);  // the workers reach the next epoch
      CHECK_THROWS(DataError, next(*it, b));
      CHECK(next(*it, b) == Status::kBatch);  // the failed batch consumed, the last one
      CHECK_EQ(b.index, 9);
      CHECK(next(*it, b) == Status::kEnd);
    }
    auto it = core->iter(0, 1);
    DeliveredBatch b;
    int64_t n = 0;
    while (next(*it, b) == Status::kBatch) {  // throws the old error if the stream was kept
      CHECK_EQ(b.index, n);
      CHECK(int64s(b, "v") == synth_expected(*cfg, 1, n));
      ++n;
    }
    CHECK_EQ(n, 10);

    // Leaving epoch 2 before its bad batch 9: the next iterator drops the
    // rest of epoch 2, error included, and gets epoch 3 whole.
    cfg->fail_plan_batch = 9;
    cfg->fail_batch_epoch = 2;
    {
      auto left = core->iter(0, 1);
      for (int k = 0; k < 7; ++k) CHECK(next(*left, b) == Status::kBatch);
      CHECK_EQ(left->epoch(), 2u);
      std::this_thread::sleep_for(50ms);  // the workers reach epoch 3
    }
    auto after = core->iter(0, 1);
    n = 0;
    while (next(*after, b) == Status::kBatch) {
      CHECK_EQ(b.index, n);
      CHECK(int64s(b, "v") == synth_expected(*cfg, 3, n));
      ++n;
    }
    CHECK_EQ(after->epoch(), 3u);
    CHECK_EQ(n, 10);
  }
}

// ---- threads -------------------------------------------------------------------

// close() from two threads at once while a third is blocked in next().
void close_from_two_threads() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto cfg = std::make_shared<SynthConfig>();
  cfg->unit_sleep_ms = 100;
  auto core = LoaderCore::create(std::make_shared<SynthProducer>(cfg), options(2, 2));
  const int rounds = 6;
  for (int round = 0; round < rounds; ++round) {
    auto it = core->iter(0, 1);
    std::atomic<int> result{-1};
    std::thread reader([&] {
      DeliveredBatch b;
      Status s;
      while ((s = next(*it, b)) == Status::kBatch) {
        if (int64s(b, "v") != synth_expected(*cfg, it->epoch(), b.index)) result.store(99);
      }
      if (result.load() != 99) result.store(static_cast<int>(s));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(10 + 20 * (round % 3)));
    std::atomic<int> go{0};
    auto closer = [&] {
      go.fetch_add(1);
      while (go.load() < 2) std::this_thread::yield();
      core->close();
    };
    std::thread c1(closer), c2(closer);
    c1.join();
    c2.join();
    reader.join();
    CHECK(result.load() == static_cast<int>(Status::kEnd));
    CHECK_EQ(threads_named("stoker-worker-"), 0);
    CHECK_EQ(core->stats().live_workers, 0);
  }
  // The loader stays usable.
  cfg->unit_sleep_ms = 0;
  auto it = core->iter(0, 1);
  DeliveredBatch b;
  int64_t n = 0;
  while (next(*it, b) == Status::kBatch) {
    CHECK(int64s(b, "v") == synth_expected(*cfg, it->epoch(), b.index));
    ++n;
  }
  CHECK_EQ(n, 10);
}

// close() on one thread while another starts a new iterator: the new
// iterator's stream gets workers, though it came while close() was still
// joining the old ones (slow to notice: a unit that ignores the stop flag).
void close_while_an_iterator_starts() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto cfg = std::make_shared<SynthConfig>();
  auto core = LoaderCore::create(std::make_shared<SynthProducer>(cfg), options(2, 2));
  for (int round = 0; round < 3; ++round) {
    cfg->stubborn_sleep_ms = 300;
    auto old_it = core->iter(0, 1);
    DeliveredBatch b;
    CHECK(old_it->next(b, Clock::now()) == Status::kTimeout);  // claimed; units are running
    CHECK(eventually([&] { return cfg->units_started.load() >= 2 * (round + 1); }));
    std::thread closer([&] { core->close(); });  // joins workers stuck in their sleep
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + 40 * round));
    cfg->stubborn_sleep_ms = 0;
    auto it = core->iter(0, 1);
    const auto t0 = Clock::now();
    Status s = Status::kTimeout;
    while (s == Status::kTimeout && Clock::now() - t0 < 20s) s = it->next(b, Clock::now() + 100ms);
    CHECK(s == Status::kBatch);  // not a stall: the workers came back for this stream
    CHECK(int64s(b, "v") == synth_expected(*cfg, it->epoch(), b.index));
    closer.join();
    it.reset();
    old_it.reset();
    core->close();
  }
}

// close() on an iterator whose next() runs on another thread, near the end
// of its epoch: its stream, which already flowed into the next epoch, is not
// handed to the next iterator while that next() may still read from it.
void close_during_next_near_epoch_end() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto cfg = std::make_shared<SynthConfig>();
  cfg->units = 1;  // one worker on the slow batch, the other reaches the next epoch
  auto core = LoaderCore::create(std::make_shared<SynthProducer>(cfg), options(2, 3));
  for (int round = 0; round < 3; ++round) {
    cfg->slow_batch = 8;
    cfg->slow_batch_ms = 400;
    auto a = core->iter(0, 1);
    const uint64_t epoch = core->epoch();
    DeliveredBatch b;
    for (int k = 0; k < 8; ++k) CHECK(next(*a, b) == Status::kBatch);
    std::this_thread::sleep_for(60ms);  // batch 9 and the next epoch's batch 0 are done
    std::atomic<int> result{-1};
    std::atomic<int64_t> index{-2};
    std::thread reader([&] {  // waits for the slow batch 8
      DeliveredBatch rb;
      const Status s = a->next(rb, Clock::now() + 10s);  // one wait, across the close()
      index.store(s == Status::kBatch ? rb.index : -1);
      if (s == Status::kBatch && int64s(rb, "v") != synth_expected(*cfg, epoch, rb.index))
        index.store(-3);
      result.store(static_cast<int>(s));
    });
    std::this_thread::sleep_for(30ms);
    a->close();
    cfg->slow_batch = -1;
    auto c = core->iter(0, 1);
    // c claims now, while the reader still waits for batch 8 ...
    const Status first = c->next(b, Clock::now());
    reader.join();  // ... and reads on once that wait is over.
    if (first == Status::kTimeout)
      CHECK(next(*c, b) == Status::kBatch);
    else
      CHECK(first == Status::kBatch);  // a new stream was quick
    CHECK_EQ(c->epoch(), epoch + 1);
    CHECK_EQ(b.index, 0);  // not batch 1: nothing was read twice or skipped
    CHECK(int64s(b, "v") == synth_expected(*cfg, epoch + 1, 0));
    CHECK(index.load() == -1 || index.load() == 8);
    int64_t n = 1;
    while (next(*c, b) == Status::kBatch) {
      CHECK_EQ(b.index, n);
      CHECK(int64s(b, "v") == synth_expected(*cfg, epoch + 1, n));
      ++n;
    }
    CHECK_EQ(n, 10);
  }
}

// NOTE [ Loader shutdown ]: leaving an epoch with device delivery joins its copy
// thread, which first waits for the copies it queued (here 300 ms each). That
// join never holds the core's mutex: state(), epoch() and iter() on another
// thread go on meanwhile. Then the next epoch runs as usual.
void stop_never_joins_under_the_core_mutex() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(120);
  LoaderOptions o = options(2, 4, false);
  auto api = fake_device_api({0, 300ms});
  o.delivery = std::make_shared<DeviceDelivery>(api, 4);
  auto core = LoaderCore::create(records(ds, sampler(10, false)), o);
  auto it = core->iter(0, 1);
  DeliveredBatch b;
  CHECK(next(*it, b) == Status::kBatch);  // batch 1's copy is queued behind it by now
  b = DeliveredBatch{};
  std::atomic<bool> joined{false};
  const auto t0 = Clock::now();
  auto leaving = std::async(std::launch::async, [&] {
    it.reset();  // break: the iterator and its stream go, the copy thread is joined
    joined.store(true, std::memory_order_release);
  });
  std::this_thread::sleep_for(30ms);
  int64_t slowest_ms = 0;
  for (int i = 0; i < 5 && !joined.load(std::memory_order_acquire); ++i) {
    const auto c0 = Clock::now();
    (void)core->state();
    (void)core->epoch();
    slowest_ms = std::max<int64_t>(
        slowest_ms,
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - c0).count());
    std::this_thread::sleep_for(10ms);
  }
  leaving.get();
  const auto join_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  std::printf("  leaving took %lld ms; state() meanwhile at most %lld ms\n",
              static_cast<long long>(join_ms), static_cast<long long>(slowest_ms));
  CHECK(join_ms >= 150);  // the join did wait for a queued copy: the case under test
  CHECK(slowest_ms < 100);
  CHECK(run_epoch(*core) == expected(120, sampler(10, false), 1));
}

// stats() on one thread while another drops iterators: stats() must not end
// up destroying an iterator (its last reference) while it holds the core.
void stats_while_iterators_drop() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto cfg = std::make_shared<SynthConfig>();
  auto core = LoaderCore::create(std::make_shared<SynthProducer>(cfg), options(1, 1));
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    const auto end = Clock::now() + 60s;
    while (!done.load() && Clock::now() < end) std::this_thread::sleep_for(10ms);
    if (!done.load()) {
      std::fprintf(stderr, "stats_while_iterators_drop: deadlock\n");
      std::_Exit(1);
    }
  });
  const auto end = Clock::now() + std::chrono::milliseconds(test::scaled(1500, 500));
  std::atomic<int64_t> calls{0};
  std::thread reader([&] {
    while (Clock::now() < end) {
      (void)core->stats();
      calls.fetch_add(1, std::memory_order_relaxed);
    }
  });
  int64_t dropped = 0;
  while (Clock::now() < end) {
    auto it = core->iter(0, 1);
    if (dropped % 4 == 0) {
      DeliveredBatch b;
      (void)it->next(b, Clock::now() + 1s);
    }
    it.reset();  // maybe while stats() holds it
    ++dropped;
  }
  reader.join();
  done.store(true);
  watchdog.join();
  std::printf("  %lld iterators dropped during %lld stats() calls\n",
              static_cast<long long>(dropped), static_cast<long long>(calls.load()));
}

// One iterator's next() from two threads: served one at a time, each batch
// delivered exactly once.
void one_iterator_two_threads() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto cfg = std::make_shared<SynthConfig>();
  cfg->samples = 180;
  cfg->unit_sleep_ms = 1;
  auto core = LoaderCore::create(std::make_shared<SynthProducer>(cfg), options(2, 3));
  for (int round = 0; round < 3; ++round) {
    auto it = core->iter(0, 1);
    std::mutex mu;
    std::vector<int64_t> seen;
    std::atomic<int> bad{0};
    auto consume = [&] {
      DeliveredBatch b;
      for (;;) {
        // Short deadlines: the other thread holds the iterator meanwhile.
        const Status s = it->next(b, Clock::now() + 5ms);
        if (s == Status::kTimeout) continue;
        if (s == Status::kEnd) return;
        if (int64s(b, "v") != synth_expected(*cfg, it->epoch(), b.index)) bad.fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        seen.push_back(b.index);
      }
    };
    std::thread t1(consume), t2(consume);
    t1.join();
    t2.join();
    CHECK_EQ(bad.load(), 0);
    std::sort(seen.begin(), seen.end());
    CHECK_EQ(seen.size(), 30u);
    for (int64_t k = 0; k < 30; ++k) CHECK_EQ(seen[static_cast<size_t>(k)], k);
  }
}

// A batch cut short by stop is never delivered: its units return early when
// they see the stop, and the reader reports the end instead.
void cut_short_batch_never_delivered() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto cfg = std::make_shared<SynthConfig>();
  cfg->units = 3;
  cfg->block_units = true;  // every unit waits for the stop
  auto core = LoaderCore::create(std::make_shared<SynthProducer>(cfg), options(2, 2));
  for (int round = 0; round < 4; ++round) {
    const int64_t started = cfg->units_started.load(), cut = cfg->units_cut.load();
    auto it = core->iter(0, 1);
    {
      // Claim the epoch here: an iterator closed before it claims one stops
      // nothing (the stream started for it waits for the next iterator).
      DeliveredBatch b;
      CHECK(it->next(b, Clock::now()) == Status::kTimeout);
      CHECK(it->claimed());
    }
    std::atomic<int> result{-1};
    std::thread reader([&] {
      DeliveredBatch b;
      result.store(static_cast<int>(next(*it, b)));
    });
    // Both workers are inside units of batch 0 (or 1), the reader waits for it.
    CHECK(eventually([&] { return cfg->units_started.load() >= started + 2; }));
    if (round % 2)
      core->close();
    else
      it->close();
    reader.join();
    CHECK(result.load() == static_cast<int>(Status::kEnd));
    // The units see the stop at their next look (close() joins the workers,
    // an iterator's close() does not wait for them).
    CHECK(eventually([&] { return cfg->units_cut.load() >= cut + 1; }));
    DeliveredBatch b;
    CHECK(it->next(b, Clock::now() + 1s) == Status::kEnd);
  }
  // Units that finish write their rows; a batch some of whose units were
  // stopped is dropped even when its position completes after the stop.
  cfg->block_units = false;
  cfg->unit_sleep_ms = 30;
  for (int round = 0; round < 6; ++round) {
    auto it = core->iter(0, 1);
    std::thread stopper([&, round] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + 17 * round));
      it->close();
    });
    DeliveredBatch b;
    while (next(*it, b) == Status::kBatch)
      CHECK(int64s(b, "v") == synth_expected(*cfg, it->epoch(), b.index));
    stopper.join();
  }
  std::printf("  cut short: %lld units stopped early\n",
              static_cast<long long>(cfg->units_cut.load()));
}

// Workers start with the first stream, end after the linger when no stream is
// open, restart for the next iterator, and close() ends them at once.
void worker_lifetime() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(60);
  const SamplerOptions s = sampler(6, true);
  auto core = LoaderCore::create(records(ds, s, 3), options(3, 2, false, 30ms));
  CHECK_EQ(threads_named("stoker-worker-"), 0);
  for (int round = 0; round < 3; ++round) {
    {
      auto it = core->iter(0, 1);
      DeliveredBatch b;
      CHECK(next(*it, b) == Status::kBatch);
      CHECK_EQ(core->stats().live_workers, 3);
      // A new thread takes its name when it first runs.
      CHECK(eventually([&] { return threads_named("stoker-worker-") == 3; }));
      Batches rest = take(*it);
      CHECK_EQ(rest.size(), 9u);
    }
    CHECK(eventually(
        [&] { return threads_named("stoker-worker-") == 0 && core->stats().live_workers == 0; }));
  }
  // The linger counts from when the last stream closed, not from the last
  // work: workers idle behind a slow consumer for longer than the linger
  // still linger once the epoch is over.
  auto slow = LoaderCore::create(records(ds, s, 2), options(2, 2, false, 500ms));
  {
    auto it = slow->iter(0, 1);
    Batches got = take(*it, 8);
    std::this_thread::sleep_for(700ms);  // the window is full: the workers idle past the linger
    Batches rest = take(*it);
    CHECK_EQ(got.size() + rest.size(), 10u);
  }  // the stream closes here
  std::this_thread::sleep_for(50ms);
  CHECK_EQ(slow->stats().live_workers, 2);  // still lingering
  CHECK(eventually([&] { return slow->stats().live_workers == 0; }));

  // With the next epoch flowing on, the stream stays open for the next
  // iterator, so the workers stay; close() ends them at once.
  auto flowing = LoaderCore::create(records(ds, s, 2), options(2, 2, true, 30ms));
  CHECK(run_epoch(*flowing) == expected(60, s, 0));
  std::this_thread::sleep_for(60ms);
  CHECK_EQ(threads_named("stoker-worker-"), 2);
  flowing->close();
  CHECK_EQ(threads_named("stoker-worker-"), 0);
  CHECK(run_epoch(*flowing) == expected(60, s, 1));  // usable after close()
  // close() with an iterator still open whose stream already reached the next
  // epoch stops that stream too (a left-early iterator's own close() keeps it
  // for the next iterator): the next iterator starts a stream of its own, and
  // drops nothing of the epoch left.
  {
    auto open = flowing->iter(0, 1);
    Batches first = take(*open, 9);
    CHECK_EQ(first.size(), 9u);
    CHECK(eventually([&] { return flowing->stats().queue_depth >= 2; }));  // epoch 3 begun
    const int64_t streams = flowing->stats().streams;
    flowing->close();
    CHECK(run_epoch(*flowing) == expected(60, s, 3));
    CHECK_EQ(flowing->stats().streams, streams + 1);
  }
  flowing.reset();
  CHECK_EQ(threads_named("stoker-worker-"), 0);
}

void bad_options() {
  std::printf("%s\n", __func__);
  std::fflush(stdout);
  auto ds = make_dataset(10);
  auto p = records(ds, sampler(2, false));
  CHECK_THROWS(UsageError, LoaderCore::create(nullptr, options(1, 1)));
  CHECK_THROWS(UsageError, LoaderCore::create(p, options(0, 1)));
  CHECK_THROWS(UsageError, LoaderCore::create(p, options(1, 0)));
  CHECK_THROWS(UsageError, LoaderCore::create(p, options(1, 1025)));
  CHECK_THROWS(UsageError, LoaderCore::create(p, options(1, INT_MAX)));
  auto core = LoaderCore::create(p, options(1, 1024));
  CHECK_EQ(run_epoch(*core).size(), 5u);
  auto it = core->iter(2, 2);  // rank outside the world: reported when it claims
  DeliveredBatch b;
  CHECK_THROWS(UsageError, it->next(b, Clock::now() + 1s));
}

// ---- stress ---------------------------------------------------------------------

/// A delivered record batch is one of the batches its epoch can hold at that
/// index: from the start of the epoch, or from one of the resume offsets used.
bool batch_valid(int64_t n, const SamplerOptions& s, uint64_t epoch, int64_t rank, int64_t world,
                 const std::vector<int64_t>& offsets, const DeliveredBatch& b) {
  if (!content_ok(b)) return false;
  const std::vector<int64_t> got = labels(b);
  for (int64_t off : offsets)
    for (int64_t pad_from : {int64_t{0}, off}) {  // resumed at the same or another world size
      EpochOrder order(n, s, epoch, rank, world, off, pad_from);
      if (b.index < 0 || b.index >= order.num_batches()) continue;
      if (order.batch_length(b.index) != static_cast<int64_t>(got.size())) continue;
      bool same = true;
      for (int64_t p = 0; p < order.batch_length(b.index) && same; ++p)
        same = order.index(b.index, p) == got[static_cast<size_t>(p)];
      if (same) return true;
    }
  return false;
}

/// Says what a bad batch holds, for the failure message.
void describe(int64_t n, const SamplerOptions& s, uint64_t epoch, int64_t rank, int64_t world,
              const std::vector<int64_t>& offsets, const DeliveredBatch& b) {
  std::fprintf(stderr, "  epoch %llu rank %lld/%lld index %lld content_ok %d error %d labels:",
               static_cast<unsigned long long>(epoch), static_cast<long long>(rank),
               static_cast<long long>(world), static_cast<long long>(b.index), content_ok(b),
               b.error != nullptr);
  for (int64_t v : labels(b)) std::fprintf(stderr, " %lld", static_cast<long long>(v));
  std::fprintf(stderr, "\n");
  for (int64_t off : offsets) {
    const Batches want = expected(n, s, epoch, rank, world, off);
    if (b.index < 0 || b.index >= static_cast<int64_t>(want.size())) continue;
    std::fprintf(stderr, "  offset %lld wants:", static_cast<long long>(off));
    for (int64_t v : want[static_cast<size_t>(b.index)])
      std::fprintf(stderr, " %lld", static_cast<long long>(v));
    std::fprintf(stderr, "\n");
  }
  // Which epoch and offset (if any) hold these samples at this index?
  for (uint64_t e = 0; e < 12; ++e)
    for (int64_t off : offsets) {
      const Batches want = expected(n, s, e, rank, world, off);
      for (size_t k = 0; k < want.size(); ++k)
        if (want[k] == labels(b))
          std::fprintf(stderr, "  = epoch %llu offset %lld batch %zu\n",
                       static_cast<unsigned long long>(e), static_cast<long long>(off), k);
    }
}

int open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// Several cores (one with the fake device), two threads doing random
// iterations, breaks, closes, set_epoch, load_state, state and stats on them,
// every delivered batch checked; at the end nothing is left running.
void stress() {
  auto ds = make_dataset(157);
  const std::vector<SamplerOptions> samplers = {sampler(8, true), sampler(5, false),
                                                sampler(16, true, true)};
  const std::vector<int64_t> offsets = {0, 40, 77};  // load_state uses these
  const int threads_before = test::threads_alive();
  const int fds_before = open_fds();
  // Bounded in time, not in operations: TSan runs each one 5-15x slower.
  const double seconds =
      (test::sanitizer() == test::Sanitizer::kThread ? 4.0 : 3.0) * test::env_scale();
  std::atomic<int64_t> delivered{0}, iterators{0}, errors{0};
  {
    std::vector<std::shared_ptr<LoaderCore>> cores;
    std::shared_ptr<FakeDeviceApi> api = fake_device_api({0, 10us});
    for (size_t i = 0; i < samplers.size(); ++i) {
      LoaderOptions o = options(1 + static_cast<int>(i), 1 + static_cast<int>(i) * 2, i != 1, 5ms);
      if (i == 2) o.delivery = std::make_shared<DeviceDelivery>(api, o.prefetch);
      cores.push_back(LoaderCore::create(records(ds, samplers[i], o.num_threads), o));
    }
    std::mutex shared_mu;
    std::vector<std::pair<size_t, std::shared_ptr<Iterator>>> shared;  // iterators both threads use
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    auto worker = [&](int id) {
      std::mt19937 rng(static_cast<unsigned>(1234 + id));
      auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
      while (Clock::now() < end) {
        const size_t c = static_cast<size_t>(pick(static_cast<int>(cores.size())));
        LoaderCore& core = *cores[c];
        const int op = pick(100);
        try {
          if (op < 45) {  // a new iterator: consume some or all, then break or share it
            const int64_t world = pick(3) == 0 ? 2 : 1, rank = world == 2 ? pick(2) : 0;
            auto it = core.iter(rank, world);
            iterators.fetch_add(1);
            const int64_t want = pick(4) == 0 ? INT64_MAX : pick(6);
            DeliveredBatch b;
            int timeouts = 0;
            std::vector<int64_t> history;  // batch numbers this iterator delivered
            for (int64_t k = 0; k < want; ++k) {
              const Status s = it->next(b, Clock::now() + 100ms);
              if (s == Status::kTimeout) {
                if (++timeouts > 200) {  // 20 s without a batch
                  std::fprintf(stderr, "stall: core %zu, no batch for 20 s\n", c);
                  std::exit(1);
                }
                --k;
                continue;
              }
              timeouts = 0;
              if (s == Status::kEnd) break;
              if (!batch_valid(157, samplers[c], it->epoch(), rank, world, offsets, b)) {
                std::fprintf(stderr, "bad batch: core %zu, batch %lld of this iterator, after:", c,
                             static_cast<long long>(k));
                for (int64_t h : history) std::fprintf(stderr, " %lld", static_cast<long long>(h));
                std::fprintf(stderr, "\n");
                describe(157, samplers[c], it->epoch(), rank, world, offsets, b);
                std::exit(1);
              }
              history.push_back(b.index);
              delivered.fetch_add(1);
            }
            if (pick(3) == 0 && world == 1) {
              std::lock_guard<std::mutex> lock(shared_mu);
              shared.emplace_back(c, std::move(it));
              if (shared.size() > 4) shared.erase(shared.begin());
            }
          } else if (op < 60) {  // step a shared iterator (maybe the other thread's)
            std::pair<size_t, std::shared_ptr<Iterator>> entry;
            {
              std::lock_guard<std::mutex> lock(shared_mu);
              if (shared.empty()) continue;
              entry = shared[static_cast<size_t>(pick(static_cast<int>(shared.size())))];
            }
            DeliveredBatch b;
            for (int k = 0; k < 3; ++k) {
              const Status s = entry.second->next(b, Clock::now() + 50ms);
              if (s != Status::kBatch) break;
              if (!batch_valid(157, samplers[entry.first], entry.second->epoch(), 0, 1, offsets,
                               b)) {
                std::fprintf(stderr, "bad batch: core %zu, shared iterator\n", entry.first);
                describe(157, samplers[entry.first], entry.second->epoch(), 0, 1, offsets, b);
                std::exit(1);
              }
              delivered.fetch_add(1);
            }
            if (pick(4) == 0) entry.second->close();
          } else if (op < 68) {
            core.close();
          } else if (op < 78) {
            core.set_epoch(static_cast<uint64_t>(pick(6)));
          } else if (op < 86) {
            core.load_state(
                LoaderState{static_cast<uint64_t>(pick(6)), offsets[static_cast<size_t>(pick(3))]});
          } else if (op < 93) {
            const LoaderState st = core.state();
            if (st.offset < 0 || st.offset > 157) errors.fetch_add(1);
          } else if (op < 97) {
            (void)core.stats();
          } else {
            std::lock_guard<std::mutex> lock(shared_mu);
            shared.clear();  // dropped here, on this thread
          }
        } catch (const Error& e) {
          std::fprintf(stderr, "unexpected error: %s\n", e.what());
          errors.fetch_add(1);
        }
      }
    };
    std::thread a(worker, 0), b(worker, 1);
    a.join();
    b.join();
    shared.clear();
    for (auto& core : cores) core->close();
    CHECK_EQ(threads_named("stoker-worker-"), 0);
    CHECK_EQ(threads_named("stoker-copy"), 0);
    // Every core still delivers a whole epoch after all that.
    for (size_t i = 0; i < cores.size(); ++i) {
      cores[i]->load_state(LoaderState{3, 0});  // set_epoch(3) would keep a resume point in 3
      auto it = cores[i]->iter(0, 1);
      DeliveredBatch b;
      int64_t k = 0;
      while (next(*it, b) == Status::kBatch) {
        CHECK(batch_valid(157, samplers[i], 3, 0, 1, {0}, b));
        ++k;
      }
      CHECK_EQ(k, cores[i]->num_batches(0, 1));
    }
  }
  CHECK_EQ(errors.load(), 0);
  CHECK(delivered.load() > 0);
  // Nothing left: no thread (the fake device's streams included, and the thread
  // that frees what a device pool left behind: NOTE [ Deferred frees ]), no fd.
  CHECK(eventually([&] { return test::threads_alive() == threads_before; }));
  CHECK_EQ(open_fds(), fds_before);
  std::printf("  stress: %lld iterators, %lld batches checked in %.1f s\n",
              static_cast<long long>(iterators.load()), static_cast<long long>(delivered.load()),
              seconds);
}

}  // namespace

TEST_MAIN(order_and_content(); determinism(); epochs_and_iterators(); concurrent_iterators();
          resume(); skip_batches(); parts(); placeholders(); next_epoch_flows_on();
          corrupt_record_error_at_its_batch(); planning_errors();
          error_at_epoch_end_then_new_iterator(); close_from_two_threads();
          close_while_an_iterator_starts(); close_during_next_near_epoch_end();
          stats_while_iterators_drop(); one_iterator_two_threads();
          cut_short_batch_never_delivered(); worker_lifetime(); bad_options();
          stop_never_joins_under_the_core_mutex(); stress())
