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
//    The copy thread waits for it to return the host slot as soon as the DMA
//    has read it (never earlier: the slot is refilled with another batch).
//  * R_k  (consumer done): recorded on U by the DLPack deleter of the last
//    tensor of batch k, on whatever thread frees it: the buffer goes back to
//    the loader's device pool with R_k as its fence (pipeline/block_pool.h), and
//    the copy that next overwrites it is queued behind R_k on C. A kernel
//    queued on U before the tensor was freed therefore never sees the next
//    batch's bytes. (Like the caching allocator, this covers readers on U; a
//    user reading on another stream must keep the tensor alive or call
//    record_stream, as with any PyTorch tensor.)
//  * Memory in flight: at most `prefetch` batches copied and not yet taken
//    (the output ring's slots); buffers the user holds are extra, and the pool
//    allocates more rather than wait (list(loader) must not deadlock).
//
// NOTE [ Pool across epochs ]
// The device pool belongs to the loader, not to a transfer: freeing a device
// buffer needs its last reader to be done, so a pool that closed at the end of
// each epoch drained the GPU's queue at every boundary. With one pool, stopping
// a transfer waits for nothing on U, and the next epoch's copies reuse the
// buffers behind their release events. The copy thread is where buffers that
// do not stay idle are freed, once their events have completed (NOTE
// [ Deferred frees ] in pipeline/block_pool.h): never a tensor's deleter.
//
// NOTE [ One copy thread per stream ]
// A transfer engine serves one stream (pipeline/stream.h), so a loader has one
// per stream it runs, not one in all. A stream already spans epochs (the next
// one flows on in it), so the usual loop starts one copy thread per loader; a
// second runs only while a second iterator runs its own stream (zip(loader,
// loader), a peek with next(iter(loader))). One thread for all streams would
// block on whichever stream it served, so a slow consumer of one iterator would
// hold back the copies of another, and its ordering would have to be
// multiplexed; per stream, each is a plain in-order pipe with its own ring.
// What must be per loader is: the device pool (above), shared by all engines.
//
// Stopping (the loader's part in NOTE [ Loader shutdown ], pipeline/
// loader_core.h): request_stop() sets the flag and closes the output ring,
// never waiting; stop() and the destructor then join the thread.
// The source is asked for batches with a deadline and the flag is checked
// between waits, so no source can keep the thread (or ~TransferEngine)
// waiting. Before the thread exits it waits for its queued copies, so no host
// slot is returned while DMA may still read it; it never waits for U. Batches
// already handed out stay valid: their buffers hold the pool, which holds the
// device API.
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
#include "cuda/event_pool.h"
#include "pipeline/batch.h"
#include "pipeline/batch_ring.h"
#include "pipeline/block_pool.h"
#include "pipeline/loader_stats.h"

namespace stoker {

/// A batch in device memory. `memory` owns the buffer; releasing its last
/// reference returns the buffer to the pool (see NOTE [ Stream ordering ]).
struct DeviceBatch {
  int64_t index = -1;
  std::shared_ptr<uint8_t> memory;
  int device = 0;
  std::vector<TensorDesc> tensors;
  BatchCounters counters;
  uint64_t ticket = 0;  ///< HostBatch::ticket
};

struct TransferStats {
  int64_t copies = 0;
  int64_t bytes = 0;
  double copy_seconds = 0;  ///< device time of the copies (event timing)
  double wait_seconds = 0;  ///< consumer time blocked in next()
};

class TransferEngine {
 public:
  using Clock = std::chrono::steady_clock;
  enum class SourceStatus { kBatch, kTimeout, kEnd, kStopped };
  /// The next host batch in order, waiting at most until the deadline. A
  /// failed batch comes as kBatch with `out.error` set.
  using Source = std::function<SourceStatus(HostBatch& out, Clock::time_point deadline)>;
  enum class Status { kBatch, kEnd, kTimeout };

  /// Starts the copy thread.
  /// @param prefetch batches copied ahead of the consumer (checked_prefetch)
  /// @param pool device buffers on `api` (device_buffer_pool()); it outlives
  ///   this engine (NOTE [ Pool across epochs ])
  /// @param stats also counts the copies there, if given
  TransferEngine(std::shared_ptr<DeviceApi> api, Source source, int prefetch,
                 std::shared_ptr<BlockPool> pool, std::shared_ptr<LoaderStats> stats = nullptr);
  /// Calls stop().
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  /// The next batch, nullopt at the end. `consumer_stream` (0 = the legacy
  /// default stream) is made to wait for the copy, without a host wait.
  /// Rethrows a batch's error (HostBatch::error) when the consumer reaches its
  /// position; the batches after it follow. An error of the device, or one the
  /// source throws, ends the transfer: it is rethrown on every later call.
  /// One consumer thread at a time.
  std::optional<DeviceBatch> next(StreamHandle consumer_stream);
  /// Like next(), but gives up at `deadline` with kTimeout, so a caller can
  /// check for signals between waits. `side_stream` (0: none) waits for the
  /// copy too (BatchReader::next); the buffer's fence stays on the consumer's.
  Status next_until(StreamHandle consumer_stream, Clock::time_point deadline,
                    std::optional<DeviceBatch>& out, StreamHandle side_stream = 0);

  /// Sets the stop flag and closes the output ring: next() ends, the copy
  /// thread ends at its next look. Never waits; idempotent; any thread.
  void request_stop();
  /// request_stop(), then joins the copy thread and gives back the buffers of
  /// batches never taken. Idempotent; any thread but the copy thread.
  void stop();

  TransferStats stats() const;
  DeviceApi& api() const { return *api_; }
  /// Batches copied (or on their way) that next() can take without waiting,
  /// counted up to `max`. Any thread; a snapshot.
  int ready(int max) const;

 private:
  struct Ready {
    int64_t index = -1;
    std::shared_ptr<BlockPool::Lease> lease;  // the device buffer (NOTE [ Block lifetime ])
    SharedEvent copied;                       // E_k
    std::vector<TensorDesc> tensors;
    BatchCounters counters;
    uint64_t ticket = 0;
    std::exception_ptr error;
    bool end = false;  // nothing follows: the end, or (with error) a device error
  };
  struct InFlight {
    std::shared_ptr<uint8_t> host;  // the slot, returned once the copy has read it
    SharedEvent start, done;
    size_t bytes = 0;
  };

  void copy_loop() noexcept;
  Ready copy_one(HostBatch hb, std::vector<InFlight>& in_flight);
  bool wait_for_room(int64_t pos, std::vector<InFlight>& in_flight);
  void reap(std::vector<InFlight>& in_flight, bool all);

  std::shared_ptr<DeviceApi> api_;
  Source source_;
  std::shared_ptr<BlockPool> pool_;
  std::shared_ptr<LoaderStats> stats_;
  std::shared_ptr<EventPool> timing_events_;
  StreamHandle copy_stream_ = 0;
  BatchRing<Ready> out_;

  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;  // serializes stop(); guards thread_ and copy_stream_ teardown
  bool stopped_ = false;
  std::thread thread_;

  std::mutex consumer_mu_;                 // one next() at a time
  int64_t read_pos_ = 0;                   // guarded by consumer_mu_
  std::atomic<int64_t> read_pos_seen_{0};  // read_pos_, for ready()
  bool finished_ = false;                  // guarded by consumer_mu_
  std::exception_ptr error_;  // guarded by consumer_mu_; a device error, sticky once reached

  std::atomic<int64_t> copies_{0}, bytes_{0}, copy_ns_{0}, wait_ns_{0};
};

}  // namespace stoker
