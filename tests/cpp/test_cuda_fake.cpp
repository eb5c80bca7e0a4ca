// The fake device itself: its streams and events must order work the way
// CUDA does, or the transfer engine's tests would prove nothing.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "cuda/fake_device_api.h"

using namespace stoker;
using namespace std::chrono_literals;

namespace {

// A copy reads its source when the stream reaches it, not when queued.
void copies_read_at_execution() {
  auto api = fake_device_api({0, 20000us});
  const StreamHandle s = api->create_stream();
  auto* dst = static_cast<uint8_t*>(api->alloc_device(64));
  CHECK_EQ(dst[0], kFakePoison);  // fresh memory is poisoned
  std::vector<uint8_t> src(64, 1);
  const EventHandle done = api->create_event(false);
  api->copy_to_device_async(dst, src.data(), 64, s);
  api->record_event(done, s);
  CHECK(!api->query_event(done));
  std::memset(src.data(), 2, 64);  // changed before the DMA ran: it sees 2
  CHECK(api->wait_event(done, 2s));
  CHECK_EQ(dst[63], 2);
  CHECK_EQ(api->counts().copies, 1);
  api->destroy_event(done);
  api->free_device(dst);
  api->destroy_stream(s);
  CHECK_EQ(api->counts().streams, 0);
  CHECK_EQ(api->counts().events, 0);
  CHECK_EQ(api->counts().device_buffers, 0);
}

// stream_wait_event orders across streams, and captures the recording made
// before the call: re-recording the event later does not change what waits.
void wait_event_orders_streams() {
  auto api = fake_device_api();
  const StreamHandle a = api->create_stream(), b = api->create_stream();
  const EventHandle e = api->create_event(false);
  std::atomic<int> step{0};
  std::atomic<bool> b_saw_a{false};
  api->launch(a, [&] {
    std::this_thread::sleep_for(30ms);
    step.store(1, std::memory_order_release);
  });
  api->record_event(e, a);
  api->stream_wait_event(b, e);
  api->launch(b, [&] { b_saw_a.store(step.load(std::memory_order_acquire) == 1); });
  // Re-record on a stream that completes at once: b must still wait for a.
  api->record_event(e, api->create_stream());
  api->synchronize_stream(b);
  CHECK(b_saw_a.load());
  // Never-recorded events count as complete, as in CUDA.
  const EventHandle fresh = api->create_event(false);
  CHECK(api->query_event(fresh));
  api->stream_wait_event(b, fresh);
  api->synchronize_stream(b);
  api->destroy_event(fresh);
  api->destroy_event(e);
}

// wait_event times out rather than blocking forever.
void wait_event_times_out() {
  auto api = fake_device_api();
  const StreamHandle s = api->create_stream();
  const EventHandle e = api->create_event(false);
  api->launch(s, [] { std::this_thread::sleep_for(100ms); });
  api->record_event(e, s);
  CHECK(!api->wait_event(e, 5ms));
  CHECK(api->wait_event(e, 5s));
  api->destroy_event(e);
}

void timing_events() {
  auto api = fake_device_api();
  const StreamHandle s = api->create_stream();
  const EventHandle a = api->create_event(true), b = api->create_event(true);
  api->record_event(a, s);
  api->launch(s, [] { std::this_thread::sleep_for(20ms); });
  api->record_event(b, s);
  api->synchronize_stream(s);
  const float ms = api->elapsed_ms(a, b);
  CHECK(ms >= 15.0f && ms < 2000.0f);
  const EventHandle untimed = api->create_event(false);
  api->record_event(untimed, s);
  api->synchronize_stream(s);
  CHECK_THROWS(CudaError, api->elapsed_ms(a, untimed));
  for (EventHandle e : {a, b, untimed}) api->destroy_event(e);
}

// Destroying a stream lets its queued work finish; the device's destructor
// ends every stream thread even if work is stuck on a wait.
void teardown() {
  std::atomic<int> ran{0};
  {
    auto api = fake_device_api();
    const StreamHandle s = api->create_stream();
    for (int i = 0; i < 10; ++i)
      api->launch(s, [&] {
        std::this_thread::sleep_for(1ms);
        ran.fetch_add(1, std::memory_order_relaxed);
      });
    api->destroy_stream(s);
    CHECK_EQ(ran.load(), 10);
    CHECK_THROWS(CudaError, api->launch(s, [] {}));
    // A stream waiting on an event whose stream is stuck behind a long op.
    const StreamHandle x = api->create_stream(), y = api->create_stream();
    const EventHandle e = api->create_event(false);
    api->launch(x, [] { std::this_thread::sleep_for(20ms); });
    api->record_event(e, x);
    api->stream_wait_event(y, e);
    api->destroy_event(e);  // allowed while pending, as in CUDA
  }
}

}  // namespace

TEST_MAIN(copies_read_at_execution(); wait_event_orders_streams(); wait_event_times_out();
          timing_events(); teardown())
