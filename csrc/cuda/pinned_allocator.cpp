#include "cuda/pinned_allocator.h"

#include "common/error.h"

namespace stoker {

namespace {

class PinnedHostAllocator final : public HostAllocator {
 public:
  explicit PinnedHostAllocator(std::shared_ptr<DeviceApi> api) : api_(std::move(api)) {}
  void* allocate(size_t bytes) override {
    // Page-aligned by the driver, which covers the 64-byte promise.
    return api_->alloc_pinned_host(bytes == 0 ? 1 : bytes);
  }
  void deallocate(void* p, size_t) noexcept override { api_->free_pinned_host(p); }
  bool pinned() const override { return true; }

 private:
  std::shared_ptr<DeviceApi> api_;
};

}  // namespace

std::shared_ptr<HostAllocator> pinned_host_allocator(std::shared_ptr<DeviceApi> api) {
  STOKER_CHECK(api != nullptr, UsageError, "pinned_host_allocator: no device API");
  return std::make_shared<PinnedHostAllocator>(std::move(api));
}

}  // namespace stoker
