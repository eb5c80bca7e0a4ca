// TransferEngine over the fake device: ordering, recycling only after the
// consumer's event, backpressure, early stop, errors at their position, and a
// stop-aware source that can never keep ~TransferEngine waiting.
// Runs in every CI without a GPU; the fake's copies read and write when their
// stream reaches them, so a buffer reused too early shows up as wrong bytes.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "cuda/fake_device_api.h"
#include "cuda/pinned_allocator.h"
#include "cuda/transfer_engine.h"
#include "test_threads.h"

using namespace stoker;
using namespace std::chrono_literals;
using test::eventually;
using test::threads_named;
using Clock = TransferEngine::Clock;
using SourceStatus = TransferEngine::SourceStatus;

namespace {

uint8_t pattern(int64_t batch, size_t i) {
  return static_cast<uint8_t>((batch * 131 + static_cast<int64_t>(i) * 7 + 1) & 0xFF);
}

constexpr uint8_t kReleasedPoison = 0xEE;

/// Host batches like the slot pool's: the deleter poisons the memory (as a
/// refill by the next batch would), so a slot returned before its copy has
/// read it is caught.
struct TestSource {
  int64_t n = 0;                   // batches per epoch; -1 = endless
  size_t bytes = 1000;             // bytes of batch k: bytes + 37 * (k % 3)
  int64_t fail_at = -1;            // the batch at this position carries a DataError
  bool fail_by_throwing = false;   // ... or the source throws it instead
  int64_t base = 0;                // index (and bytes pattern) of the first batch
  std::atomic<int64_t> pulled{0};  // batches (and the error) handed to the engine
  std::atomic<int64_t> live_slots{0};
  std::atomic<bool> stopped{false};  // the owner stopped: the source says kStopped

  size_t size_of(int64_t k) const { return k < 0 ? 0 : bytes + 37 * static_cast<size_t>(k % 3); }

  TransferEngine::Source source() {
    return [this](HostBatch& out, Clock::time_point) -> SourceStatus {
      const int64_t k = pulled.load(std::memory_order_relaxed);
      if (stopped.load(std::memory_order_acquire)) return SourceStatus::kStopped;
      if (k == fail_at) {
        pulled.fetch_add(1, std::memory_order_relaxed);
        DataError e("bad record in batch " + std::to_string(base + k));
        if (fail_by_throwing) throw e;
        out = HostBatch{};
        out.index = base + k;
        out.error = std::make_exception_ptr(e);
        return SourceStatus::kBatch;
      }
      if (n >= 0 && k >= n) return SourceStatus::kEnd;
      pulled.fetch_add(1, std::memory_order_relaxed);
      HostBatch hb;
      hb.index = base + k;
      hb.bytes = size_of(hb.index);
      auto* p = new uint8_t[hb.bytes + 1];
      for (size_t i = 0; i < hb.bytes; ++i) p[i] = pattern(hb.index, i);
      live_slots.fetch_add(1, std::memory_order_relaxed);
      size_t nb = hb.bytes;
      hb.memory = std::shared_ptr<uint8_t>(p, [this, nb](uint8_t* q) {
        std::memset(q, kReleasedPoison, nb);
        delete[] q;
        live_slots.fetch_sub(1, std::memory_order_relaxed);
      });
      hb.tensors.push_back(
          TensorDesc{"x", DType::kUInt8, {static_cast<int64_t>(hb.bytes)}, 0, hb.bytes});
      hb.counters.samples = 1;
      out = std::move(hb);
      return SourceStatus::kBatch;
    };
  }
};

/// A source with nothing to give: it waits out each deadline (as a stream
/// whose workers are slow does) until `ready`, then ends.
TransferEngine::Source idle_source(std::atomic<bool>* ready = nullptr) {
  return [ready](HostBatch&, Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      if (ready && ready->load(std::memory_order_acquire)) return SourceStatus::kEnd;
      std::this_thread::sleep_for(1ms);
    }
    return SourceStatus::kTimeout;
  };
}

/// Counts wrong bytes seen by fake kernels.
struct Verifier {
  std::atomic<int64_t> bad{0};
  std::atomic<int64_t> checked{0};
  /// Queues a "kernel" on `stream` that checks batch `k` after `delay`.
  void check_on(FakeDeviceApi& api, StreamHandle stream, const DeviceBatch& b, size_t bytes,
                std::chrono::microseconds delay = 0us) {
    const uint8_t* data = b.memory.get();  // raw: a kernel does not own memory
    const int64_t k = b.index;
    api.launch(stream, [this, data, bytes, k, delay] {
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      for (size_t i = 0; i < bytes; ++i)
        if (data[i] != pattern(k, i)) {
          bad.fetch_add(1, std::memory_order_relaxed);
          break;
        }
      checked.fetch_add(1, std::memory_order_relaxed);
    });
  }
};

// The pool every engine copies into: the loader's, which outlives each
// transfer (NOTE [ Pool across epochs ]).
std::shared_ptr<BlockPool> pool_for(const std::shared_ptr<FakeDeviceApi>& api, size_t prefetch) {
  return device_buffer_pool(api, prefetch + 2);
}

// Batches arrive in order with the right bytes; kernels on the consumer
// stream run after the copy (the stream waited on E_k); host slots are not
// returned before their copy read them (else poisoned bytes). The loader's
// stats count the copies.
void order_and_content() {
  auto api = fake_device_api({0, 300us});
  TestSource src;
  src.n = 25;
  Verifier v;
  const StreamHandle consumer = api->create_stream();
  auto pool = pool_for(api, 3);
  auto stats = std::make_shared<LoaderStats>();
  {
    TransferEngine engine(api, src.source(), 3, pool, stats);
    for (int64_t k = 0; k < src.n; ++k) {
      auto b = engine.next(consumer);
      CHECK(b.has_value());
      CHECK_EQ(b->index, k);
      CHECK_EQ(b->device, 0);
      CHECK_EQ(b->tensors.size(), 1u);
      CHECK_EQ(b->tensors[0].nbytes, src.size_of(k));
      CHECK_EQ(b->counters.samples, 1);
      v.check_on(*api, consumer, *b, src.size_of(k));
    }
    CHECK(!engine.next(consumer).has_value());
    CHECK(!engine.next(consumer).has_value());  // stays at the end
    std::optional<DeviceBatch> out;
    CHECK(engine.next_until(consumer, Clock::now() + 1s, out) == TransferEngine::Status::kEnd);
    CHECK(!out.has_value());
    api->synchronize_stream(consumer);
    CHECK(eventually([&] { return engine.stats().copies == src.n; }));
    int64_t total = 0;
    for (int64_t k = 0; k < src.n; ++k) total += static_cast<int64_t>(src.size_of(k));
    CHECK_EQ(engine.stats().bytes, total);
    CHECK(engine.stats().copy_seconds > 0);
    CHECK_EQ(stats->copies.load(), src.n);
    CHECK_EQ(stats->copy_bytes.load(), total);
    CHECK(pool->blocks() >= 1);
  }
  CHECK_EQ(v.checked.load(), src.n);
  CHECK_EQ(v.bad.load(), 0);
  CHECK_EQ(src.live_slots.load(), 0);
  api->destroy_stream(consumer);
}

// A slow consumer frees each batch right after queuing a slow kernel on it.
// The buffer is reused for a later batch while that kernel has not run yet;
// only the copy stream's wait on R_k keeps the kernel from reading the later
// batch's bytes. Removing that wait makes this test fail.
void slow_consumer_never_sees_overwrite() {
  auto api = fake_device_api({0, 0us});
  TestSource src;
  src.n = 30;
  src.bytes = 4096;
  Verifier v;
  const StreamHandle consumer = api->create_stream();
  auto pool = pool_for(api, 2);
  {
    TransferEngine engine(api, src.source(), 2, pool);
    for (int64_t k = 0; k < src.n; ++k) {
      auto b = engine.next(consumer);
      CHECK(b && b->index == k);
      v.check_on(*api, consumer, *b, src.size_of(k), 3000us);
      b.reset();  // R_k recorded now, behind the slow kernel
    }
    CHECK(!engine.next(consumer));
    // Recycling happened: far fewer buffers than batches.
    CHECK(pool->blocks() <= 2 + 3u);
  }
  api->synchronize_stream(consumer);
  CHECK_EQ(v.checked.load(), src.n);
  CHECK_EQ(v.bad.load(), 0);
  api->destroy_stream(consumer);
}

// Same, with the consumer on the default stream (handle 0).
void default_stream_consumer() {
  auto api = fake_device_api({0, 100us});
  TestSource src;
  src.n = 12;
  Verifier v;
  {
    TransferEngine engine(api, src.source(), 2, pool_for(api, 2));
    while (auto b = engine.next(0)) v.check_on(*api, 0, *b, src.size_of(b->index), 500us);
  }
  api->synchronize_stream(0);
  CHECK_EQ(v.checked.load(), src.n);
  CHECK_EQ(v.bad.load(), 0);
}

// At most `prefetch` batches are copied ahead of the consumer. The copy
// thread asks the source before it waits for room, so it holds one more
// host batch (not copied) while the ring is full.
void backpressure_is_prefetch() {
  auto api = fake_device_api();
  TestSource src;
  src.n = -1;
  TransferEngine engine(api, src.source(), 3, pool_for(api, 3));
  CHECK(eventually([&] { return api->counts().copies == 3 && src.pulled.load() == 4; }));
  std::this_thread::sleep_for(50ms);
  CHECK_EQ(api->counts().copies, 3);
  CHECK_EQ(src.pulled.load(), 4);
  {
    auto b = engine.next(0);
    CHECK(b && b->index == 0);
  }
  CHECK(eventually([&] { return api->counts().copies == 4 && src.pulled.load() == 5; }));
  std::this_thread::sleep_for(50ms);
  CHECK_EQ(api->counts().copies, 4);
  CHECK_EQ(src.pulled.load(), 5);
  // Host slots of copied batches are returned once copied, not held for the
  // consumer: only the one waiting for room is alive.
  CHECK(eventually([&] { return src.live_slots.load() == 1; }));
  engine.stop();
  CHECK_EQ(src.live_slots.load(), 0);
}

// list(loader): the user keeps every batch. The pool grows instead of
// waiting, every batch stays intact, and dropping them all returns memory.
void consumer_holds_batches() {
  auto api = fake_device_api({0, 50us});
  TestSource src;
  src.n = 16;
  Verifier v;
  std::vector<DeviceBatch> kept;
  auto pool = pool_for(api, 2);
  {
    TransferEngine engine(api, src.source(), 2, pool);
    while (auto b = engine.next(0)) kept.push_back(std::move(*b));
    CHECK_EQ(kept.size(), 16u);
    CHECK(pool->blocks() >= 16u);
  }
  for (const auto& b : kept) v.check_on(*api, 0, b, src.size_of(b.index));
  api->synchronize_stream(0);
  CHECK_EQ(v.bad.load(), 0);
  CHECK(api->counts().device_buffers >= 16);
  pool.reset();
  kept.clear();  // the engine is gone: the pool goes with the last deleter, which never waits
  // Buffers the consumer's stream may still read are freed once it is done
  // (NOTE [ Deferred frees ]), with their events.
  CHECK(eventually([&] { return api->counts().device_buffers == 0 && api->counts().events == 0; }));
}

// Early stop: the copy thread is gone at once (the source is stop-aware, no
// owner has to stop it first), buffers and slots come back, a batch kept by
// the user stays valid after the engine is destroyed.
void early_stop_frees_everything() {
  auto api = fake_device_api({0, 200us});
  TestSource src;
  src.n = -1;
  Verifier v;
  std::optional<DeviceBatch> kept;
  auto pool = pool_for(api, 4);
  {
    TransferEngine engine(api, src.source(), 4, pool);
    auto b0 = engine.next(0);
    kept = engine.next(0);
    CHECK(kept && kept->index == 1);
    CHECK(eventually([&] { return src.pulled.load() >= 5; }));
    CHECK_EQ(threads_named("stoker-copy"), 1);
    const auto t0 = Clock::now();
    engine.stop();
    CHECK(Clock::now() - t0 < 2s);
    engine.stop();  // idempotent
    CHECK(eventually([] { return threads_named("stoker-copy") == 0; }));
    CHECK_EQ(src.live_slots.load(), 0);
    CHECK_THROWS(UsageError, engine.next(0));
    std::optional<DeviceBatch> out;
    CHECK_THROWS(UsageError, engine.next_until(0, Clock::now() + 1s, out));
  }
  CHECK_EQ(api->counts().streams, 0);         // the copy stream is gone
  api->synchronize_stream(0);                 // the readers of the buffers b0 and the others had
  pool->set_max_idle(0);                      // the idle buffers go now
  CHECK_EQ(api->counts().device_buffers, 1);  // only the kept batch's buffer
  v.check_on(*api, 0, *kept, src.size_of(1));
  api->synchronize_stream(0);
  CHECK_EQ(v.bad.load(), 0);
  kept.reset();  // deleter after the engine is gone: the buffer is deferred, not waited for
  api->synchronize_stream(0);
  CHECK_EQ(pool->collect(), 0u);
  CHECK_EQ(api->counts().device_buffers, 0);
  pool.reset();
  CHECK_EQ(api->counts().events, 0);
}

// Destroying the engine without taking anything, while the copy thread waits
// for room or for the source; the owner never stops the source.
void destroy_without_consuming() {
  auto api = fake_device_api({0, 1000us});
  auto pool = pool_for(api, 2);
  for (int round = 0; round < 5; ++round) {
    TestSource src;
    src.n = -1;
    {
      TransferEngine engine(api, src.source(), 2, pool);
      std::this_thread::sleep_for(std::chrono::milliseconds(round * 3));
    }
    CHECK_EQ(src.live_slots.load(), 0);
    CHECK(eventually([] { return threads_named("stoker-copy") == 0; }));
  }
  CHECK_EQ(api->counts().streams, 0);
  CHECK(pool->blocks() <= 4u);
}

// A batch's error surfaces when the consumer reaches its position, not
// earlier, and the batches after it follow (a stream goes on into the next
// epoch). An error the source throws ends the transfer: it comes at its
// position too, and again on every later call.
void source_error_at_its_position() {
  for (bool throwing : {false, true}) {
    auto api = fake_device_api();
    TestSource src;
    src.n = 20;
    src.fail_at = 5;
    src.fail_by_throwing = throwing;
    TransferEngine engine(api, src.source(), 8, pool_for(api, 8));
    CHECK(eventually([&] { return src.pulled.load() >= 6; }));
    std::this_thread::sleep_for(20ms);             // the copy thread has met the error by now
    if (throwing) CHECK_EQ(src.pulled.load(), 6);  // and asks for nothing after it
    for (int64_t k = 0; k < 5; ++k) {
      auto b = engine.next(0);
      CHECK(b && b->index == k);
    }
    bool thrown = false;
    try {
      engine.next(0);
    } catch (const DataError& e) {
      thrown = std::string(e.what()).find("batch 5") != std::string::npos;
    }
    CHECK(thrown);
    if (throwing) {
      CHECK_THROWS(DataError, engine.next(0));
      std::optional<DeviceBatch> out;
      CHECK_THROWS(DataError, engine.next_until(0, Clock::now() + 1s, out));
    } else {
      for (int64_t k = 6; k < 20; ++k) {
        auto b = engine.next(0);
        CHECK(b && b->index == k);
      }
      CHECK(!engine.next(0));
    }
  }
}

// stop() from another thread wakes a consumer blocked in next().
void stop_wakes_blocked_consumer() {
  auto api = fake_device_api();
  TransferEngine engine(api, idle_source(), 2, pool_for(api, 2));
  std::atomic<bool> woke{false};
  Clock::time_point woke_at{};
  std::thread consumer([&] {
    try {
      engine.next(0);
    } catch (const UsageError&) {
      woke_at = Clock::now();
      woke.store(true, std::memory_order_release);
    }
  });
  std::this_thread::sleep_for(30ms);
  CHECK(!woke.load());
  const auto t0 = Clock::now();
  engine.stop();
  consumer.join();
  CHECK(woke.load(std::memory_order_acquire));
  CHECK(woke_at - t0 < 5s);
}

// next_until returns kTimeout at its deadline while the source is slow.
void next_until_times_out() {
  auto api = fake_device_api();
  std::atomic<bool> ready{false};
  TransferEngine engine(api, idle_source(&ready), 1, pool_for(api, 1));
  std::optional<DeviceBatch> out;
  const auto t0 = Clock::now();
  CHECK(engine.next_until(0, t0 + 20ms, out) == TransferEngine::Status::kTimeout);
  CHECK(Clock::now() - t0 >= 20ms);
  CHECK(!out.has_value());
  ready.store(true, std::memory_order_release);
  TransferEngine::Status s;
  while ((s = engine.next_until(0, Clock::now() + 20ms, out)) == TransferEngine::Status::kTimeout) {
  }
  CHECK(s == TransferEngine::Status::kEnd);
  CHECK(engine.stats().wait_seconds > 0.015);
}

// A source that never returns a batch, only kTimeout, cannot keep
// ~TransferEngine waiting.
void idle_source_cannot_hang_destructor() {
  auto api = fake_device_api();
  auto pool = pool_for(api, 2);
  for (int round = 0; round < 3; ++round) {
    auto engine = std::make_unique<TransferEngine>(api, idle_source(), 2, pool);
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * round));
    auto destroyed = std::async(std::launch::async, [&] { engine.reset(); });
    CHECK(destroyed.wait_for(10s) == std::future_status::ready);
    CHECK(eventually([] { return threads_named("stoker-copy") == 0; }));
  }
  // Nor can one that answers kTimeout at once, without waiting.
  auto busy = std::make_unique<TransferEngine>(
      api, [](HostBatch&, Clock::time_point) { return SourceStatus::kTimeout; }, 2, pool);
  std::this_thread::sleep_for(5ms);
  auto destroyed = std::async(std::launch::async, [&] { busy.reset(); });
  CHECK(destroyed.wait_for(10s) == std::future_status::ready);
  CHECK_EQ(api->counts().streams, 0);
}

// Pinned slots come from the device API and go back to it.
void pinned_allocator_roundtrip() {
  auto api = fake_device_api();
  auto alloc = pinned_host_allocator(api);
  CHECK(alloc->kind() == MemoryKind::kPinned);
  void* p = alloc->allocate(12345);
  CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
  std::memset(p, 1, 12345);
  CHECK_EQ(api->counts().pinned_buffers, 1);
  alloc->deallocate(p, 12345);
  CHECK_EQ(api->counts().pinned_buffers, 0);
  CHECK_THROWS(UsageError, pinned_host_allocator(nullptr));
}

// Zero-byte batches (all tensors empty) still flow.
void empty_batches() {
  auto api = fake_device_api();
  int64_t k = 0;
  auto source = [&](HostBatch& out, Clock::time_point) {
    if (k == 3) return SourceStatus::kEnd;
    out = HostBatch{};
    out.index = k++;
    out.memory = std::shared_ptr<uint8_t>(new uint8_t[1], std::default_delete<uint8_t[]>());
    out.bytes = 0;
    return SourceStatus::kBatch;
  };
  TransferEngine engine(api, source, 2, pool_for(api, 2));
  for (int64_t i = 0; i < 3; ++i) {
    auto b = engine.next(0);
    CHECK(b && b->index == i && b->memory != nullptr);
  }
  CHECK(!engine.next(0));
}

void bad_arguments() {
  auto api = fake_device_api();
  TestSource src;
  auto pool = pool_for(api, 1);
  CHECK_THROWS(UsageError, TransferEngine(api, src.source(), 0, pool));
  CHECK_THROWS(UsageError, TransferEngine(nullptr, src.source(), 1, pool));
  CHECK_THROWS(UsageError, TransferEngine(api, nullptr, 1, pool));
  CHECK_THROWS(UsageError, TransferEngine(api, src.source(), 1, nullptr));
  // Host memory is not something to copy into.
  auto host = BlockPool::create(pinned_host_allocator(api), nullptr, 2);
  CHECK_THROWS(UsageError, TransferEngine(api, src.source(), 1, host));
  CHECK_EQ(src.pulled.load(), 0);
  CHECK_EQ(api->counts().streams, 0);
  CHECK(eventually([] { return threads_named("stoker-copy") == 0; }));
}

// NOTE [ Pool across epochs ]: with a pool that outlives the engine, ending an
// epoch waits for nothing queued on the consumer stream, and the next epoch's
// copy into a buffer still being read waits for that reader on the device.
// A closed gate at the head of the consumer stream stands for a GPU still busy
// with earlier steps.
void shared_pool_across_epochs() {
  auto api = fake_device_api({0, 0us});
  auto pool = device_buffer_pool(api, 2);
  const StreamHandle consumer = api->create_stream();
  Verifier v;
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  auto open_gate = [&] {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  };

  TestSource first;
  first.n = 1;
  const void* reused = nullptr;
  {
    TransferEngine engine(api, first.source(), 2, pool);
    auto b = engine.next(consumer);
    CHECK(b && b->index == 0);
    CHECK(!engine.next(consumer));
    api->launch(consumer, [&] {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return open; });
    });
    v.check_on(*api, consumer, *b, first.size_of(0));  // runs once the gate opens
    reused = b->memory.get();
    b.reset();  // R_0 recorded behind the gate
    // A per-epoch pool would wait here for R_0, i.e. for the gate.
    auto stopped = std::async(std::launch::async, [&] { engine.stop(); });
    const bool prompt = stopped.wait_for(10s) == std::future_status::ready;
    CHECK(prompt);
    if (!prompt) open_gate();
  }
  CHECK_EQ(pool->blocks(), 1u);  // kept for the next epoch

  TestSource second;
  second.n = 5;
  second.base = 100;
  {
    TransferEngine engine(api, second.source(), 2, pool);
    auto b = engine.next(consumer);
    CHECK(b && b->index == 100);
    CHECK(b->memory.get() == reused);  // the only idle buffer: its copy waits for R_0
    v.check_on(*api, consumer, *b, second.size_of(100));
    b.reset();
    open_gate();
    while (auto c = engine.next(consumer)) v.check_on(*api, consumer, *c, second.size_of(c->index));
  }
  api->synchronize_stream(consumer);
  CHECK_EQ(v.checked.load(), 1 + second.n);
  CHECK_EQ(v.bad.load(), 0);  // batch 0's reader saw batch 0, not batch 100
  CHECK_EQ(first.live_slots.load() + second.live_slots.load(), 0);
  CHECK(pool->blocks() >= 1);
  pool.reset();  // the last reference frees the idle buffers
  CHECK_EQ(api->counts().device_buffers, 0);
  api->destroy_stream(consumer);
}

// NOTE [ Deferred frees ]: the consumer drops batches its stream is still
// reading, more than the pool keeps idle. The drops (DLPack deleters) return at
// once, nothing is freed under the reader, and the copy thread frees the rest
// once the stream is done, with no call from the consumer.
void frees_deferred_to_copy_thread() {
  auto api = fake_device_api({0, 0us});
  auto pool = pool_for(api, 1);  // keeps 3 idle
  const StreamHandle consumer = api->create_stream();
  TestSource src;
  src.n = -1;
  Verifier v;
  TransferEngine engine(api, src.source(), 1, pool);
  std::vector<DeviceBatch> kept;
  for (int i = 0; i < 8; ++i) kept.push_back(std::move(*engine.next(consumer)));
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  api->launch(consumer, [&] {  // the GPU still busy with the steps that read them
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return open; });
  });
  for (const auto& b : kept) v.check_on(*api, consumer, b, src.size_of(b.index));
  // The engine has copied the next batch and waits for room: no more buffers come.
  CHECK(eventually([&] { return api->counts().copies == 9; }));
  const int64_t alive = api->counts().device_buffers;
  auto dropped = std::async(std::launch::async, [&] { kept.clear(); });
  CHECK(dropped.wait_for(10s) == std::future_status::ready);  // not behind the gate
  CHECK_EQ(api->counts().device_buffers, alive);              // nothing freed under the reader
  CHECK(pool->deferred() >= 4u);
  {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
  }
  cv.notify_all();
  // The copy thread, waiting for room, collected them.
  CHECK(eventually([&] { return pool->deferred() == 0; }));
  CHECK(api->counts().device_buffers <= alive - 4);
  api->synchronize_stream(consumer);
  CHECK_EQ(v.checked.load(), 8);
  CHECK_EQ(v.bad.load(), 0);
  engine.stop();
  api->destroy_stream(consumer);
}

}  // namespace

// The side stream (batch_map's, docs/python.md) is ordered after the copy as
// the consumer's is: a kernel queued on it right after next() sees the whole
// batch, with the copy delayed, while the consumer stream is held up by
// other work (so it is the side stream's own wait that orders it).
void side_stream_ordered_after_the_copy() {
  auto api = fake_device_api({0, 400us});
  TestSource src;
  src.n = 12;
  Verifier v;
  const StreamHandle consumer = api->create_stream();
  const StreamHandle side = api->create_stream();
  auto pool = pool_for(api, 3);
  {
    TransferEngine engine(api, src.source(), 3, pool);
    std::atomic<bool> release{false};
    api->launch(consumer, [&] {  // the step still running on the consumer stream
      while (!release.load(std::memory_order_acquire)) std::this_thread::sleep_for(1ms);
    });
    std::vector<DeviceBatch> kept;
    for (int64_t k = 0; k < src.n; ++k) {
      std::optional<DeviceBatch> b;
      while (engine.next_until(consumer, Clock::now() + 1s, b, side) ==
             TransferEngine::Status::kTimeout) {
      }
      CHECK(b.has_value());
      v.check_on(*api, side, *b, src.size_of(k));
      kept.push_back(std::move(*b));
    }
    api->synchronize_stream(side);  // done while the consumer stream is still blocked
    CHECK_EQ(v.checked.load(), src.n);
    CHECK_EQ(v.bad.load(), 0);
    release.store(true, std::memory_order_release);
    api->synchronize_stream(consumer);
    kept.clear();
  }
  api->destroy_stream(side);
  api->destroy_stream(consumer);
}

TEST_MAIN(side_stream_ordered_after_the_copy(); order_and_content();
          slow_consumer_never_sees_overwrite(); default_stream_consumer();
          backpressure_is_prefetch(); consumer_holds_batches(); early_stop_frees_everything();
          destroy_without_consuming(); source_error_at_its_position();
          stop_wakes_blocked_consumer(); next_until_times_out();
          idle_source_cannot_hang_destructor(); pinned_allocator_roundtrip(); empty_batches();
          bad_arguments(); shared_pool_across_epochs(); frees_deferred_to_copy_thread())
