// How a stream's batches reach the consumer: straight from the stream (host
// memory), or through a copy to a device (cuda/transfer_engine.h), which plugs
// in here so that the pipeline does not depend on the device layer.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "pipeline/batch.h"
#include "pipeline/loader_stats.h"
#include "pipeline/stream.h"

namespace stoker {

/// A batch as the consumer gets it.
struct DeliveredBatch {
  int64_t index = -1;               ///< batch number within its epoch
  std::shared_ptr<uint8_t> memory;  ///< owns the buffer
  std::vector<TensorDesc> tensors;
  BatchCounters counters;
  int device = -1;           ///< -1: host memory; else the device ordinal
  std::exception_ptr error;  ///< the batch's error instead of the rest
  uint64_t ticket = 0;       ///< HostBatch::ticket
};

/// Reads one stream's batches in order, for one consumer thread at a time.
class BatchReader {
 public:
  using Clock = std::chrono::steady_clock;
  /// kEnd: the source ended its epoch here (NOTE [ Open-ended epochs ] in batch_producer.h).
  enum class Status { kBatch, kTimeout, kStopped, kEnd };
  virtual ~BatchReader() = default;
  /// The next batch, waiting up to `deadline`. `consumer_stream` (a device
  /// stream handle; 0 = the default stream) is the stream the consumer reads
  /// the batch on: device delivery orders it after the copy. `side_stream`
  /// (0: none) is ordered after the copy too, for work on the batch that
  /// the consumer stream then waits for (batch_map: docs/python.md); the
  /// buffer's reuse stays fenced on the consumer stream.
  virtual Status next(DeliveredBatch& out, Clock::time_point deadline, uintptr_t consumer_stream,
                      uintptr_t side_stream) = 0;
  /// Stops the stream and whatever reads it; next() returns kStopped. Never
  /// waits, idempotent, any thread: a thread the reader runs is joined by
  /// join() or the destructor (NOTE [ Loader shutdown ] in loader_core.h).
  virtual void stop() = 0;
  /// After stop(): waits for the threads it ended (a copy thread finishing the
  /// copies it queued). Called without any lock those threads could need.
  virtual void join() {}
  /// Batches the consumer could take now without waiting, counted up to
  /// `max` (the queue depth in stats). The consumer's thread.
  virtual int ready(int max) const {
    (void)max;
    return 0;
  }
};

/// Makes the reader of each stream.
class Delivery {
 public:
  virtual ~Delivery() = default;
  virtual std::unique_ptr<BatchReader> open(std::shared_ptr<Stream> stream,
                                            std::shared_ptr<LoaderStats> stats) = 0;
  /// Device buffers alive and their bytes (0 for host delivery).
  virtual size_t buffers() const { return 0; }
  virtual size_t buffer_bytes() const { return 0; }
};

/// Host delivery: the consumer reads the stream itself.
class HostReader final : public BatchReader {
 public:
  explicit HostReader(std::shared_ptr<Stream> stream) : stream_(std::move(stream)) {}
  ~HostReader() override { stop(); }
  Status next(DeliveredBatch& out, Clock::time_point deadline, uintptr_t, uintptr_t) override {
    HostBatch b;
    switch (stream_->read(b, deadline)) {
      case Stream::Read::kTimeout:
        return Status::kTimeout;
      case Stream::Read::kStopped:
        return Status::kStopped;
      case Stream::Read::kEnd:
        return Status::kEnd;
      case Stream::Read::kBatch:
        break;
    }
    out = DeliveredBatch{
        b.index, std::move(b.memory), std::move(b.tensors), b.counters, -1, b.error, b.ticket};
    return Status::kBatch;
  }
  void stop() override { stream_->stop(); }
  int ready(int max) const override { return stream_->ready_run(max); }

 private:
  std::shared_ptr<Stream> stream_;
};

}  // namespace stoker
