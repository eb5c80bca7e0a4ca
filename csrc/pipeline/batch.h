// What a finished batch looks like as it leaves the engine: named tensors laid
// out in one buffer. The buffer's owner is a shared_ptr whose last release
// returns the memory to the pool it came from, which is how DLPack deleters
// recycle slots (see NOTE [ Slot lifetime ] in slot_pool.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace stoker {

/// One output tensor of a batch, at `offset` bytes into the batch buffer.
struct TensorDesc {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;  // C-contiguous
  size_t offset = 0;
  size_t nbytes = 0;
};

/// A complete batch in host memory.
struct HostBatch {
  int64_t index = -1;               ///< batch number within the epoch
  std::shared_ptr<uint8_t> memory;  ///< base of the slot; owns it (aliasing shared_ptr)
  size_t bytes = 0;                 ///< bytes used from `memory`
  bool pinned = false;              ///< slot memory is page-locked
  std::vector<TensorDesc> tensors;
};

/// Allocates slot memory. The default gives page-aligned pageable memory; the
/// CUDA layer provides a page-locked one.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  /// @return at least `bytes` bytes, 64-byte aligned; throws on failure.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual bool pinned() const { return false; }
};

/// Page-aligned pageable memory (std::aligned_alloc).
std::shared_ptr<HostAllocator> default_host_allocator();

}  // namespace stoker
