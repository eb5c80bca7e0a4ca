#include "cuda/pinned_allocator.h"

#include <chrono>

#include "common/error.h"

namespace stoker {

namespace {

class PinnedHostAllocator final : public BlockAllocator {
 public:
  explicit PinnedHostAllocator(std::shared_ptr<DeviceApi> api) : api_(std::move(api)) {}
  void* allocate(size_t bytes) override {
    return api_->alloc_pinned_host(bytes == 0 ? 1 : bytes);  // page-aligned by the driver
  }
  void deallocate(void* p, size_t) noexcept override { api_->free_pinned_host(p); }
  MemoryKind kind() const override { return MemoryKind::kPinned; }

 private:
  std::shared_ptr<DeviceApi> api_;
};

class DeviceAllocator final : public BlockAllocator {
 public:
  explicit DeviceAllocator(std::shared_ptr<DeviceApi> api) : api_(std::move(api)) {}
  void* allocate(size_t bytes) override { return api_->alloc_device(bytes == 0 ? 1 : bytes); }
  void deallocate(void* p, size_t) noexcept override { api_->free_device(p); }
  MemoryKind kind() const override { return MemoryKind::kDevice; }

 private:
  std::shared_ptr<DeviceApi> api_;
};

class EventFence final : public BlockFence {
 public:
  EventFence(std::shared_ptr<DeviceApi> api, std::shared_ptr<EventPool> events)
      : api_(std::move(api)), events_(std::move(events)) {}
  Token record(uintptr_t reader) override {
    SharedEvent e = events_->get();
    api_->record_event(*e, reader);
    return e;
  }
  void order_after(const Token& t, uintptr_t stream) override {
    api_->stream_wait_event(stream, *static_cast<const EventHandle*>(t.get()));
  }
  bool done(const Token& t) override {
    return api_->query_event(*static_cast<const EventHandle*>(t.get()));
  }
  void wait(const Token& t) override {
    // No deadline: a recorded event completes unless the device fails (then
    // wait_event throws). Slices make a stuck device visible in a debugger.
    const EventHandle e = *static_cast<const EventHandle*>(t.get());
    while (!api_->wait_event(e, std::chrono::milliseconds(100))) {
    }
  }

 private:
  std::shared_ptr<DeviceApi> api_;
  std::shared_ptr<EventPool> events_;
};

}  // namespace

std::shared_ptr<BlockAllocator> pinned_host_allocator(std::shared_ptr<DeviceApi> api) {
  STOKER_CHECK(api != nullptr, UsageError, "pinned_host_allocator: no device API");
  return std::make_shared<PinnedHostAllocator>(std::move(api));
}

std::shared_ptr<BlockAllocator> device_allocator(std::shared_ptr<DeviceApi> api) {
  STOKER_CHECK(api != nullptr, UsageError, "device_allocator: no device API");
  return std::make_shared<DeviceAllocator>(std::move(api));
}

std::shared_ptr<BlockFence> event_fence(std::shared_ptr<DeviceApi> api,
                                        std::shared_ptr<EventPool> events) {
  return std::make_shared<EventFence>(std::move(api), std::move(events));
}

std::shared_ptr<BlockPool> device_buffer_pool(std::shared_ptr<DeviceApi> api, size_t max_idle) {
  STOKER_CHECK(api != nullptr, UsageError, "device_buffer_pool: no device API");
  auto events = EventPool::create(api, false);
  return BlockPool::create(device_allocator(api), event_fence(api, std::move(events)), max_idle);
}

}  // namespace stoker
