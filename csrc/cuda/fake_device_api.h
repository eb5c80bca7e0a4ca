// A host-only DeviceApi with the ordering semantics of CUDA streams and
// events, so that the transfer engine's synchronization can be tested in every
// CI, without a GPU.
//
// Each stream is a thread that runs its queued operations in order. A copy
// reads the source and writes the destination when the stream reaches it
// (after an optional delay), not when it is queued, just as a DMA engine does;
// so code that frees or reuses a buffer before the right event has completed
// sees wrong data, which tests can check. Fresh "device" memory is filled with
// kFakePoison for the same reason. Events are completion markers: recording
// one on a stream queues a marker, stream_wait_event makes a stream wait for
// the recording captured at the time of the call. Handle 0 is a built-in
// default stream (it does not synchronize with the others, unlike CUDA's
// legacy stream, which the engine never relies on).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "cuda/device_api.h"

namespace stoker {

/// The byte fresh fake device memory is filled with.
constexpr uint8_t kFakePoison = 0xCD;

struct FakeDeviceOptions {
  int device = 0;
  /// Each copy starts this long after its stream reaches it.
  std::chrono::microseconds copy_delay{0};
};

class FakeDeviceApi final : public DeviceApi {
 public:
  explicit FakeDeviceApi(FakeDeviceOptions options);
  ~FakeDeviceApi() override;
  FakeDeviceApi(const FakeDeviceApi&) = delete;
  FakeDeviceApi& operator=(const FakeDeviceApi&) = delete;

  int device() const override { return options_.device; }
  bool device_memory_is_host() const override { return true; }
  void* alloc_device(size_t bytes) override;
  void free_device(void* p) noexcept override;
  void* alloc_pinned_host(size_t bytes) override;
  void free_pinned_host(void* p) noexcept override;
  StreamHandle create_stream() override;
  void destroy_stream(StreamHandle s) noexcept override;
  void synchronize_stream(StreamHandle s) override;
  void copy_to_device_async(void* dst, const void* src, size_t bytes, StreamHandle s) override;
  EventHandle create_event(bool timing) override;
  void destroy_event(EventHandle e) noexcept override;
  void record_event(EventHandle e, StreamHandle s) override;
  bool query_event(EventHandle e) override;
  bool wait_event(EventHandle e, std::chrono::microseconds timeout) override;
  void stream_wait_event(StreamHandle s, EventHandle e) override;
  float elapsed_ms(EventHandle start, EventHandle end) override;

  /// Test hook, like a kernel launch: runs `fn` on `s`'s thread in stream
  /// order. `fn` must not call this API (a kernel cannot call the driver).
  void launch(StreamHandle s, std::function<void()> fn);

  /// Resources alive now, for leak checks (the default stream not counted).
  struct Counts {
    int64_t device_buffers = 0, pinned_buffers = 0, streams = 0, events = 0;
    int64_t copies = 0;  ///< copies executed since creation
  };
  Counts counts() const;

 private:
  struct Stream;
  struct Event;
  Event& event(EventHandle e);  // requires mu_
  void enqueue(StreamHandle s, std::function<void()> op);

  FakeDeviceOptions options_;
  struct State;
  std::unique_ptr<State> state_;
};

/// A fresh fake device.
std::shared_ptr<FakeDeviceApi> fake_device_api(FakeDeviceOptions options = {});

}  // namespace stoker
