// Rounds of file checks: each epoch a loader starts begins one (LoaderCore::iter,
// and a worker process given a new epoch's samples), and every shard mapping stats
// its file again before the first read of the round that would skip a record's
// hash (NOTE [ Verified once ] in format/shard_reader.h).
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace stoker {

inline std::atomic<uint64_t> g_file_check_round{1};

/// The current round: one relaxed load.
inline uint64_t file_check_round() noexcept {
  return g_file_check_round.load(std::memory_order_relaxed);
}

/// Starts a new round (an epoch begins).
inline void new_file_check_round() noexcept {
  g_file_check_round.fetch_add(1, std::memory_order_relaxed);
}

/// A coarse monotonic clock (the kernel's tick, a few ns to read): for checks
/// due every second or so.
inline int64_t coarse_now_ns() noexcept {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace stoker
