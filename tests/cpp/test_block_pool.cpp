// BlockPool (NOTE [ Block lifetime ]): best-fit reuse of idle blocks, the
// max_idle bound, leases that come back when their last copy drops (also after
// every other owner of the pool is gone), set_max_idle(0), the retry after an
// allocation failure, many threads at once, and the fence: over the fake
// device, a block released with a reader stream is reused, and freed, only
// behind that reader, and no release or pool end ever waits for it (NOTE
// [ Deferred frees ]).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "cuda/fake_device_api.h"
#include "cuda/pinned_allocator.h"
#include "pipeline/block_pool.h"
#include "test_threads.h"

using namespace stoker;
using namespace std::chrono_literals;

namespace {

/// Host memory with counts, a check of every free, and failures on demand.
class CountingAllocator final : public BlockAllocator {
 public:
  void* allocate(size_t bytes) override {
    if (fail_next.load() > 0) {
      fail_next.fetch_sub(1);
      failures.fetch_add(1);
      throw std::bad_alloc();
    }
    const size_t n = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, n);
    if (!p) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(p);
    allocs.fetch_add(1);
    return p;
  }
  void deallocate(void* p, size_t) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (live_.erase(p) != 1) {
        std::fprintf(stderr, "deallocate of a pointer not allocated (or freed twice)\n");
        std::abort();
      }
    }
    frees.fetch_add(1);
    std::free(p);
  }
  MemoryKind kind() const override { return MemoryKind::kPageable; }

  bool is_live(const void* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(const_cast<void*>(p)) == 1;
  }
  size_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }

  std::atomic<int> allocs{0}, frees{0}, failures{0};
  std::atomic<int> fail_next{0};  ///< the next this-many allocations throw

 private:
  mutable std::mutex mu_;
  std::set<void*> live_;
};

// An idle block is reused when it fits: the smallest one that does.
void best_fit_reuse() {
  auto alloc = std::make_shared<CountingAllocator>();
  auto pool = BlockPool::create(alloc, nullptr, 8);
  CHECK(pool->kind() == MemoryKind::kPageable);
  BlockPool::Block a = pool->acquire(1000), b = pool->acquire(5000), c = pool->acquire(20000);
  CHECK(a.capacity >= 1000 && b.capacity >= 5000 && c.capacity >= 20000);
  CHECK(a.capacity < 4000);
  CHECK(reinterpret_cast<uintptr_t>(a.data) % 256 == 0);
  CHECK_EQ(pool->blocks(), 3u);
  CHECK_EQ(pool->bytes(), a.capacity + b.capacity + c.capacity);
  std::memset(c.data, 7, 20000);
  pool->release(a);
  pool->release(c);
  pool->release(b);
  CHECK_EQ(pool->blocks(), 3u);  // idle blocks count as alive
  CHECK_EQ(alloc->live(), 3u);

  BlockPool::Block x = pool->acquire(4000);  // a is too small, b is the best fit
  CHECK(x.data == b.data && x.capacity == b.capacity);
  BlockPool::Block y = pool->acquire(100);
  CHECK(y.data == a.data);
  BlockPool::Block z = pool->acquire(4000);  // b is taken: c fits
  CHECK(z.data == c.data);
  CHECK_EQ(alloc->allocs.load(), 3);
  for (auto* blk : {&x, &y, &z}) pool->release(*blk);

  // Nothing fits: a new block, the idle ones stay (room for them).
  BlockPool::Block big = pool->acquire(30000);
  CHECK(big.data != a.data && big.data != b.data && big.data != c.data);
  CHECK_EQ(alloc->allocs.load(), 4);
  CHECK_EQ(pool->blocks(), 4u);
  pool->release(big);
  // Sizes that vary a little (a short last batch) reuse the same block.
  BlockPool::Block again = pool->acquire(29000);
  CHECK(again.data == big.data);
  pool->release(again);
  CHECK_EQ(alloc->frees.load(), 0);
  pool.reset();
  CHECK_EQ(alloc->live(), 0u);  // the pool frees its idle blocks
}

// At most max_idle blocks stay idle; when nothing fits and the idle list is
// full, the smallest idle block is freed first.
void max_idle_bound() {
  auto alloc = std::make_shared<CountingAllocator>();
  auto pool = BlockPool::create(alloc, nullptr, 2);
  std::vector<BlockPool::Block> bs;
  for (int i = 0; i < 5; ++i) bs.push_back(pool->acquire(1000));
  CHECK_EQ(pool->blocks(), 5u);
  for (auto& b : bs) pool->release(b);
  CHECK_EQ(pool->blocks(), 2u);
  CHECK_EQ(alloc->live(), 2u);
  CHECK_EQ(alloc->frees.load(), 3);

  pool->set_max_idle(1);
  CHECK_EQ(pool->blocks(), 1u);
  pool->set_max_idle(0);
  CHECK_EQ(pool->blocks(), 0u);
  BlockPool::Block one = pool->acquire(10);
  pool->release(one);  // nothing may stay idle
  CHECK_EQ(pool->blocks(), 0u);
  CHECK_EQ(alloc->live(), 0u);

  pool->set_max_idle(2);
  BlockPool::Block small = pool->acquire(1000), mid = pool->acquire(8000);
  pool->release(small);
  pool->release(mid);
  CHECK_EQ(pool->blocks(), 2u);
  BlockPool::Block huge = pool->acquire(100000);  // fits nowhere, idle list full
  CHECK(!alloc->is_live(small.data));             // the smallest went first
  CHECK(alloc->is_live(mid.data));
  CHECK_EQ(pool->blocks(), 2u);
  pool->release(huge);
  CHECK_EQ(pool->blocks(), 2u);
  pool.reset();
  CHECK_EQ(alloc->live(), 0u);
}

// A lease: the block goes back when the last copy drops, not before, and it
// may outlive every other owner of the pool.
void shared_blocks() {
  auto alloc = std::make_shared<CountingAllocator>();
  auto pool = BlockPool::create(alloc, nullptr, 4);
  std::shared_ptr<uint8_t> s = BlockPool::Lease::bytes(pool->lease(3000));
  std::memset(s.get(), 1, 3000);
  std::shared_ptr<uint8_t> s2 = s;
  s.reset();
  // Still in use: not handed out again.
  BlockPool::Block other = pool->acquire(3000);
  CHECK(other.data != s2.get());
  pool->release(other);
  CHECK_EQ(s2.get()[2999], 1);
  void* first = s2.get();
  s2.reset();  // now it is idle
  CHECK_EQ(pool->blocks(), 2u);
  CHECK_EQ(alloc->frees.load(), 0);
  std::shared_ptr<uint8_t> t = BlockPool::Lease::bytes(pool->lease(3000));
  std::shared_ptr<uint8_t> u = BlockPool::Lease::bytes(pool->lease(3000));
  CHECK((t.get() == first || u.get() == first) && t.get() != u.get());
  CHECK_EQ(alloc->allocs.load(), 2);
  t.reset();
  u.reset();

  // The pool's last owner is a block: dropping it frees everything.
  std::shared_ptr<uint8_t> kept = BlockPool::Lease::bytes(pool->lease(100));
  std::weak_ptr<BlockPool> weak = pool;
  pool.reset();
  CHECK(!weak.expired());  // the block holds the pool
  std::memset(kept.get(), 2, 100);
  CHECK(alloc->live() >= 1u);
  // Dropped on another thread, as a DLPack deleter may be.
  std::thread([k = std::move(kept)]() mutable { k.reset(); }).join();
  CHECK(weak.expired());
  CHECK_EQ(alloc->live(), 0u);
}

// set_max_idle(0): the idle blocks are freed now, the others as they come back;
// the pool still works, keeping nothing.
void max_idle_zero_frees_blocks() {
  auto alloc = std::make_shared<CountingAllocator>();
  auto pool = BlockPool::create(alloc, nullptr, 8);
  std::vector<BlockPool::Block> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(pool->acquire(500 * (i + 1)));
  BlockPool::Block raw = pool->acquire(700);
  std::shared_ptr<uint8_t> shared = BlockPool::Lease::bytes(pool->lease(900));
  for (auto& b : idle) pool->release(b);
  CHECK_EQ(alloc->live(), 5u);
  pool->set_max_idle(0);
  CHECK_EQ(alloc->live(), 2u);
  CHECK_EQ(pool->blocks(), 2u);
  pool->release(raw);
  CHECK_EQ(alloc->live(), 1u);
  shared.reset();
  CHECK_EQ(alloc->live(), 0u);
  CHECK_EQ(pool->blocks(), 0u);
  CHECK_EQ(pool->bytes(), 0u);
  BlockPool::Block late = pool->acquire(64);
  CHECK(late.data != nullptr);
  pool->release(late);
  CHECK_EQ(alloc->live(), 0u);
  CHECK_THROWS(UsageError, BlockPool::create(nullptr, nullptr, 1));
}

// An allocation that fails while idle blocks exist (too small to use) frees
// them and tries once more; with nothing to free, the failure propagates.
void out_of_memory_retry() {
  auto alloc = std::make_shared<CountingAllocator>();
  auto pool = BlockPool::create(alloc, nullptr, 4);
  std::vector<BlockPool::Block> bs;
  for (int i = 0; i < 3; ++i) bs.push_back(pool->acquire(1000));
  for (auto& b : bs) pool->release(b);
  CHECK_EQ(alloc->live(), 3u);
  alloc->fail_next.store(1);
  BlockPool::Block big = pool->acquire(1 << 20);
  CHECK(big.data != nullptr && big.capacity >= (1u << 20));
  std::memset(big.data, 3, 1 << 20);
  CHECK_EQ(alloc->failures.load(), 1);
  CHECK_EQ(alloc->frees.load(), 3);  // the idle blocks made room
  CHECK_EQ(alloc->live(), 1u);
  CHECK_EQ(pool->blocks(), 1u);
  CHECK_EQ(pool->bytes(), big.capacity);

  alloc->fail_next.store(1);  // nothing idle to free: the error is the caller's
  CHECK_THROWS(std::bad_alloc, pool->acquire(1 << 20));
  CHECK_EQ(pool->blocks(), 1u);

  pool->release(big);
  BlockPool::Block small = pool->acquire(10);  // reuses big: no allocation
  pool->release(small);
  alloc->fail_next.store(2);  // the retry fails too
  CHECK_THROWS(std::bad_alloc, pool->acquire(4 << 20));
  CHECK_EQ(pool->blocks(), 0u);  // the idle block was freed for the retry
  CHECK_EQ(alloc->live(), 0u);
  alloc->fail_next.store(1);
  CHECK_THROWS(std::bad_alloc, BlockPool::Lease::bytes(pool->lease(100)));
  CHECK_EQ(pool->blocks(), 0u);
  std::shared_ptr<uint8_t> ok = BlockPool::Lease::bytes(pool->lease(100));  // the pool still works
  CHECK(ok != nullptr);
  ok.reset();
  pool.reset();
  CHECK_EQ(alloc->live(), 0u);
}

// Threads acquire, fill, check and release (directly and through shared
// copies dropped on other threads): no block is ever handed to two users.
void many_threads() {
  auto alloc = std::make_shared<CountingAllocator>();
  auto pool = BlockPool::create(alloc, nullptr, 6);
  const int64_t rounds = test::scaled(20000, 1000);
  std::atomic<int> bad{0};
  std::mutex handoff_mu;
  std::vector<std::shared_ptr<uint8_t>> handoff;  // shared blocks dropped by the next thread
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      uint64_t rng = static_cast<uint64_t>(t) * 7919 + 1;
      for (int64_t i = 0; i < rounds; ++i) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const size_t bytes = 64 + (rng >> 33) % 5000;
        const auto tag = static_cast<uint8_t>(t * 50 + i % 50);
        if (i % 3 == 0) {
          std::shared_ptr<uint8_t> s = BlockPool::Lease::bytes(pool->lease(bytes));
          std::memset(s.get(), tag, bytes);
          std::this_thread::yield();
          if (s.get()[0] != tag || s.get()[bytes - 1] != tag) bad.fetch_add(1);
          std::lock_guard<std::mutex> lock(handoff_mu);
          handoff.push_back(std::move(s));
          if (handoff.size() > 3) handoff.erase(handoff.begin());
        } else {
          BlockPool::Block b = pool->acquire(bytes);
          if (b.capacity < bytes) bad.fetch_add(1);
          std::memset(b.data, tag, bytes);
          std::this_thread::yield();
          const auto* p = static_cast<const uint8_t*>(b.data);
          if (p[0] != tag || p[bytes / 2] != tag || p[bytes - 1] != tag) bad.fetch_add(1);
          pool->release(b);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK_EQ(bad.load(), 0);
  handoff.clear();
  CHECK(pool->blocks() <= 6u);
  pool.reset();
  CHECK_EQ(alloc->live(), 0u);
}

/// A gate a fake "kernel" blocks on: a GPU busy with earlier work.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

// The fence: a device block released with a reader stream is rewritten (on
// another stream) only after that reader's work, and freed only after it.
void fence_orders_reuse_after_reader() {
  auto api = fake_device_api({0, 0us});
  auto pool = device_buffer_pool(api, 2);
  CHECK(pool->kind() == MemoryKind::kDevice);
  const StreamHandle writer = api->create_stream(), reader = api->create_stream();
  constexpr size_t kBytes = 4096;
  std::vector<uint8_t> first(kBytes, 0xA1), second(kBytes, 0xB2);
  const EventHandle copied = api->create_event(false);

  for (bool fenced : {true, false}) {
    BlockPool::Block b = pool->acquire(kBytes, writer);
    api->copy_to_device_async(b.data, first.data(), kBytes, writer);
    api->record_event(copied, writer);
    api->stream_wait_event(reader, copied);
    Gate gate;
    std::atomic<int> saw{-1};
    const auto* data = static_cast<const uint8_t*>(b.data);
    api->launch(reader, [&gate, &saw, data] {  // a kernel that reads the block late
      gate.wait();
      saw.store(std::all_of(data, data + kBytes, [](uint8_t v) { return v == 0xA1; }) ? 1 : 0);
    });
    if (fenced)
      pool->release(b, reader);
    else
      pool->release(b);  // the control: nothing says a kernel still reads it

    BlockPool::Block again = pool->acquire(kBytes, writer);
    CHECK(again.data == b.data);  // the only idle block
    api->copy_to_device_async(again.data, second.data(), kBytes, writer);
    api->record_event(copied, writer);
    if (fenced) {
      // The copy waits for the reader, which waits for the gate.
      std::this_thread::sleep_for(20ms);
      CHECK(!api->query_event(copied));
      gate.release();
      api->synchronize_stream(writer);
      api->synchronize_stream(reader);
      CHECK_EQ(saw.load(), 1);  // the kernel saw its own bytes
    } else {
      api->synchronize_stream(writer);  // the overwrite ran while the kernel waited
      gate.release();
      api->synchronize_stream(reader);
      CHECK_EQ(saw.load(), 0);  // so the test above can tell
    }
    pool->release(again);
  }

  // Freeing waits for the reader too, but nothing waits for it: set_max_idle(0) defers a
  // block a kernel reads, and collect() frees it once the kernel is done.
  BlockPool::Block c = pool->acquire(100000, writer);
  std::memset(second.data(), 0xC3, kBytes);
  api->copy_to_device_async(c.data, second.data(), kBytes, writer);
  api->record_event(copied, writer);
  api->stream_wait_event(reader, copied);
  Gate gate;
  std::atomic<int> saw{-1};
  const auto* data = static_cast<const uint8_t*>(c.data);
  api->launch(reader, [&gate, &saw, data] {
    gate.wait();
    saw.store(std::all_of(data, data + kBytes, [](uint8_t v) { return v == 0xC3; }) ? 1 : 0);
  });
  pool->release(c, reader);
  pool->set_max_idle(0);  // returns at once
  CHECK_EQ(pool->deferred(), 1u);
  CHECK_EQ(api->counts().device_buffers, 1);
  CHECK_EQ(pool->collect(), 1u);  // still read
  CHECK_EQ(saw.load(), -1);
  gate.release();
  api->synchronize_stream(reader);
  CHECK_EQ(saw.load(), 1);  // the kernel read its bytes: nothing was freed under it
  CHECK_EQ(pool->collect(), 0u);
  CHECK_EQ(api->counts().device_buffers, 0);
  CHECK_EQ(pool->blocks(), 0u);
  api->destroy_event(copied);
  pool.reset();
  CHECK_EQ(api->counts().events, 0);  // the fence's events went back with the pool
  api->destroy_stream(writer);
  api->destroy_stream(reader);
}

// NOTE [ Deferred frees ]: a lease whose reader is still at work is dropped (as a
// DLPack deleter drops it) without waiting, even when the pool keeps no idle
// block and when the pool dies with it. The block is freed once the reader is
// done: by the pool's collect(), or, for a pool that died, by its own thread.
void deleters_never_wait() {
  auto api = fake_device_api({0, 0us});
  const StreamHandle reader = api->create_stream();
  for (bool pool_dies : {false, true}) {
    auto pool = device_buffer_pool(api, 0);  // keeps nothing idle: every block is freed
    std::shared_ptr<BlockPool::Lease> lease = pool->lease(5000);
    std::shared_ptr<uint8_t> bytes = BlockPool::Lease::bytes(lease);
    lease->set_reader(reader);
    lease.reset();
    Gate gate;
    api->launch(reader, [&gate] { gate.wait(); });  // the consumer's kernels, still queued
    std::weak_ptr<BlockPool> weak = pool;
    if (pool_dies) pool.reset();  // the lease is the pool's last owner
    auto dropped = std::async(std::launch::async, [b = std::move(bytes)]() mutable { b.reset(); });
    CHECK(dropped.wait_for(5s) == std::future_status::ready);  // did not wait for the gate
    CHECK_EQ(weak.expired(), pool_dies);
    if (!pool_dies) CHECK_EQ(pool->collect(), 1u);  // still read
    std::this_thread::sleep_for(20ms);
    CHECK_EQ(api->counts().device_buffers, 1);  // nothing freed under the reader
    gate.release();
    api->synchronize_stream(reader);
    if (!pool_dies) CHECK_EQ(pool->collect(), 0u);
    CHECK(test::eventually([&] { return api->counts().device_buffers == 0; }));
    CHECK(test::eventually([&] { return test::threads_named("stoker-free") == 0; }));
  }
  api->destroy_stream(reader);
}

// A release whose fence cannot be recorded (a dead stream) leaks the block
// rather than reuse or free memory a reader may still use; an acquire whose
// wait cannot be queued keeps the block idle and throws.
void fence_failures() {
  auto api = fake_device_api({0, 0us});
  auto pool = device_buffer_pool(api, 4);
  const StreamHandle s = api->create_stream();
  const StreamHandle dead = 0xDEAD0;  // no such stream
  BlockPool::Block leaked = pool->acquire(1000, s);
  pool->release(leaked, dead);  // never throws
  CHECK_EQ(pool->blocks(), 1u);
  BlockPool::Block fresh = pool->acquire(1000, s);
  CHECK(fresh.data != leaked.data);
  pool->release(fresh, s);
  CHECK_THROWS(CudaError, pool->acquire(1000, dead));
  CHECK_EQ(pool->blocks(), 2u);
  BlockPool::Block back = pool->acquire(1000, s);
  CHECK(back.data == fresh.data);  // still idle after the failed acquire
  pool->release(back, s);
  api->synchronize_stream(s);  // else the pool's end hands `back` on, still fenced
  pool.reset();
  CHECK_EQ(api->counts().device_buffers, 1);  // only the leaked one
  api->free_device(leaked.data);
  api->destroy_stream(s);
}

// Allocator kinds for the three memories.
void allocator_kinds() {
  auto api = fake_device_api();
  CHECK(pageable_allocator()->kind() == MemoryKind::kPageable);
  CHECK(pinned_host_allocator(api)->kind() == MemoryKind::kPinned);
  CHECK(device_allocator(api)->kind() == MemoryKind::kDevice);
  auto pinned = BlockPool::create(pinned_host_allocator(api), nullptr, 2);
  std::shared_ptr<uint8_t> p = BlockPool::Lease::bytes(pinned->lease(5000));
  CHECK(reinterpret_cast<uintptr_t>(p.get()) % 256 == 0);
  CHECK_EQ(api->counts().pinned_buffers, 1);
  p.reset();
  pinned.reset();
  CHECK_EQ(api->counts().pinned_buffers, 0);
  auto pageable = BlockPool::create(pageable_allocator(), nullptr, 1);
  BlockPool::Block big = pageable->acquire(3 << 20);  // huge-page advice path
  CHECK(reinterpret_cast<uintptr_t>(big.data) % 4096 == 0);
  std::memset(big.data, 1, 3 << 20);
  pageable->release(big);
  CHECK_THROWS(UsageError, device_allocator(nullptr));
  CHECK_THROWS(UsageError, device_buffer_pool(nullptr, 1));
}

/// Host memory whose idle pages can be given back: records which blocks were.
class PagingAllocator final : public BlockAllocator {
 public:
  void* allocate(size_t bytes) override {
    return std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  }
  void deallocate(void* p, size_t) noexcept override { std::free(p); }
  MemoryKind kind() const override { return MemoryKind::kPageable; }
  bool release_pages(void* p, size_t) noexcept override {
    paged.push_back(p);  // (called under the pool's lock)
    return true;
  }
  std::vector<void*> paged;
};

// NOTE [ Idle pages ]: one idle block keeps its pages, the one given back last;
// the older idle blocks give theirs back, and a lease prefers a block that
// still has its pages among equal fits.
void idle_blocks_past_one_give_their_pages_back() {
  auto alloc = std::make_shared<PagingAllocator>();
  auto pool = BlockPool::create(alloc, nullptr, 8);
  BlockPool::Block a = pool->acquire(4096), b = pool->acquire(4096), c = pool->acquire(4096);
  pool->release(a);
  CHECK(alloc->paged.empty());  // the one idle block keeps its pages
  pool->release(b);
  CHECK(alloc->paged == std::vector<void*>{a.data});  // the older one gives them back
  pool->release(c);
  CHECK((alloc->paged == std::vector<void*>{a.data, b.data}));
  CHECK_EQ(pool->blocks(), 3u);  // still the pool's
  BlockPool::Block x = pool->acquire(4096);
  CHECK(x.data == c.data);  // the one with its pages
  BlockPool::Block y = pool->acquire(4096);
  CHECK(y.data == b.data);  // then the most recent
  pool->release(y);         // b idle beside a (paged): it keeps its pages
  CHECK_EQ(alloc->paged.size(), 2u);
  pool->release(x);  // two resident again: the older, b, gives its pages back
  CHECK((alloc->paged == std::vector<void*>{a.data, b.data, b.data}));
  // a smaller fit wins over a resident larger one
  BlockPool::Block big = pool->acquire(100000);
  pool->release(big);
  BlockPool::Block small = pool->acquire(100);
  CHECK(small.data != big.data);
  pool->release(small);
}

}  // namespace

TEST_MAIN(best_fit_reuse(); max_idle_bound(); shared_blocks(); max_idle_zero_frees_blocks();
          out_of_memory_retry(); many_threads(); fence_orders_reuse_after_reader();
          deleters_never_wait(); fence_failures(); allocator_kinds();
          idle_blocks_past_one_give_their_pages_back())
