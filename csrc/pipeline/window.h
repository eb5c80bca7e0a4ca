// The window: how many batches a stream has in flight (planned, assembled,
// waiting for the consumer, or being copied to the device). `prefetch` sets it
// (or its largest value, when the tuner moves it), and it sizes the pools that
// keep batch memory between batches.
#pragma once

#include <cstddef>

#include "common/error.h"

namespace stoker {

/// The largest window: a ring's slots are allocated up front, and memory in
/// flight is the window times the batch size.
constexpr int kMaxPrefetch = 1024;

/// `prefetch` if it is in [1, kMaxPrefetch]; otherwise UsageError.
inline int checked_prefetch(int prefetch) {
  STOKER_CHECK(prefetch >= 1 && prefetch <= kMaxPrefetch, UsageError, "prefetch must be in [1, ",
               kMaxPrefetch, "] batches, got ", prefetch);
  return prefetch;
}

/// Blocks a pool keeps idle for a window of `window` batches: the batches in
/// flight, plus two the consumer holds (the one it works on and the one it
/// just dropped) while the next ones are assembled, so that a steady loop
/// never allocates.
inline size_t idle_blocks(int window) { return static_cast<size_t>(window) + 2; }

}  // namespace stoker
