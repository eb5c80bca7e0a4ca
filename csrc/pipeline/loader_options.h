// What a loader is asked to do, beyond what goes into its batches (the
// producer's business): threads, the window, memory, and where batches go.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "pipeline/batch_handoff.h"
#include "pipeline/block_pool.h"
#include "pipeline/delivery.h"

namespace stoker {

struct LoaderOptions {
  int num_threads = 1;  ///< with auto_threads: the most (the cores this rank may use)
  int prefetch = 4;     ///< batches in flight per stream (assembled, being assembled, or copied);
                        ///< with auto_prefetch: the ring's capacity, the largest window
  /// NOTE [ Autotuning ] in autotuner.h: explicit settings are never moved.
  bool auto_threads = false;
  bool auto_prefetch = false;
  size_t max_memory = 0;     ///< automatic prefetch: bytes of batches in flight per stream (0: any)
  double stall_warning = 0;  ///< warn once when the loop waits longer than this share (0: never)
  /// A first batch slower than this is reported (NOTE [ Slow first batch ] in loader_core.h).
  std::chrono::milliseconds slow_first_batch{2000};
  bool prefetch_next_epoch = true;
  std::shared_ptr<BlockAllocator> host_allocator;  ///< null: pageable memory
  std::shared_ptr<Delivery> delivery;              ///< null: host memory
  /// Finishes batches planned with BatchWork::handoff (the Python stage).
  std::shared_ptr<BatchFinisher> finisher;
  std::chrono::milliseconds linger{100};  ///< idle workers end after this
};

}  // namespace stoker
