// Device delivery for the loader core: each stream gets a copy thread
// (TransferEngine) that moves its host batches into device buffers from one
// pool per loader (NOTE [ Pool across epochs ] in transfer_engine.h).
#pragma once

#include <memory>

#include "cuda/device_api.h"
#include "pipeline/block_pool.h"
#include "pipeline/delivery.h"

namespace stoker {

class DeviceDelivery final : public Delivery {
 public:
  /// @param prefetch batches copied ahead of the consumer, per stream
  DeviceDelivery(std::shared_ptr<DeviceApi> api, int prefetch);
  std::unique_ptr<BatchReader> open(std::shared_ptr<Stream> stream,
                                    std::shared_ptr<LoaderStats> stats) override;
  size_t buffers() const override { return pool_->blocks(); }
  size_t buffer_bytes() const override { return pool_->bytes(); }

  const std::shared_ptr<DeviceApi>& api() const { return api_; }

 private:
  std::shared_ptr<DeviceApi> api_;
  int prefetch_;
  std::shared_ptr<BlockPool> pool_;
};

}  // namespace stoker
