// Delivery of host batches to the device: a copy thread moves each batch into
// a device buffer on its own stream while the consumer computes on the
// previous one.
//
// NOTE [ Stream ordering ]
// Three parties touch a device buffer: the copy stream C (ours, non-blocking),
// the consumer stream U (the one current at next(), captured then), and the
// host. No host thread ever waits for U; the order is carried by events:
//
//   host (copy thread)   source() -> k    acquire buf      copy_async    record E_k
//   C:                             [wait R_prev(buf)] [ H2D k -> buf ] (E_k)
//   U (at next()):                                       wait E_k -> [kernels on k]
//   U (last tensor freed):                                          ... record R_k
//   C (buf reused for k+n):                             [wait R_k] [ H2D k+n -> buf ]
//
//  * E_k  (copy done): U waits on it in next(), so kernels see the whole batch.
//    The copy thread polls it to return the host slot as soon as the DMA has
//    read it (never earlier: the slot is refilled with another batch).
//  * R_k  (consumer done): recorded on U by the DLPack deleter of the last
//    tensor of batch k, on whatever thread frees it. The buffer goes back to
//    the pool with R_k; the copy that next overwrites it is queued behind R_k
//    on C. A kernel queued on U before the tensor was freed therefore never
//    sees the next batch's bytes. (Like the caching allocator, this covers
//    readers on U; a user reading on another stream must keep the tensor
//    alive or call record_stream, as with any PyTorch tensor.)
//  * Memory in flight: at most `prefetch` batches copied and not yet taken;
//    buffers the user holds are extra, and the pool allocates more rather
//    than wait (list(loader) must not deadlock).
//
// NOTE [ Transfer shutdown ]
// stop() sets stop_ and joins the copy thread; every wait in it has a timeout
// and checks stop_. The owner stops the source first so a blocked source()
// returns (it throws once stopped, which is not reported). Before the thread
// exits it waits for its queued copies, so no host slot is returned while DMA
// may still read it and no device buffer is freed while C writes it. Batches
// already handed out stay valid: their buffers hold the pool, which holds the
// device API.
//
// NOTE [ Pool across epochs ]
// A pool of its own is closed when the engine stops: idle buffers are freed
// then, and each buffer the user frees later is freed on return. Both must
// first wait (on the host) for the buffer's last reader on U, so at the end of
// an epoch the caller's thread waits until the GPU has drained its queue, and
// the next epoch starts with an idle GPU and no buffers. A Loader therefore
// passes one pool for all its epochs: stopping an engine then waits for
// nothing on U, the GPU keeps working through the steps already queued while
// the next epoch's first batch is made, and that batch's copy reuses a buffer
// behind its release event as within an epoch.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cuda/device_api.h"
#include "cuda/device_buffer_pool.h"
#include "cuda/event_pool.h"
#include "pipeline/batch.h"
#include "pipeline/spsc_queue.h"

namespace stoker {

/// A batch in device memory. `memory` owns the buffer; releasing its last
/// reference returns the buffer to the pool (see NOTE [ Stream ordering ]).
struct DeviceBatch {
  int64_t index = -1;
  std::shared_ptr<uint8_t> memory;
  int device = 0;
  std::vector<TensorDesc> tensors;
};

struct TransferStats {
  int64_t copies = 0;
  int64_t bytes = 0;
  double copy_seconds = 0;  ///< device time of the copies (event timing)
  double wait_seconds = 0;  ///< consumer time blocked in next()
  size_t pool_buffers = 0;  ///< device buffers alive (idle + in use)
  size_t pool_bytes = 0;
};

class TransferEngine {
 public:
  /// Blocking; returns nullopt at the end of the epoch; throws the error of
  /// the batch at that position.
  using Source = std::function<std::optional<HostBatch>()>;
  enum class Status { kBatch, kEnd, kTimeout };

  /// Starts the copy thread.
  /// @param prefetch batches copied ahead of the consumer (>= 1)
  /// @param pool device buffers to copy into, on `api`. A pool given here
  ///   outlives this engine and is not closed by stop(): the next epoch
  ///   reuses its buffers, and freeing a batch never waits for the device
  ///   (NOTE [ Pool across epochs ]). Null: a pool of the engine's own, closed
  ///   by stop() so its memory returns as soon as the user's batches do.
  TransferEngine(std::shared_ptr<DeviceApi> api, Source source, size_t prefetch,
                 std::shared_ptr<DeviceBufferPool> pool = nullptr);
  /// Calls stop().
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  /// The next batch, nullopt at the end. `consumer_stream` (0 = the legacy
  /// default stream) is made to wait for the copy, without a host wait.
  /// Rethrows a source error when the consumer reaches that position (and on
  /// every later call). One consumer thread at a time.
  std::optional<DeviceBatch> next(StreamHandle consumer_stream);
  /// Like next(), but gives up after `timeout` with kTimeout, so a caller can
  /// check for signals between waits.
  Status next_for(StreamHandle consumer_stream, std::chrono::milliseconds timeout,
                  std::optional<DeviceBatch>& out);

  /// NOTE [ Transfer shutdown ]. Prompt, idempotent, any thread.
  void stop();

  TransferStats stats() const;
  DeviceApi& api() const { return *api_; }

 private:
  /// A device buffer on loan; destroying it gives the buffer back, with an
  /// event on `reader` once a consumer has had it.
  struct Lease {
    std::shared_ptr<DeviceBufferPool> pool;
    DeviceBufferPool::Buffer buffer;
    std::optional<StreamHandle> reader;
    ~Lease() { pool->release(buffer, reader); }
  };
  struct Ready {
    int64_t index = -1;
    std::unique_ptr<Lease> lease;

    SharedEvent copied;                   // E_k
    std::vector<TensorDesc> tensors;
    std::exception_ptr error;
    bool end = false;
  };
  struct InFlight {
    std::shared_ptr<uint8_t> host;  // the slot, returned once the copy has read it
    SharedEvent start, done;
    size_t bytes = 0;
  };

  void copy_loop() noexcept;
  void copy_one(HostBatch hb, std::vector<InFlight>& in_flight);
  bool wait_for_room(std::vector<InFlight>& in_flight);
  void reap(std::vector<InFlight>& in_flight, bool all);
  void push(Ready r);

  std::shared_ptr<DeviceApi> api_;
  Source source_;
  const size_t prefetch_;
  std::shared_ptr<DeviceBufferPool> pool_;
  bool owns_pool_;
  std::shared_ptr<EventPool> timing_events_;
  StreamHandle copy_stream_ = 0;
  SpscQueue<Ready> queue_;

  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;  // serializes stop(); guards thread_ and copy_stream_ teardown
  bool stopped_ = false;
  std::thread thread_;

  std::mutex consumer_mu_;  // one next() at a time (SPSC consumer side)
  bool finished_ = false;   // guarded by consumer_mu_
  std::exception_ptr error_;  // guarded by consumer_mu_; sticky once reached

  std::atomic<int64_t> copies_{0}, bytes_{0}, copy_ns_{0}, wait_ns_{0};
};

}  // namespace stoker
