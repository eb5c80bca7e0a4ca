#include "cuda/event_pool.h"

namespace stoker {

namespace {
// Beyond this many idle events, returned ones are destroyed: the steady state
// needs a few per batch in flight.
constexpr size_t kMaxSpareEvents = 64;
}  // namespace

std::shared_ptr<EventPool> EventPool::create(std::shared_ptr<DeviceApi> api, bool timing) {
  return std::shared_ptr<EventPool>(new EventPool(std::move(api), timing));
}

EventPool::EventPool(std::shared_ptr<DeviceApi> api, bool timing)
    : api_(std::move(api)), timing_(timing) {
  spare_.reserve(kMaxSpareEvents);  // put() is noexcept: it must never allocate
}

EventPool::~EventPool() {
  for (EventHandle e : spare_) api_->destroy_event(e);
}

SharedEvent EventPool::get() {
  EventHandle e = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!spare_.empty()) {
      e = spare_.back();
      spare_.pop_back();
    }
  }
  if (e == 0) e = api_->create_event(timing_);
  // The deleter holds the pool, so an event can come back after its user is gone.
  auto self = shared_from_this();
  try {
    return SharedEvent(new EventHandle(e), [self](const EventHandle* h) {
      self->put(*h);
      delete h;
    });
  } catch (...) {
    put(e);
    throw;
  }
}

void EventPool::put(EventHandle e) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spare_.size() < kMaxSpareEvents) {
      spare_.push_back(e);
      return;
    }
  }
  api_->destroy_event(e);  // the driver releases it once its last recording completes
}

}  // namespace stoker
