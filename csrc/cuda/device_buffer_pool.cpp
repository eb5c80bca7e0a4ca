#include "cuda/device_buffer_pool.h"

#include <atomic>
#include <chrono>
#include <cstdio>

#include "common/error.h"

namespace stoker {

namespace {

// Sizes are rounded up so batches whose size varies a little (the padded
// length of a variable field, the short last batch) reuse the same buffers.
size_t round_capacity(size_t bytes) {
  constexpr size_t kSmall = 64 << 10, kLarge = 1 << 20;
  const size_t g = bytes > kLarge ? kLarge : kSmall;
  return (std::max<size_t>(bytes, 1) + g - 1) / g * g;
}

// Waits for `e` without a deadline: a buffer must not be freed while a kernel
// may read it, and a recorded event always completes unless the device fails
// (then wait_event throws). Polls in slices so a stuck device shows up as a
// loop in a debugger rather than an opaque driver wait.
void wait_completed(DeviceApi& api, EventHandle e) {
  while (!api.wait_event(e, std::chrono::milliseconds(100))) {
  }
}

}  // namespace

std::shared_ptr<DeviceBufferPool> DeviceBufferPool::create(std::shared_ptr<DeviceApi> api,
                                                           size_t max_free) {
  return std::shared_ptr<DeviceBufferPool>(new DeviceBufferPool(std::move(api), max_free));
}

DeviceBufferPool::DeviceBufferPool(std::shared_ptr<DeviceApi> api, size_t max_free)
    : api_(std::move(api)), events_(EventPool::create(api_, false)), max_free_(max_free) {
  idle_.reserve(max_free_ + 1);
}

DeviceBufferPool::~DeviceBufferPool() {
  for (Idle& i : idle_) free_now(std::move(i));
}

void DeviceBufferPool::free_now(Idle idle) noexcept {
  try {
    if (idle.released) wait_completed(*api_, *idle.released);
  } catch (...) {
    return;  // the device failed: leaking is safer than freeing memory a kernel may use
  }
  api_->free_device(idle.buffer.data);
  std::lock_guard<std::mutex> lock(mu_);
  --live_;
  live_bytes_ -= idle.buffer.capacity;
}

DeviceBufferPool::Buffer DeviceBufferPool::acquire(size_t bytes, StreamHandle stream) {
  std::optional<Idle> found;
  std::vector<Idle> evict;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i)
      if (idle_[i].buffer.capacity >= bytes &&
          (best == idle_.size() || idle_[i].buffer.capacity < idle_[best].buffer.capacity))
        best = i;
    if (best < idle_.size()) {
      found = std::move(idle_[best]);
      idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(best));
    }
    // Keep at most max_free_ idle buffers (the user may have returned many at
    // once). When nothing fits, the batches grew: make room for the new
    // buffer first, dropping the smallest, to keep the peak down.
    const size_t keep = found ? max_free_ : (max_free_ > 0 ? max_free_ - 1 : 0);
    while (idle_.size() > keep) {
      size_t smallest = 0;
      for (size_t i = 1; i < idle_.size(); ++i)
        if (idle_[i].buffer.capacity < idle_[smallest].buffer.capacity) smallest = i;
      evict.push_back(std::move(idle_[smallest]));
      idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(smallest));
    }
  }
  for (Idle& i : evict) free_now(std::move(i));

  if (found) {
    // NOTE [ Stream ordering ] (transfer_engine.h): the copy that overwrites
    // the buffer waits, on the device, for the user's last kernel on it.
    if (found->released) {
      try {
        api_->stream_wait_event(stream, *found->released);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        idle_.push_back(std::move(*found));
        throw;
      }
    }
    return found->buffer;
  }

  Buffer b;
  b.capacity = round_capacity(bytes);
  try {
    b.data = api_->alloc_device(b.capacity);
  } catch (const CudaError&) {
    // Out of memory, perhaps because of idle buffers too small to use: free
    // them all and try once more.
    std::vector<Idle> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all.swap(idle_);
      idle_.reserve(max_free_ + 1);
    }
    if (all.empty()) throw;
    for (Idle& i : all) free_now(std::move(i));
    b.data = api_->alloc_device(b.capacity);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++live_;
  live_bytes_ += b.capacity;
  return b;
}

void DeviceBufferPool::release(Buffer b, std::optional<StreamHandle> reader) noexcept {
  Idle idle{b, nullptr};
  if (reader) {
    try {
      idle.released = events_->get();
      api_->record_event(*idle.released, *reader);
    } catch (const std::exception& e) {
      // The stream is gone or the device failed: nothing tells us when the
      // readers are done, so the buffer is never reused or freed.
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true, std::memory_order_relaxed))
        std::fprintf(stderr, "stoker: leaking a device buffer: cannot record its release on "
                             "the consumer stream: %s\n", e.what());
      return;
    }
  }
  try {
    std::unique_lock<std::mutex> lock(mu_);
    if (!closed_) {
      idle_.push_back(std::move(idle));
      return;
    }
  } catch (...) {
  }
  free_now(std::move(idle));
}

void DeviceBufferPool::close() noexcept {
  std::vector<Idle> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    idle.swap(idle_);
  }
  for (Idle& i : idle) free_now(std::move(i));
}

size_t DeviceBufferPool::buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

size_t DeviceBufferPool::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_bytes_;
}

}  // namespace stoker
