// Batch slots: host buffers that batches are assembled into, reused across
// batches.
//
// NOTE [ Slot lifetime ]
//   pool.acquire() -> shared_ptr<uint8_t> (aliasing the Slot)
//        |  workers write the batch, the consumer exports it via DLPack
//        v
//   last tensor freed (any thread, maybe after the loader is gone)
//        -> deleter returns the slot to the pool's free list
// The deleter holds the pool by shared_ptr, so the pool outlives every slot it
// handed out. When the user keeps batches, acquire() allocates new slots
// instead of waiting, so list(loader) never deadlocks; the free list keeps at
// most `max_free` slots so memory returns to the system afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "pipeline/batch.h"

namespace stoker {

class SlotPool : public std::enable_shared_from_this<SlotPool> {
 public:
  static std::shared_ptr<SlotPool> create(std::shared_ptr<HostAllocator> alloc, size_t max_free);
  ~SlotPool();

  /// A buffer of at least `bytes`; reuses a free slot when one is big enough.
  std::shared_ptr<uint8_t> acquire(size_t bytes);
  bool pinned() const { return alloc_->pinned(); }

  size_t slots_allocated() const;  ///< total slots ever alive now (free + in use)
  size_t bytes_allocated() const;

 private:
  struct Slot {
    uint8_t* data;
    size_t capacity;
  };
  SlotPool(std::shared_ptr<HostAllocator> alloc, size_t max_free)
      : alloc_(std::move(alloc)), max_free_(max_free) {}
  void release(Slot s) noexcept;

  std::shared_ptr<HostAllocator> alloc_;
  size_t max_free_;
  mutable std::mutex mu_;
  std::vector<Slot> free_;
  size_t live_ = 0;
  size_t live_bytes_ = 0;
};

}  // namespace stoker
