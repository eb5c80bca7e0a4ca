// A batch finished outside the worker pool. A producer marks a planned batch
// `BatchWork::handoff`: when its units are done (without error) the stream
// does not publish it but hands it to the loader's BatchFinisher, and the
// slot stays claimed, counted in the window, until the finisher completes it.
// The Python stage is the one finisher (stage/python_handoff.h, NOTE
// [ Python stage ] in python/stoker/_stage/__init__.py): its threads are Python
// threads, so no C++ worker ever waits for Python or calls into it.
//
//   worker: last unit of batch p done -> finisher.hand_off(h)     (h names p)
//   finisher (any thread, later):        h.allocate(bytes)        memory from the stream's pool
//                                        h.complete(...) / fail() p is published to the reader
//                                        or h.end()               the epoch ends before p
//
// A handle holds its stream weakly: once the stream is stopped or gone,
// stopped() is true and complete()/fail() do nothing (the slot is never read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "pipeline/batch.h"

namespace stoker {

class BatchWork;

/// One handed-off batch, for the finisher.
class HandedOffBatch {
 public:
  virtual ~HandedOffBatch() = default;
  /// The planned batch (its producer's type), for hand_off() to read what it
  /// needs: valid only during hand_off(), as the stream may be freed later.
  virtual const BatchWork& work() const = 0;
  /// What the units wrote (work().tensors lie in it); null when the batch had
  /// nothing to write. Valid only during hand_off(), as work() is.
  virtual std::shared_ptr<uint8_t> memory() const = 0;
  /// The stream was stopped (or freed): nothing will read this batch.
  virtual bool stopped() const = 0;
  /// A buffer of `bytes` from the stream's block pool (pinned when the loader
  /// pins); it becomes the batch's memory at complete(). Counts for the
  /// window's memory limit as a planned batch does.
  virtual std::shared_ptr<uint8_t> allocate(size_t bytes) = 0;
  /// Publishes the batch: `tensors` lie in the memory allocate() gave, or,
  /// without allocate(), in memory() (none: an empty batch); `ticket` travels with it to the
  /// consumer; `skipped` samples were replaced (on_error="skip"); `bytes_read` source bytes
  /// (stats). Once per handle; no-op when stopped.
  virtual void complete(std::vector<TensorDesc> tensors, size_t bytes, uint64_t ticket,
                        int64_t skipped, int64_t bytes_read) = 0;
  /// The samples the batch holds, when fewer than planned (an open-ended epoch's
  /// last batch: NOTE [ Open-ended epochs ] in batch_producer.h), before complete().
  virtual void set_samples(int64_t samples) = 0;
  /// Publishes the batch as failed with `error` (rethrown at the consumer).
  virtual void fail(std::exception_ptr error) = 0;
  /// Publishes the end of an open-ended epoch at this batch: the source had no
  /// row left for it, and the reader stops here (NOTE [ Open-ended epochs ] in
  /// batch_producer.h). Once per handle, like complete(); no-op when stopped.
  virtual void end() = 0;
  /// Which stream the batch belongs to: two iterators running one epoch have two
  /// streams, and a source read in order (an IterableDataset) reads one copy of
  /// itself for each. Unique in the process.
  virtual uint64_t stream_id() const = 0;
  /// Whether every earlier batch of its stream left the workers: handed off, or
  /// published without a hand-off (NOTE [ Hand-off order ] in pipeline/stream.cpp).
  virtual bool earlier_passed() const { return true; }
};

/// Finishes handed-off batches (the loader's Python stage).
class BatchFinisher {
 public:
  virtual ~BatchFinisher() = default;
  /// Called by the worker that finished the batch's last unit. Must not block.
  virtual void hand_off(std::shared_ptr<HandedOffBatch> batch) = 0;
  /// A batch of a stream left the workers without a hand-off (published: an
  /// error, or a batch with nothing to finish): a later one held back for it
  /// may be served now (NOTE [ Hand-off order ]). Must not block.
  virtual void passed() {}
};

}  // namespace stoker
