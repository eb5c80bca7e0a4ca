// Rounds of file checks: each epoch a loader starts begins one (LoaderCore::iter,
// a next epoch's segment, a worker process given a new epoch's samples), and so
// does a batch planned a second or more after the last round began; every shard
// mapping stats its file again before the first read of a round that would skip
// a record's hash (NOTE [ Verified once ] in format/shard_reader.h). A read
// compares two counters; the clock is read once per batch planned.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace stoker {

inline std::atomic<uint64_t> g_file_check_round{1};
inline std::atomic<int64_t> g_file_check_since{0};  // coarse ns when the round began
/// A round lasts at most this long while batches are planned.
inline constexpr int64_t kFileCheckEveryNs = 1000000000;

/// A coarse monotonic clock (the kernel's tick, a few ns to read).
inline int64_t coarse_now_ns() noexcept {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

/// The current round: one relaxed load.
inline uint64_t file_check_round() noexcept {
  return g_file_check_round.load(std::memory_order_relaxed);
}

/// Starts a new round (an epoch begins).
inline void new_file_check_round() noexcept {
  g_file_check_since.store(coarse_now_ns(), std::memory_order_relaxed);
  g_file_check_round.fetch_add(1, std::memory_order_relaxed);
}

/// A batch is planned: a new round if this one began a second ago or more.
inline void file_check_tick() noexcept {
  if (coarse_now_ns() - g_file_check_since.load(std::memory_order_relaxed) >= kFileCheckEveryNs)
    new_file_check_round();
}

}  // namespace stoker
