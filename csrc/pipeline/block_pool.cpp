#include "pipeline/block_pool.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <thread>

#include "common/error.h"

namespace stoker {

namespace {

class PageableAllocator final : public BlockAllocator {
 public:
  void* allocate(size_t bytes) override {
    constexpr size_t kAlign = 4096;
    const size_t n = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, n);
    if (!p) throw std::bad_alloc();
    // Large slots are written end to end once per batch: huge pages cut TLB misses.
    if (n >= (2u << 20)) ::madvise(p, n, MADV_HUGEPAGE);
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { std::free(p); }
  MemoryKind kind() const override { return MemoryKind::kPageable; }
};

// Capacities are rounded up, with headroom, so batches whose size varies a
// little (the padded length of a variable field, a short last batch) reuse
// the same blocks.
size_t round_capacity(size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  bytes += bytes / 8;
  const size_t g = bytes > (1u << 20) ? (64u << 10) : 256;
  return (bytes + g - 1) / g * g;
}

// Whether the fence `t` lets the block go now. A fence that fails (the device
// failed) never does: leaking is safer than freeing memory a kernel may read.
bool fence_done(BlockFence& fence, const BlockFence::Token& t, bool* failed) noexcept {
  try {
    return fence.done(t);
  } catch (...) {
    *failed = true;
    return false;
  }
}

}  // namespace

std::shared_ptr<BlockAllocator> pageable_allocator() {
  static auto alloc = std::make_shared<PageableAllocator>();
  return alloc;
}

std::shared_ptr<BlockPool> BlockPool::create(std::shared_ptr<BlockAllocator> alloc,
                                             std::shared_ptr<BlockFence> fence, size_t max_idle) {
  STOKER_CHECK(alloc != nullptr, UsageError, "BlockPool: no allocator");
  return std::shared_ptr<BlockPool>(new BlockPool(std::move(alloc), std::move(fence), max_idle));
}

BlockPool::BlockPool(std::shared_ptr<BlockAllocator> alloc, std::shared_ptr<BlockFence> fence,
                     size_t max_idle)
    : alloc_(std::move(alloc)),
      fence_(std::move(fence)),
      pid_(static_cast<int>(::getpid())),
      max_idle_(max_idle) {}

BlockPool::~BlockPool() {
  if (static_cast<int>(::getpid()) != pid_) return;  // forked child: the memory is the parent's
  // Nothing else holds the pool: no lock needed.
  std::vector<Idle> pending;
  std::vector<Idle> all = std::move(idle_);
  for (Idle& d : deferred_) all.push_back(std::move(d));
  for (Idle& i : all) {
    bool failed = false;
    if (!i.fence || fence_done(*fence_, i.fence, &failed))
      alloc_->deallocate(i.block.data, i.block.capacity);
    else if (!failed)
      pending.push_back(std::move(i));
  }
  if (pending.empty()) return;
  // NOTE [ Deferred frees ]: the last owner may be a deleter, so no wait here;
  // a short-lived thread frees them once their readers are done.
  try {
    std::thread([alloc = alloc_, fence = fence_, pending = std::move(pending)]() mutable {
      pthread_setname_np(pthread_self(), "stoker-free");
      for (Idle& i : pending) {
        bool failed = false;
        while (!fence_done(*fence, i.fence, &failed) && !failed)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!failed) alloc->deallocate(i.block.data, i.block.capacity);
      }
    }).detach();
  } catch (...) {
    // No thread to be had: the blocks leak rather than be freed under a reader.
  }
}

void BlockPool::free_block(const Block& b) noexcept {
  alloc_->deallocate(b.data, b.capacity);
  std::lock_guard<std::mutex> lock(mu_);
  --live_;
  live_bytes_ -= b.capacity;
}

void BlockPool::retire(Idle idle) noexcept {
  bool failed = false;
  if (!idle.fence || fence_done(*fence_, idle.fence, &failed)) {
    free_block(idle.block);
    return;
  }
  if (failed) return;  // the device failed: the block leaks (counted as alive)
  std::lock_guard<std::mutex> lock(mu_);
  deferred_.push_back(std::move(idle));
  deferred_count_.store(deferred_.size(), std::memory_order_release);
}

size_t BlockPool::collect() noexcept {
  if (deferred_count_.load(std::memory_order_acquire) == 0) return 0;
  std::vector<Block> ready;
  size_t left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < deferred_.size();) {
      bool failed = false;
      if (fence_done(*fence_, deferred_[i].fence, &failed) || failed) {
        if (!failed) ready.push_back(deferred_[i].block);  // a failed one leaks
        deferred_[i] = std::move(deferred_.back());
        deferred_.pop_back();
      } else {
        ++i;
      }
    }
    left = deferred_.size();
    deferred_count_.store(left, std::memory_order_release);
  }
  for (const Block& b : ready) free_block(b);
  return left;
}

BlockPool::Block BlockPool::allocate(size_t bytes) {
  Block b;
  b.capacity = round_capacity(bytes);
  try {
    b.data = alloc_->allocate(b.capacity);
  } catch (...) {
    // Out of memory, perhaps because of idle blocks too small to use, or
    // deferred ones: free them and try once more. The thread that fills blocks
    // is the one here (the copy thread for device memory), so it may wait for
    // their fences; a deleter never comes here.
    std::vector<Idle> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all.swap(idle_);
      for (Idle& d : deferred_) all.push_back(std::move(d));
      deferred_.clear();
      deferred_count_.store(0, std::memory_order_release);
    }
    if (all.empty()) throw;
    for (Idle& i : all) {
      try {
        if (i.fence) fence_->wait(i.fence);
      } catch (...) {
        continue;  // the device failed: leak it
      }
      free_block(i.block);
    }
    b.data = alloc_->allocate(b.capacity);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++live_;
  live_bytes_ += b.capacity;
  return b;
}

BlockPool::Block BlockPool::acquire(size_t bytes, uintptr_t stream) {
  std::optional<Idle> found;
  std::vector<Idle> evict;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Best fit; among equal fits the most recently released block, whose bytes are
    // the likeliest to be still in cache (a batch written into a cold block costs
    // its reads-for-ownership from memory).
    // (NOTE [ Idle pages ]: among equal fits, one that still has its pages.)
    size_t best = idle_.size();
    for (size_t i = idle_.size(); i-- > 0;) {
      const Idle& c = idle_[i];
      if (c.block.capacity < bytes) continue;
      if (best == idle_.size() || c.block.capacity < idle_[best].block.capacity ||
          (c.block.capacity == idle_[best].block.capacity && c.resident && !idle_[best].resident))
        best = i;
    }
    if (best < idle_.size()) {
      found = std::move(idle_[best]);
      idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(best));
    } else if (!idle_.empty() && idle_.size() >= max_idle_) {
      // Nothing fits and the idle list is full: the batches grew. Free the
      // smallest idle block first, to keep the peak down.
      auto smallest = std::min_element(
          idle_.begin(), idle_.end(),
          [](const Idle& a, const Idle& b) { return a.block.capacity < b.block.capacity; });
      evict.push_back(std::move(*smallest));
      idle_.erase(smallest);
    }
  }
  for (Idle& i : evict) retire(std::move(i));
  if (!found) return allocate(bytes);
  if (found->fence) {
    try {
      // The writer waits, on the device, for the last reader of the old contents.
      fence_->order_after(found->fence, stream);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      idle_.push_back(std::move(*found));
      throw;
    }
  }
  return found->block;
}

std::shared_ptr<BlockPool::Lease> BlockPool::lease(size_t bytes, uintptr_t stream) {
  Block b = acquire(bytes, stream);
  try {
    return std::shared_ptr<Lease>(new Lease(shared_from_this(), b));
  } catch (...) {
    release(b);
    throw;
  }
}

void BlockPool::release(Block b, std::optional<uintptr_t> reader) noexcept {
  if (static_cast<int>(::getpid()) != pid_) return;  // forked child: never touch the parent's pool
  Idle idle{b, nullptr};
  const bool recyclable = alloc_->recyclable(b.data);
  if (reader && fence_) {
    try {
      idle.fence = fence_->record(*reader);
    } catch (const std::exception& e) {
      // The stream is gone or the device failed: nothing tells when the
      // readers are done, so the block is never reused or freed.
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true, std::memory_order_relaxed))
        std::fprintf(stderr, "stoker: leaking a device buffer: cannot record its release: %s\n",
                     e.what());
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (recyclable && idle_.size() < max_idle_) {
      idle_.push_back(std::move(idle));
      keep_resident_locked();
      return;
    }
  }
  retire(std::move(idle));
}

void BlockPool::keep_resident_locked() noexcept {
  // NOTE [ Idle pages ]: the oldest resident idle blocks past kResidentIdle give
  // their pages back (under the lock: no lease may take a block meanwhile).
  size_t resident = 0;
  for (const Idle& i : idle_) resident += i.resident ? 1 : 0;
  for (Idle& i : idle_) {
    if (resident <= kResidentIdle) return;
    if (!i.resident || i.fence) continue;  // (a fenced block may still be read)
    if (!alloc_->release_pages(i.block.data, i.block.capacity)) return;
    i.resident = false;
    --resident;
  }
}

void BlockPool::set_max_idle(size_t n) {
  std::vector<Idle> evict;
  {
    std::lock_guard<std::mutex> lock(mu_);
    max_idle_ = n;
    while (idle_.size() > max_idle_) {
      evict.push_back(std::move(idle_.back()));
      idle_.pop_back();
    }
  }
  for (Idle& i : evict) retire(std::move(i));
}

size_t BlockPool::blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

size_t BlockPool::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_bytes_;
}

size_t BlockPool::deferred() const { return deferred_count_.load(std::memory_order_acquire); }

}  // namespace stoker
