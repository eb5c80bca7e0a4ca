#include "cuda/device_delivery.h"

#include <atomic>

#include "common/error.h"
#include "cuda/pinned_allocator.h"
#include "cuda/transfer_engine.h"
#include "pipeline/window.h"

namespace stoker {

namespace {

class DeviceReader final : public BatchReader {
 public:
  DeviceReader(std::shared_ptr<DeviceApi> api, std::shared_ptr<Stream> stream, int prefetch,
               std::shared_ptr<BlockPool> pool, std::shared_ptr<LoaderStats> stats)
      : api_(api), stream_(stream) {
    auto source = [stream](HostBatch& out, TransferEngine::Clock::time_point deadline) {
      switch (stream->read(out, deadline)) {
        case Stream::Read::kBatch:
          return TransferEngine::SourceStatus::kBatch;
        case Stream::Read::kTimeout:
          return TransferEngine::SourceStatus::kTimeout;
        case Stream::Read::kEnd:  // NOTE [ Open-ended epochs ]: the copy thread ends there
          return TransferEngine::SourceStatus::kEnd;
        case Stream::Read::kStopped:
          break;
      }
      return TransferEngine::SourceStatus::kStopped;
    };
    engine_ = std::make_unique<TransferEngine>(std::move(api), source, prefetch, std::move(pool),
                                               std::move(stats));
  }
  ~DeviceReader() override {
    stop();
    join();
  }

  Status next(DeliveredBatch& out, Clock::time_point deadline, uintptr_t consumer_stream,
              uintptr_t side_stream) override {
    if (stopped_.load(std::memory_order_acquire)) return Status::kStopped;
    std::optional<DeviceBatch> b;
    TransferEngine::Status s;
    try {
      s = engine_->next_until(consumer_stream, deadline, b, side_stream);
    } catch (...) {
      if (stopped_.load(std::memory_order_acquire)) return Status::kStopped;
      out = DeliveredBatch{};
      out.error = std::current_exception();
      return Status::kBatch;
    }
    if (s == TransferEngine::Status::kTimeout) return Status::kTimeout;
    if (s == TransferEngine::Status::kEnd)  // the source's end, or the copies stopped
      return stopped_.load(std::memory_order_acquire) ? Status::kStopped : Status::kEnd;
    // The fake's "device" memory is read by the host right away: the host is
    // its consumer, so it waits for the stream the copy was ordered on.
    const bool host = api_->device_memory_is_host();
    if (host) {
      api_->synchronize_stream(consumer_stream);
      if (side_stream != 0) api_->synchronize_stream(side_stream);
    }
    out = DeliveredBatch{b->index,    std::move(b->memory),  std::move(b->tensors),
                         b->counters, host ? -1 : b->device, nullptr,
                         b->ticket};
    return Status::kBatch;
  }

  int ready(int max) const override {
    // Copied and waiting, then assembled and waiting for the copy.
    const int copied = engine_->ready(max);
    return copied < max ? copied + stream_->ready_run(max - copied) : copied;
  }

  void stop() override {
    stopped_.store(true, std::memory_order_release);
    stream_->stop();
    engine_->request_stop();
  }

  // NOTE [ Loader shutdown ]: never with the core's mutex held.
  void join() override { engine_->stop(); }

 private:
  std::shared_ptr<DeviceApi> api_;
  std::shared_ptr<Stream> stream_;
  std::unique_ptr<TransferEngine> engine_;
  std::atomic<bool> stopped_{false};
};

}  // namespace

DeviceDelivery::DeviceDelivery(std::shared_ptr<DeviceApi> api, int prefetch)
    : api_(std::move(api)), prefetch_(checked_prefetch(prefetch)) {
  STOKER_CHECK(api_ != nullptr, UsageError, "DeviceDelivery: no device API");
  pool_ = device_buffer_pool(api_, idle_blocks(prefetch_));
}

std::unique_ptr<BatchReader> DeviceDelivery::open(std::shared_ptr<Stream> stream,
                                                  std::shared_ptr<LoaderStats> stats) {
  return std::make_unique<DeviceReader>(api_, std::move(stream), prefetch_, pool_,
                                        std::move(stats));
}

}  // namespace stoker
