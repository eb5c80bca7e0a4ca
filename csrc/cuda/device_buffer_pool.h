// Device buffers that batches are copied into, reused across batches.
//
// A buffer handed to the user comes back (from a DLPack deleter, on any
// thread) with an event recorded on the stream the user read it on; the next
// copy into it is queued behind that event. See NOTE [ Stream ordering ] in
// transfer_engine.h.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda/device_api.h"
#include "cuda/event_pool.h"

namespace stoker {

class DeviceBufferPool : public std::enable_shared_from_this<DeviceBufferPool> {
 public:
  struct Buffer {
    void* data = nullptr;
    size_t capacity = 0;
  };

  /// @param max_free idle buffers kept for reuse; more are freed
  static std::shared_ptr<DeviceBufferPool> create(std::shared_ptr<DeviceApi> api, size_t max_free);
  /// Waits for the last readers of idle buffers, then frees them.
  ~DeviceBufferPool();
  DeviceBufferPool(const DeviceBufferPool&) = delete;
  DeviceBufferPool& operator=(const DeviceBufferPool&) = delete;

  /// A buffer of at least `bytes`. Work queued on `stream` after this call runs
  /// after every reader of the buffer's previous contents (no host wait).
  /// Allocates when no idle buffer fits (the user holds the others).
  Buffer acquire(size_t bytes, StreamHandle stream);

  /// Gives `b` back. `reader` is the stream that last read it (an event is
  /// recorded on it now); nullopt when only the acquiring stream touched it.
  /// Any thread, also after the engine is gone.
  void release(Buffer b, std::optional<StreamHandle> reader) noexcept;

  /// Frees the idle buffers now, and from now on each buffer as it comes
  /// back (after its readers are done: a host wait in release()). Called when
  /// the engine stops, so memory returns while the user still holds a batch.
  void close() noexcept;

  size_t buffers() const;  ///< buffers alive (idle + in use)
  size_t bytes() const;    ///< their total capacity
  DeviceApi& api() const { return *api_; }

 private:
  struct Idle {
    Buffer buffer;
    SharedEvent released;  // null when no other stream read it
  };
  DeviceBufferPool(std::shared_ptr<DeviceApi> api, size_t max_free);
  void free_now(Idle idle) noexcept;

  std::shared_ptr<DeviceApi> api_;
  std::shared_ptr<EventPool> events_;
  const size_t max_free_;
  mutable std::mutex mu_;
  std::vector<Idle> idle_;  // guarded by mu_
  bool closed_ = false;     // guarded by mu_
  size_t live_ = 0;         // guarded by mu_
  size_t live_bytes_ = 0;   // guarded by mu_
};

}  // namespace stoker
