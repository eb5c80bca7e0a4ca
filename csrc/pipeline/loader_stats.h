// Counters of one loader, shared by its workers, streams and iterators.
// Monotonic; read without stopping anything.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "pipeline/batch_producer.h"

namespace stoker {

struct LoaderStats {
  // Delivered to the consumer (a batch assembled but never handed out does not count).
  std::atomic<int64_t> batches{0};
  std::atomic<int64_t> samples{0};     ///< padding included
  std::atomic<int64_t> bytes_read{0};  ///< source bytes of delivered batches
  std::atomic<int64_t> skipped{0};     ///< samples replaced (on_error="skip")
  // Work done, delivered or not.
  std::atomic<int64_t> read_ns{0};
  std::atomic<int64_t> decode_ns{0};
  std::atomic<int64_t> ops_ns{0};
  std::atomic<int64_t> plan_ns{0};         ///< planning batches and taking their memory
  std::atomic<int64_t> python_ns{0};       ///< the Python stage: wall time in user code
  std::atomic<int64_t> python_cpu_ns{0};   ///< ... and its threads' CPU time meanwhile
  std::atomic<int64_t> python_wait_ns{0};  ///< ... and their time waiting for a CPU
  std::atomic<int64_t> worker_busy_ns{0};  ///< workers running units or planning
  std::atomic<int64_t> worker_idle_ns{0};  ///< workers parked while a stream was open
  // The consumer.
  std::atomic<int64_t> wait_ns{0};          ///< time the iterating thread waited in next()
  std::atomic<int64_t> handoff_ns{0};       ///< the rest of its next(): the batch's Python objects
  std::atomic<int64_t> run_ns{0};           ///< time iterators were open (closed ones)
  std::atomic<int64_t> first_batch_ns{-1};  ///< the last epoch's first batch, from its iter()
  std::atomic<int64_t> warmup_ns{-1};       ///< the loader's first batch, from its first next()
  std::atomic<int64_t> streams{0};  ///< streams started (an epoch that flowed on starts none)
  // The copy to the device.
  std::atomic<int64_t> copies{0};
  std::atomic<int64_t> copy_bytes{0};
  std::atomic<int64_t> copy_ns{0};  ///< device time of the copies
  // Queue depth: batches ready when the main iterator asked for one (the
  // last bucket counts that many or more).
  static constexpr int kDepthBuckets = 9;
  std::atomic<int64_t> depth_hist[kDepthBuckets] = {};
  std::atomic<int64_t> depth_sum{0};
  std::atomic<int64_t> max_batch_bytes{0};  ///< the largest batch planned

  void add_depth(int depth) {
    const int b = depth < kDepthBuckets - 1 ? depth : kDepthBuckets - 1;
    depth_hist[b].fetch_add(1, std::memory_order_relaxed);
    depth_sum.fetch_add(depth, std::memory_order_relaxed);
  }
  void note_batch_bytes(int64_t bytes) {
    int64_t seen = max_batch_bytes.load(std::memory_order_relaxed);
    while (bytes > seen &&
           !max_batch_bytes.compare_exchange_weak(seen, bytes, std::memory_order_relaxed)) {
    }
  }

  // A mixture's rows and tokens per source (BatchWork::source_counts), delivered.
  void add_sources(const std::vector<int64_t>& counts) {
    std::lock_guard<std::mutex> lock(sources_mu_);
    if (sources_.size() < counts.size()) sources_.resize(counts.size(), 0);
    for (size_t i = 0; i < counts.size(); ++i) sources_[i] += counts[i];
  }
  std::vector<int64_t> sources() const {
    std::lock_guard<std::mutex> lock(sources_mu_);
    return sources_;
  }

  void add(const StageTimes& t) {
    read_ns.fetch_add(t.read_ns, std::memory_order_relaxed);
    decode_ns.fetch_add(t.decode_ns, std::memory_order_relaxed);
    ops_ns.fetch_add(t.ops_ns, std::memory_order_relaxed);
  }

 private:
  mutable std::mutex sources_mu_;
  std::vector<int64_t> sources_;  // guarded by sources_mu_
};

}  // namespace stoker
