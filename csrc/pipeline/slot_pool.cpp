#include "pipeline/slot_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "common/error.h"

namespace stoker {

namespace {

class AlignedAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    constexpr size_t kAlign = 4096;
    size_t n = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, n);
    if (!p) throw std::bad_alloc();
    // Large slots are touched once per batch end to end: huge pages cut TLB misses.
    if (n >= (2u << 20)) ::madvise(p, n, MADV_HUGEPAGE);
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { std::free(p); }
};

}  // namespace

std::shared_ptr<HostAllocator> default_host_allocator() {
  static auto alloc = std::make_shared<AlignedAllocator>();
  return alloc;
}

std::shared_ptr<SlotPool> SlotPool::create(std::shared_ptr<HostAllocator> alloc,
                                           size_t max_free) {
  return std::shared_ptr<SlotPool>(new SlotPool(std::move(alloc), max_free));
}

SlotPool::~SlotPool() {
  for (const Slot& s : free_) alloc_->deallocate(s.data, s.capacity);
}

std::shared_ptr<uint8_t> SlotPool::acquire(size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
  Slot slot{nullptr, 0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Best fit among free slots that are big enough; else reuse the largest by regrowing.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->capacity >= bytes && (best == free_.end() || it->capacity < best->capacity)) best = it;
    if (best == free_.end() && !free_.empty())
      best = std::max_element(free_.begin(), free_.end(),
                              [](const Slot& a, const Slot& b) { return a.capacity < b.capacity; });
    if (best != free_.end()) {
      slot = *best;
      free_.erase(best);
    } else {
      ++live_;
    }
  }
  if (slot.data && slot.capacity < bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    live_bytes_ -= slot.capacity;
    alloc_->deallocate(slot.data, slot.capacity);
    slot = {nullptr, 0};
  }
  if (!slot.data) {
    size_t cap = bytes + bytes / 8;  // headroom for variable-length batches
    try {
      slot = {static_cast<uint8_t*>(alloc_->allocate(cap)), cap};
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      --live_;
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_bytes_ += cap;
  }
  auto self = shared_from_this();
  auto holder = std::shared_ptr<Slot>(new Slot(slot), [self](Slot* s) {
    self->release(*s);
    delete s;
  });
  return std::shared_ptr<uint8_t>(holder, slot.data);
}

void SlotPool::release(Slot s) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < max_free_) {
    free_.push_back(s);
    return;
  }
  --live_;
  live_bytes_ -= s.capacity;
  alloc_->deallocate(s.data, s.capacity);
}

size_t SlotPool::slots_allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

size_t SlotPool::bytes_allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_bytes_;
}

}  // namespace stoker
