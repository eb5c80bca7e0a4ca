// Page-locked batch slots: the HostAllocator the slot pool uses when
// pin_memory is on, so that copies to the device are true async DMA.
#pragma once

#include <memory>

#include "cuda/device_api.h"
#include "pipeline/batch.h"

namespace stoker {

/// Page-locked host memory from `api` (portable across contexts). The
/// allocator keeps `api` alive, so slots can be freed after everything else
/// is gone (a tensor the user kept).
std::shared_ptr<HostAllocator> pinned_host_allocator(std::shared_ptr<DeviceApi> api);

}  // namespace stoker
