// Mapping a dataset's shards, and faulting their pages in, ahead of the readers.
//
// NOTE [ Warm mappings ]
// A shard's bytes may be in the page cache (written or read a moment ago) while
// this process's mapping of it has no page-table entries yet: then the first
// epoch takes a minor page fault every few pages of every record it reads,
// which later epochs do not, and which a NumPy loop over an array mapped and
// read before does not either. When a loader over a local dataset is made, one
// thread (stoker-warm) maps the shards the first epoch reads, in the order it
// reads them, and populates their page tables (MappedFile::populate), up to a
// budget of bytes, so that the workers find them mapped: the faults are taken
// ahead of time, while the process does something else (building its model,
// reading other files), instead of inside the epoch. Pages the page cache lacks
// are read from the file, as their readers would. It stops at the budget, at
// the last shard, or when the loader goes (a flag looked at every 4 MiB), and
// changes nothing a reader sees: a page it did not reach is faulted in by its
// reader as before, and a shard it cannot open is reported by the reader that
// needs it. Remote datasets (deferred shards) are not warmed.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "format/dataset.h"

namespace stoker {

class MappingWarmer {
 public:
  /// Starts the thread (not for a deferred dataset: then it does nothing).
  /// @param shards the shards to warm, in order
  /// @param budget bytes of shards to warm at most (whole shards: one that does
  ///   not fit in what is left is skipped)
  MappingWarmer(std::shared_ptr<const Dataset> ds, std::vector<size_t> shards, size_t budget);
  /// stop() (not in a forked child: the thread is the parent's).
  ~MappingWarmer();
  /// Stops the thread within a slice and joins it. Idempotent, any thread.
  void stop();
  MappingWarmer(const MappingWarmer&) = delete;
  MappingWarmer& operator=(const MappingWarmer&) = delete;

  /// Whether the thread has finished (or never started).
  bool done() const { return done_.load(std::memory_order_acquire); }
  /// Bytes whose page tables it populated so far.
  size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  /// Shards it warmed so far.
  size_t shards() const { return shards_.load(std::memory_order_relaxed); }

  /// The default budget: an eighth of the machine's memory.
  static size_t default_budget();

 private:
  void run(std::shared_ptr<const Dataset> ds, std::vector<size_t> shards, size_t budget) noexcept;

  const int pid_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::atomic<size_t> bytes_{0};
  std::atomic<size_t> shards_{0};
  std::mutex join_mu_;  // serializes stop()
  std::thread thread_;
};

}  // namespace stoker
