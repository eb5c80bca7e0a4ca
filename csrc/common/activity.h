// What a loader thread is doing right now, published so that the consumer can
// say why a first batch is slow ("2 workers decoding images") instead of
// staying silent. Each worker owns one slot (WorkerPool) and binds it to its
// thread; code at any layer marks its stage with set_activity(), which is a
// thread-local load and a relaxed store, and does nothing on a thread that
// has no slot (a decode called from Python, a C++ test).
#pragma once

#include <atomic>
#include <cstdint>

namespace stoker {

enum class Activity : uint8_t {
  kIdle,      ///< waiting for work
  kPlanning,  ///< planning an epoch or a batch (orders, layouts, image headers)
  kOpening,   ///< mapping a shard and validating its record table
  kFetching,  ///< waiting for a shard of a remote dataset to download
  kReading,   ///< reading records and verifying their checksums
  kDecoding,  ///< decoding payloads (images, arrays, tokens)
  kOps,       ///< image ops after decoding (resize, flip, normalize, layout)
  kCount
};

/// A short description ("decoding", "running image ops").
inline const char* activity_name(Activity a) {
  switch (a) {
    case Activity::kIdle:
      return "idle";
    case Activity::kPlanning:
      return "planning batches";
    case Activity::kOpening:
      return "opening shards";
    case Activity::kFetching:
      return "waiting for shards to download";
    case Activity::kReading:
      return "reading records";
    case Activity::kDecoding:
      return "decoding";
    case Activity::kOps:
      return "running image ops";
    case Activity::kCount:
      break;
  }
  return "?";
}

namespace detail {
// Constant-initialized, so access needs no TLS init wrapper.
inline thread_local std::atomic<uint8_t>* t_activity = nullptr;
}  // namespace detail

/// Publishes this thread's activity in `slot` from now on (null: nowhere).
inline void bind_activity(std::atomic<uint8_t>* slot) noexcept { detail::t_activity = slot; }

inline void set_activity(Activity a) noexcept {
  if (std::atomic<uint8_t>* s = detail::t_activity)
    s->store(static_cast<uint8_t>(a), std::memory_order_relaxed);
}

/// Marks a nested stage (opening a shard in the middle of a read) and puts
/// the previous activity back at the end of the scope.
class ScopedActivity {
 public:
  explicit ScopedActivity(Activity a) noexcept : slot_(detail::t_activity) {
    if (slot_) prev_ = slot_->exchange(static_cast<uint8_t>(a), std::memory_order_relaxed);
  }
  ~ScopedActivity() {
    if (slot_) slot_->store(prev_, std::memory_order_relaxed);
  }
  ScopedActivity(const ScopedActivity&) = delete;
  ScopedActivity& operator=(const ScopedActivity&) = delete;

 private:
  std::atomic<uint8_t>* slot_;
  uint8_t prev_ = 0;
};

}  // namespace stoker
