#include "cuda/fake_device_api.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/error.h"

namespace stoker {

namespace {

// condition_variable::wait(lock) is a GLIBCXX_3.4.30 symbol in libstdc++ 12, which would
// raise the wheel's floor from manylinux_2_34 to 2_35 (README, "Install"); wait_for is
// inline over pthread_cond_clockwait. The slice length does not matter: notify wakes it.
template <typename Pred>
void wait_sliced(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Pred pred) {
  while (!cv.wait_for(lock, std::chrono::seconds(1), pred)) {
  }
}

}  // namespace

struct FakeDeviceApi::Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;  // guarded by mu
  bool closing = false;                   // guarded by mu
  std::thread thread;

  void run() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> lock(mu);
        wait_sliced(cv, lock, [&] { return closing || !ops.empty(); });
        if (ops.empty()) return;  // closing, and queued work has drained
        op = std::move(ops.front());
        ops.pop_front();
      }
      op();
    }
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu);
      closing = true;
    }
    cv.notify_one();
    thread.join();
  }
};

struct FakeDeviceApi::Event {
  bool timing = false;
  uint64_t recorded = 0;                            // generation of the last recording
  std::set<uint64_t> pending;                       // recordings not yet reached by their stream
  std::chrono::steady_clock::time_point done_at{};  // when the last recording completed
};

struct FakeDeviceApi::State {
  mutable std::mutex mu;             // everything below
  std::condition_variable event_cv;  // an event recording completed
  std::unordered_map<StreamHandle, std::unique_ptr<Stream>> streams;  // 0: default stream
  std::unordered_map<EventHandle, std::shared_ptr<Event>> events;
  std::unordered_map<void*, size_t> device, pinned;
  int64_t copies = 0;
  bool shutting_down = false;  // lets stream threads stuck in a wait leave
};

namespace {

constexpr size_t kDeviceAlignment = 256;

void* checked_alloc(size_t alignment, size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  if (!p) STOKER_THROW(CudaError, "fake device: out of memory allocating ", bytes, " bytes");
  std::memset(p, kFakePoison, rounded);
  return p;
}

[[noreturn]] void fatal(const char* what) {
  // A bug in the code under test (double free, unknown handle in a noexcept
  // path): fail loudly rather than corrupt the heap.
  std::fprintf(stderr, "fake device: %s\n", what);
  std::abort();
}

}  // namespace

FakeDeviceApi::FakeDeviceApi(FakeDeviceOptions options)
    : options_(options), state_(std::make_unique<State>()) {
  auto s = std::make_unique<Stream>();
  Stream* raw = s.get();
  raw->thread = std::thread([raw] {
    pthread_setname_np(pthread_self(), "stoker-fake-s0");
    raw->run();
  });
  state_->streams.emplace(StreamHandle{0}, std::move(s));
}

FakeDeviceApi::~FakeDeviceApi() {
  std::unordered_map<StreamHandle, std::unique_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->shutting_down = true;
    streams.swap(state_->streams);
  }
  state_->event_cv.notify_all();
  for (auto& [h, s] : streams) s->close();
  for (auto& [p, n] : state_->device) std::free(p);
  for (auto& [p, n] : state_->pinned) std::free(p);
}

void* FakeDeviceApi::alloc_device(size_t bytes) {
  void* p = checked_alloc(kDeviceAlignment, bytes);
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->device.emplace(p, bytes);
  return p;
}

void FakeDeviceApi::free_device(void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->device.erase(p) != 1) fatal("free_device of a pointer it did not allocate");
  }
  std::free(p);
}

void* FakeDeviceApi::alloc_pinned_host(size_t bytes) {
  void* p = checked_alloc(4096, bytes);
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->pinned.emplace(p, bytes);
  return p;
}

void FakeDeviceApi::free_pinned_host(void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->pinned.erase(p) != 1) fatal("free_pinned_host of a pointer it did not allocate");
  }
  std::free(p);
}

StreamHandle FakeDeviceApi::create_stream() {
  auto s = std::make_unique<Stream>();
  Stream* raw = s.get();
  const auto handle = reinterpret_cast<StreamHandle>(raw);
  raw->thread = std::thread([raw] {
    pthread_setname_np(pthread_self(), "stoker-fake-s");
    raw->run();
  });
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->streams.emplace(handle, std::move(s));
  return handle;
}

void FakeDeviceApi::destroy_stream(StreamHandle s) noexcept {
  if (s == 0) return;  // the default stream lives as long as the device
  std::unique_ptr<Stream> owned;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->streams.find(s);
    if (it == state_->streams.end()) fatal("destroy_stream of an unknown stream");
    owned = std::move(it->second);
    state_->streams.erase(it);
  }
  owned->close();  // queued work completes first, as with cuStreamDestroy
}

void FakeDeviceApi::enqueue(StreamHandle s, std::function<void()> op) {
  std::lock_guard<std::mutex> lock(state_->mu);  // keeps the stream from being destroyed
  auto it = state_->streams.find(s);
  if (it == state_->streams.end())
    STOKER_THROW(CudaError, "fake device: invalid stream handle ", s);
  Stream& st = *it->second;
  {
    std::lock_guard<std::mutex> sl(st.mu);
    st.ops.push_back(std::move(op));
  }
  st.cv.notify_one();
}

void FakeDeviceApi::launch(StreamHandle s, std::function<void()> fn) { enqueue(s, std::move(fn)); }

void FakeDeviceApi::synchronize_stream(StreamHandle s) {
  auto done = std::make_shared<std::pair<std::mutex, std::condition_variable>>();
  auto flag = std::make_shared<bool>(false);
  enqueue(s, [done, flag] {
    {
      std::lock_guard<std::mutex> lock(done->first);
      *flag = true;
    }
    done->second.notify_all();
  });
  std::unique_lock<std::mutex> lock(done->first);
  wait_sliced(done->second, lock, [&] { return *flag; });
}

void FakeDeviceApi::copy_to_device_async(void* dst, const void* src, size_t bytes, StreamHandle s) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->device.find(dst);
    // Copies land at the start of a buffer here; a partial check is enough to
    // catch a copy into freed memory.
    if (it != state_->device.end() && it->second < bytes)
      STOKER_THROW(CudaError, "fake device: copy of ", bytes, " bytes into a buffer of ",
                   it->second);
  }
  const auto delay = options_.copy_delay;
  State* st = state_.get();
  enqueue(s, [dst, src, bytes, delay, st] {
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    std::memcpy(dst, src, bytes);  // read at execution time, like DMA
    std::lock_guard<std::mutex> lock(st->mu);
    ++st->copies;
  });
}

EventHandle FakeDeviceApi::create_event(bool timing) {
  auto e = std::make_shared<Event>();
  e->timing = timing;
  const auto handle = reinterpret_cast<EventHandle>(e.get());
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->events.emplace(handle, std::move(e));
  return handle;
}

void FakeDeviceApi::destroy_event(EventHandle e) noexcept {
  std::lock_guard<std::mutex> lock(state_->mu);
  // Pending recordings keep the Event alive through their shared_ptr.
  if (state_->events.erase(e) != 1) fatal("destroy_event of an unknown event");
}

FakeDeviceApi::Event& FakeDeviceApi::event(EventHandle e) {
  auto it = state_->events.find(e);
  if (it == state_->events.end()) STOKER_THROW(CudaError, "fake device: invalid event handle ", e);
  return *it->second;
}

void FakeDeviceApi::record_event(EventHandle e, StreamHandle s) {
  std::shared_ptr<Event> ev;
  uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    event(e);  // validates the handle
    ev = state_->events[e];
    gen = ++ev->recorded;
    ev->pending.insert(gen);
  }
  State* st = state_.get();
  try {
    enqueue(s, [ev, gen, st] {
      {
        std::lock_guard<std::mutex> lock(st->mu);
        ev->pending.erase(gen);
        if (gen == ev->recorded) ev->done_at = std::chrono::steady_clock::now();
      }
      st->event_cv.notify_all();
    });
  } catch (...) {
    std::lock_guard<std::mutex> lock(state_->mu);
    ev->pending.erase(gen);
    throw;
  }
}

bool FakeDeviceApi::query_event(EventHandle e) {
  std::lock_guard<std::mutex> lock(state_->mu);
  const Event& ev = event(e);
  return ev.pending.count(ev.recorded) == 0;
}

bool FakeDeviceApi::wait_event(EventHandle e, std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  const Event& ev = event(e);
  const uint64_t gen = ev.recorded;
  return state_->event_cv.wait_for(lock, timeout, [&] { return ev.pending.count(gen) == 0; });
}

void FakeDeviceApi::stream_wait_event(StreamHandle s, EventHandle e) {
  std::shared_ptr<Event> ev;
  uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    event(e);
    ev = state_->events[e];
    gen = ev->recorded;  // the recording captured now, as cuStreamWaitEvent does
  }
  State* st = state_.get();
  enqueue(s, [ev, gen, st] {
    std::unique_lock<std::mutex> lock(st->mu);
    wait_sliced(st->event_cv, lock,
                [&] { return st->shutting_down || ev->pending.count(gen) == 0; });
  });
}

float FakeDeviceApi::elapsed_ms(EventHandle start, EventHandle end) {
  std::lock_guard<std::mutex> lock(state_->mu);
  const Event& a = event(start);
  const Event& b = event(end);
  if (!a.timing || !b.timing)
    STOKER_THROW(CudaError, "fake device: elapsed_ms of a non-timing event");
  if (a.recorded == 0 || b.recorded == 0 || a.pending.count(a.recorded) ||
      b.pending.count(b.recorded))
    STOKER_THROW(CudaError, "fake device: elapsed_ms of an incomplete event");
  return std::chrono::duration<float, std::milli>(b.done_at - a.done_at).count();
}

FakeDeviceApi::Counts FakeDeviceApi::counts() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  Counts c;
  c.device_buffers = static_cast<int64_t>(state_->device.size());
  c.pinned_buffers = static_cast<int64_t>(state_->pinned.size());
  c.streams = static_cast<int64_t>(state_->streams.size()) - 1;
  c.events = static_cast<int64_t>(state_->events.size());
  c.copies = state_->copies;
  return c;
}

std::shared_ptr<FakeDeviceApi> fake_device_api(FakeDeviceOptions options) {
  return std::make_shared<FakeDeviceApi>(options);
}

}  // namespace stoker
