// The narrow device interface the transfer engine is written against, with two
// implementations: the CUDA driver (loaded at run time) and a host fake whose
// streams are threads, used by the tests that run in every CI without a GPU.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace stoker {

/// An opaque stream handle: a CUstream as an integer (0 = the legacy default
/// stream), which is also what torch.cuda.Stream.cuda_stream holds.
using StreamHandle = uintptr_t;
/// An opaque event handle (a CUevent for the driver).
using EventHandle = uintptr_t;

/// What moving batches to a device needs, and nothing more. Every method may be
/// called from any thread; each implementation makes its context current for
/// the call. Methods that release resources are noexcept: they run in
/// destructors and DLPack deleters.
class DeviceApi {
 public:
  virtual ~DeviceApi() = default;

  /// The device ordinal this API drives.
  virtual int device() const = 0;
  /// True when "device" memory is ordinary host memory (the fake): tensors are
  /// then exported as CPU tensors.
  virtual bool device_memory_is_host() const = 0;

  /// @return device memory of at least `bytes` bytes (>= 256-byte aligned); throws on failure.
  virtual void* alloc_device(size_t bytes) = 0;
  virtual void free_device(void* p) noexcept = 0;
  /// @return page-locked host memory usable by every context; throws on failure.
  virtual void* alloc_pinned_host(size_t bytes) = 0;
  virtual void free_pinned_host(void* p) noexcept = 0;

  /// A stream that does not synchronize with the legacy default stream.
  virtual StreamHandle create_stream() = 0;
  /// Work already queued still completes.
  virtual void destroy_stream(StreamHandle s) noexcept = 0;
  /// Blocks until all work queued on `s` has completed.
  virtual void synchronize_stream(StreamHandle s) = 0;
  /// Queues a copy of `bytes` from host `src` to device `dst` on `s`. `src`
  /// must stay valid and unchanged until the copy completes.
  virtual void copy_to_device_async(void* dst, const void* src, size_t bytes, StreamHandle s) = 0;

  /// @param timing whether elapsed_ms() may be asked of it
  virtual EventHandle create_event(bool timing) = 0;
  virtual void destroy_event(EventHandle e) noexcept = 0;
  /// Captures the work queued on `s` so far; the event completes after it.
  virtual void record_event(EventHandle e, StreamHandle s) = 0;
  /// @return true when the last recording of `e` has completed (or it was never recorded).
  virtual bool query_event(EventHandle e) = 0;
  /// Waits up to `timeout` for `e`. @return true when it completed.
  virtual bool wait_event(EventHandle e, std::chrono::microseconds timeout) = 0;
  /// Work queued on `s` after this call waits for the recording of `e` that
  /// was last made before this call (later re-recordings do not affect it),
  /// without blocking the host.
  virtual void stream_wait_event(StreamHandle s, EventHandle e) = 0;
  /// Milliseconds between two completed timing events.
  virtual float elapsed_ms(EventHandle start, EventHandle end) = 0;
};

/// The CUDA driver on `device`, through its primary context (shared with the
/// CUDA runtime, hence with PyTorch). One instance per device is shared.
/// Throws CudaError when the driver library is missing, there is no device,
/// or `device` is out of range.
std::shared_ptr<DeviceApi> cuda_driver_api(int device);

}  // namespace stoker
