// DeviceApi over the CUDA driver, loaded at run time (cuda/detail/driver.h).
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "cuda/detail/driver.h"
#include "cuda/device_api.h"

namespace stoker {

namespace {

cu::Stream to_cu(StreamHandle s) { return reinterpret_cast<cu::Stream>(s); }
cu::Event to_cu_event(EventHandle e) { return reinterpret_cast<cu::Event>(e); }

/// Makes `ctx` current for one call and restores the caller's context after,
/// so code sharing the thread (PyTorch's runtime) sees no change. The usual
/// case, PyTorch already on the same primary context, costs one query.
class ScopedContext {
 public:
  explicit ScopedContext(cu::Context ctx) {
    const cu::Driver& d = cu::driver();
    cu::Context current = nullptr;
    CHECK_CU(d.ctx_get_current(&current));
    if (current != ctx) {
      CHECK_CU(d.ctx_push_current(ctx));
      pushed_ = true;
    }
  }
  ~ScopedContext() {
    if (pushed_) {
      cu::Context popped = nullptr;
      cu::driver().ctx_pop_current(&popped);
    }
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  bool pushed_ = false;
};

class CudaDriverApi final : public DeviceApi {
 public:
  explicit CudaDriverApi(int device) : d_(cu::driver()), ordinal_(device) {
    cu::ensure_initialized();
    int count = 0;
    CHECK_CU(d_.device_get_count(&count));
    if (count == 0) throw CudaError("no CUDA device: cuDeviceGetCount returned 0");
    STOKER_CHECK(device >= 0 && device < count, CudaError, "CUDA device ", device,
                 " does not exist (", count, " device(s) visible)");
    CHECK_CU(d_.device_get(&dev_, device));
    CHECK_CU(d_.primary_ctx_retain(&ctx_, dev_));
  }
  ~CudaDriverApi() override {
    // Errors ignored: at interpreter exit the driver may already be shut down.
    d_.primary_ctx_release(dev_);
  }

  int device() const override { return ordinal_; }
  bool device_memory_is_host() const override { return false; }

  void* alloc_device(size_t bytes) override {
    ScopedContext scope(ctx_);
    cu::DevicePtr p = 0;
    CHECK_CU(d_.mem_alloc(&p, bytes == 0 ? 1 : bytes));
    return reinterpret_cast<void*>(static_cast<uintptr_t>(p));
  }
  void free_device(void* p) noexcept override {
    if (!p) return;
    try {
      ScopedContext scope(ctx_);
      d_.mem_free(static_cast<cu::DevicePtr>(reinterpret_cast<uintptr_t>(p)));
    } catch (...) {  // driver gone at exit: the process frees it anyway
    }
  }
  void* alloc_pinned_host(size_t bytes) override {
    ScopedContext scope(ctx_);
    void* p = nullptr;
    CHECK_CU(d_.mem_host_alloc(&p, bytes == 0 ? 1 : bytes, cu::kMemHostAllocPortable));
    return p;
  }
  void free_pinned_host(void* p) noexcept override {
    if (!p) return;
    try {
      ScopedContext scope(ctx_);
      d_.mem_free_host(p);
    } catch (...) {
    }
  }

  StreamHandle create_stream() override {
    ScopedContext scope(ctx_);
    cu::Stream s = nullptr;
    CHECK_CU(d_.stream_create(&s, cu::kStreamNonBlocking));
    return reinterpret_cast<StreamHandle>(s);
  }
  void destroy_stream(StreamHandle s) noexcept override {
    if (s == 0) return;
    try {
      ScopedContext scope(ctx_);
      d_.stream_destroy(to_cu(s));
    } catch (...) {
    }
  }
  void synchronize_stream(StreamHandle s) override {
    ScopedContext scope(ctx_);
    CHECK_CU(d_.stream_synchronize(to_cu(s)));
  }
  void copy_to_device_async(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    ScopedContext scope(ctx_);
    CHECK_CU(d_.memcpy_htod_async(static_cast<cu::DevicePtr>(reinterpret_cast<uintptr_t>(dst)), src,
                                  bytes, to_cu(s)));
  }

  EventHandle create_event(bool timing) override {
    ScopedContext scope(ctx_);
    cu::Event e = nullptr;
    CHECK_CU(d_.event_create(&e, timing ? cu::kEventDefault : cu::kEventDisableTiming));
    return reinterpret_cast<EventHandle>(e);
  }
  void destroy_event(EventHandle e) noexcept override {
    try {
      ScopedContext scope(ctx_);
      d_.event_destroy(to_cu_event(e));
    } catch (...) {
    }
  }
  void record_event(EventHandle e, StreamHandle s) override {
    ScopedContext scope(ctx_);
    CHECK_CU(d_.event_record(to_cu_event(e), to_cu(s)));
  }
  bool query_event(EventHandle e) override {
    ScopedContext scope(ctx_);
    const cu::Result rc = d_.event_query(to_cu_event(e));
    if (rc == cu::kErrorNotReady) return false;
    CHECK_CU(rc);
    return true;
  }
  bool wait_event(EventHandle e, std::chrono::microseconds timeout) override {
    // Polled rather than cuEventSynchronize, which has no timeout. A copy is
    // a few milliseconds: spin briefly, then sleep in slices short enough to
    // cost little latency.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int spins = 0;; ++spins) {
      if (query_event(e)) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      if (spins < 16)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(spins < 256 ? 10 : 50));
    }
  }
  void stream_wait_event(StreamHandle s, EventHandle e) override {
    ScopedContext scope(ctx_);
    CHECK_CU(d_.stream_wait_event(to_cu(s), to_cu_event(e), 0));
  }
  float elapsed_ms(EventHandle start, EventHandle end) override {
    ScopedContext scope(ctx_);
    float ms = 0;
    CHECK_CU(d_.event_elapsed_time(&ms, to_cu_event(start), to_cu_event(end)));
    return ms;
  }

 private:
  const cu::Driver& d_;
  const int ordinal_;
  cu::Device dev_ = 0;
  cu::Context ctx_ = nullptr;
};

}  // namespace

std::shared_ptr<DeviceApi> cuda_driver_api(int device) {
  // One per device, shared while anyone holds it: the primary context is
  // retained once, and pinned slots and device buffers can outlive a loader.
  static std::mutex mu;
  static std::map<int, std::weak_ptr<DeviceApi>> apis;
  std::lock_guard<std::mutex> lock(mu);
  if (auto api = apis[device].lock()) return api;
  auto api = std::make_shared<CudaDriverApi>(device);
  apis[device] = api;
  return api;
}

}  // namespace stoker
