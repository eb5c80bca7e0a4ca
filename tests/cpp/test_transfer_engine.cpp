// TransferEngine over the fake device: ordering, recycling only after the
// consumer's event, backpressure, early stop, errors at their position.
// Runs in every CI without a GPU; the fake's copies read and write when their
// stream reaches them, so a buffer reused too early shows up as wrong bytes.
#include <dirent.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
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

using namespace stoker;
using namespace std::chrono_literals;

namespace {

uint8_t pattern(int64_t batch, size_t i) {
  return static_cast<uint8_t>((batch * 131 + static_cast<int64_t>(i) * 7 + 1) & 0xFF);
}

constexpr uint8_t kReleasedPoison = 0xEE;

/// Host batches like the slot pool's: the deleter poisons the memory (as a
/// refill by the next batch would), so a slot returned before its copy has
/// read it is caught.
struct TestSource {
  int64_t n = 0;                       // batches per epoch; -1 = endless
  size_t bytes = 1000;                 // bytes of batch k: bytes + 37 * (k % 3)
  int64_t fail_at = -1;                // source throws DataError at this position
  int64_t base = 0;                    // index (and bytes pattern) of the first batch
  std::atomic<int64_t> pulled{0};
  std::atomic<int64_t> live_slots{0};
  std::atomic<bool> stopped{false};    // the owner's stop: a blocked call throws

  size_t size_of(int64_t k) const { return k < 0 ? 0 : bytes + 37 * static_cast<size_t>(k % 3); }

  TransferEngine::Source source() {
    return [this]() -> std::optional<HostBatch> {
      const int64_t k = pulled.load(std::memory_order_relaxed);
      if (stopped.load(std::memory_order_acquire)) throw UsageError("source stopped");
      if (k == fail_at) throw DataError("bad record in batch " + std::to_string(k));
      if (n >= 0 && k >= n) return std::nullopt;
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
      hb.tensors.push_back(TensorDesc{"x", DType::kUInt8, {static_cast<int64_t>(hb.bytes)}, 0,
                                      hb.bytes});
      return hb;
    };
  }
};

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

int threads_named(const std::string& name) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string comm;
    std::getline(f, comm);
    if (comm == name) ++n;
  }
  closedir(d);
  return n;
}

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

// Batches arrive in order with the right bytes; kernels on the consumer
// stream run after the copy (the stream waited on E_k); host slots are not
// returned before their copy read them (else poisoned bytes).
void order_and_content() {
  auto api = fake_device_api({0, 300us});
  TestSource src;
  src.n = 25;
  Verifier v;
  const StreamHandle consumer = api->create_stream();
  {
    TransferEngine engine(api, src.source(), 3);
    for (int64_t k = 0; k < src.n; ++k) {
      auto b = engine.next(consumer);
      CHECK(b.has_value());
      CHECK_EQ(b->index, k);
      CHECK_EQ(b->tensors.size(), 1u);
      CHECK_EQ(b->tensors[0].nbytes, src.size_of(k));
      v.check_on(*api, consumer, *b, src.size_of(k));
    }
    CHECK(!engine.next(consumer).has_value());
    CHECK(!engine.next(consumer).has_value());  // stays at the end
    api->synchronize_stream(consumer);
    const TransferStats s = engine.stats();
    CHECK(eventually([&] { return engine.stats().copies == src.n; }));
    CHECK(engine.stats().bytes > 0);
    CHECK(s.pool_buffers >= 1);
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
  {
    TransferEngine engine(api, src.source(), 2);
    for (int64_t k = 0; k < src.n; ++k) {
      auto b = engine.next(consumer);
      CHECK(b && b->index == k);
      v.check_on(*api, consumer, *b, src.size_of(k), 3000us);
      b.reset();  // R_k recorded now, behind the slow kernel
    }
    CHECK(!engine.next(consumer));
    // Recycling happened: far fewer buffers than batches.
    CHECK(engine.stats().pool_buffers <= 2 + 3u);
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
    TransferEngine engine(api, src.source(), 2);
    while (auto b = engine.next(0)) v.check_on(*api, 0, *b, src.size_of(b->index), 500us);
  }
  api->synchronize_stream(0);
  CHECK_EQ(v.checked.load(), src.n);
  CHECK_EQ(v.bad.load(), 0);
}

// At most `prefetch` batches are copied ahead of the consumer.
void backpressure_is_prefetch() {
  auto api = fake_device_api();
  TestSource src;
  src.n = -1;
  TransferEngine engine(api, src.source(), 3);
  CHECK(eventually([&] { return src.pulled.load() == 3; }));
  std::this_thread::sleep_for(50ms);
  CHECK_EQ(src.pulled.load(), 3);
  { auto b = engine.next(0); CHECK(b && b->index == 0); }
  CHECK(eventually([&] { return src.pulled.load() == 4; }));
  std::this_thread::sleep_for(50ms);
  CHECK_EQ(src.pulled.load(), 4);
  // Host slots are returned once copied, not held for the consumer.
  CHECK(eventually([&] { return src.live_slots.load() == 0; }));
  src.stopped.store(true, std::memory_order_release);
  engine.stop();
}

// list(loader): the user keeps every batch. The pool grows instead of
// waiting, every batch stays intact, and dropping them all returns memory.
void consumer_holds_batches() {
  auto api = fake_device_api({0, 50us});
  TestSource src;
  src.n = 16;
  Verifier v;
  std::vector<DeviceBatch> kept;
  {
    TransferEngine engine(api, src.source(), 2);
    while (auto b = engine.next(0)) kept.push_back(std::move(*b));
    CHECK_EQ(kept.size(), 16u);
    CHECK(engine.stats().pool_buffers >= 16u);
  }
  for (const auto& b : kept) v.check_on(*api, 0, b, src.size_of(b.index));
  api->synchronize_stream(0);
  CHECK_EQ(v.bad.load(), 0);
  CHECK(api->counts().device_buffers >= 16);
  kept.clear();  // the engine is gone: the pool is freed by the last deleter
  CHECK_EQ(api->counts().device_buffers, 0);
  CHECK_EQ(api->counts().events, 0);
}

// Early stop: the copy thread is gone at once, buffers and slots come back,
// a batch kept by the user stays valid after the engine is destroyed.
void early_stop_frees_everything() {
  auto api = fake_device_api({0, 200us});
  TestSource src;
  src.n = -1;
  Verifier v;
  std::optional<DeviceBatch> kept;
  {
    TransferEngine engine(api, src.source(), 4);
    auto b0 = engine.next(0);
    kept = engine.next(0);
    CHECK(kept && kept->index == 1);
    CHECK(eventually([&] { return src.pulled.load() >= 5; }));
    CHECK_EQ(threads_named("stoker-copy"), 1);
    src.stopped.store(true, std::memory_order_release);  // the owner stops the source first
    const auto t0 = std::chrono::steady_clock::now();
    engine.stop();
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    engine.stop();  // idempotent
    CHECK_EQ(threads_named("stoker-copy"), 0);
    CHECK_EQ(src.live_slots.load(), 0);
    CHECK_THROWS(UsageError, engine.next(0));
  }
  CHECK_EQ(api->counts().streams, 0);     // the copy stream is gone
  CHECK_EQ(api->counts().device_buffers, 1);  // only the kept batch's buffer
  v.check_on(*api, 0, *kept, src.size_of(1));
  api->synchronize_stream(0);
  CHECK_EQ(v.bad.load(), 0);
  kept.reset();  // deleter after the engine is gone
  CHECK_EQ(api->counts().device_buffers, 0);
  CHECK_EQ(api->counts().events, 0);
}

// Destroying the engine without taking anything, while the copy thread waits
// for room, and with the source blocked.
void destroy_without_consuming() {
  auto api = fake_device_api({0, 1000us});
  for (int round = 0; round < 5; ++round) {
    TestSource src;
    src.n = -1;
    {
      TransferEngine engine(api, src.source(), 2);
      std::this_thread::sleep_for(std::chrono::milliseconds(round));
      src.stopped.store(true, std::memory_order_release);
    }
    CHECK_EQ(src.live_slots.load(), 0);
    CHECK_EQ(threads_named("stoker-copy"), 0);
  }
  CHECK_EQ(api->counts().streams, 0);
}

// A source error surfaces when the consumer reaches its position, not
// earlier, and again on every later call.
void source_error_at_its_position() {
  auto api = fake_device_api();
  TestSource src;
  src.n = 20;
  src.fail_at = 5;
  TransferEngine engine(api, src.source(), 8);
  CHECK(eventually([&] { return src.pulled.load() == 5; }));
  std::this_thread::sleep_for(20ms);  // the copy thread has met the error by now
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
  CHECK_THROWS(DataError, engine.next(0));
}

// stop() from another thread wakes a consumer blocked in next().
void stop_wakes_blocked_consumer() {
  auto api = fake_device_api();
  std::mutex mu;
  std::condition_variable cv;
  bool stopped = false;
  auto source = [&]() -> std::optional<HostBatch> {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopped) cv.wait_for(lock, 10ms);
    throw UsageError("stopped");
  };
  TransferEngine engine(api, source, 2);
  std::atomic<bool> woke{false};
  std::thread consumer([&] {
    try {
      engine.next(0);
    } catch (const UsageError&) {
      woke.store(true, std::memory_order_release);
    }
  });
  std::this_thread::sleep_for(30ms);
  {
    std::lock_guard<std::mutex> lock(mu);
    stopped = true;
  }
  cv.notify_all();
  engine.stop();
  consumer.join();
  CHECK(woke.load(std::memory_order_acquire));
}

// next_for returns kTimeout while the source is slow.
void next_for_times_out() {
  auto api = fake_device_api();
  std::atomic<bool> release{false};
  auto source = [&]() -> std::optional<HostBatch> {
    while (!release.load(std::memory_order_acquire)) std::this_thread::sleep_for(1ms);
    return std::nullopt;
  };
  TransferEngine engine(api, source, 1);
  std::optional<DeviceBatch> out;
  CHECK(engine.next_for(0, 20ms, out) == TransferEngine::Status::kTimeout);
  release.store(true, std::memory_order_release);
  TransferEngine::Status s;
  while ((s = engine.next_for(0, 20ms, out)) == TransferEngine::Status::kTimeout) {
  }
  CHECK(s == TransferEngine::Status::kEnd);
  CHECK(engine.stats().wait_seconds > 0.015);
}

// Pinned slots come from the device API and go back to it.
void pinned_allocator_roundtrip() {
  auto api = fake_device_api();
  auto alloc = pinned_host_allocator(api);
  CHECK(alloc->pinned());
  void* p = alloc->allocate(12345);
  CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
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
  auto source = [&]() -> std::optional<HostBatch> {
    if (k == 3) return std::nullopt;
    HostBatch hb;
    hb.index = k++;
    hb.memory = std::shared_ptr<uint8_t>(new uint8_t[1], std::default_delete<uint8_t[]>());
    hb.bytes = 0;
    return hb;
  };
  TransferEngine engine(api, source, 2);
  for (int64_t i = 0; i < 3; ++i) CHECK(engine.next(0)->index == i);
  CHECK(!engine.next(0));
}

void bad_arguments() {
  auto api = fake_device_api();
  TestSource src;
  CHECK_THROWS(UsageError, TransferEngine(api, src.source(), 0));
  CHECK_THROWS(UsageError, TransferEngine(nullptr, src.source(), 1));
  CHECK_THROWS(UsageError, TransferEngine(api, nullptr, 1));
  auto other = DeviceBufferPool::create(fake_device_api(), 2);  // another device's pool
  CHECK_THROWS(UsageError, TransferEngine(api, src.source(), 1, other));
}

// NOTE [ Pool across epochs ]: with a pool that outlives the engine, ending an
// epoch waits for nothing queued on the consumer stream, and the next epoch's
// copy into a buffer still being read waits for that reader on the device.
// A closed gate at the head of the consumer stream stands for a GPU still busy
// with earlier steps.
void shared_pool_across_epochs() {
  auto api = fake_device_api({0, 0us});
  auto pool = DeviceBufferPool::create(api, 2);
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
    // The old per-epoch pool waited here for R_0, i.e. for the gate.
    auto stopped = std::async(std::launch::async, [&] { engine.stop(); });
    const bool prompt = stopped.wait_for(10s) == std::future_status::ready;
    CHECK(prompt);
    if (!prompt) open_gate();
  }
  CHECK_EQ(pool->buffers(), 1u);  // kept for the next epoch

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
  CHECK(pool->buffers() >= 1);
  pool.reset();  // the last reference frees the idle buffers
  CHECK_EQ(api->counts().device_buffers, 0);
  api->destroy_stream(consumer);
}

}  // namespace

TEST_MAIN(order_and_content(); slow_consumer_never_sees_overwrite(); default_stream_consumer();
          backpressure_is_prefetch(); consumer_holds_batches(); early_stop_frees_everything();
          destroy_without_consuming(); source_error_at_its_position();
          stop_wakes_blocked_consumer(); next_for_times_out(); pinned_allocator_roundtrip();
          empty_batches(); bad_arguments(); shared_pool_across_epochs())
