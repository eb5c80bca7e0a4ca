// Memory of a device for the block pool (pipeline/block_pool.h): page-locked
// host slots, device buffers, and the event fence that orders a device
// buffer's reuse after its consumer (NOTE [ Stream ordering ] in
// transfer_engine.h).
#pragma once

#include <memory>

#include "cuda/device_api.h"
#include "cuda/event_pool.h"
#include "pipeline/block_pool.h"

namespace stoker {

/// Page-locked host memory from `api` (portable across contexts), for batch
/// slots that copy to the device by DMA. The allocator keeps `api` alive, so
/// slots can be freed after everything else is gone (a tensor the user kept).
std::shared_ptr<BlockAllocator> pinned_host_allocator(std::shared_ptr<DeviceApi> api);

/// Device memory from `api`.
std::shared_ptr<BlockAllocator> device_allocator(std::shared_ptr<DeviceApi> api);

/// Events from `events`: record() on the reader's stream, order_after() by a
/// stream wait, wait() on the host.
std::shared_ptr<BlockFence> event_fence(std::shared_ptr<DeviceApi> api,
                                        std::shared_ptr<EventPool> events);

/// A pool of device buffers with the event fence: what a loader copies into.
std::shared_ptr<BlockPool> device_buffer_pool(std::shared_ptr<DeviceApi> api, size_t max_idle);

}  // namespace stoker
