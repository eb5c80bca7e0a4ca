// Reusable device events. Creating an event per batch would cost a driver
// call each time; these are handed out as shared_ptrs whose deleter puts the
// event back, so an event is re-recorded only once nobody holds it.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "cuda/device_api.h"

namespace stoker {

/// An event in use; the handle goes back to its pool when the last copy drops.
using SharedEvent = std::shared_ptr<const EventHandle>;

class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  /// @param timing whether the events can be timed (elapsed_ms)
  static std::shared_ptr<EventPool> create(std::shared_ptr<DeviceApi> api, bool timing);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  /// A spare event, or a new one. Any thread.
  SharedEvent get();

 private:
  EventPool(std::shared_ptr<DeviceApi> api, bool timing);
  void put(EventHandle e) noexcept;

  std::shared_ptr<DeviceApi> api_;
  const bool timing_;
  std::mutex mu_;
  std::vector<EventHandle> spare_;  // guarded by mu_
};

}  // namespace stoker
