// What a finished batch looks like as it leaves a stream: named tensors laid
// out in one buffer. The buffer's owner is a shared_ptr whose last release
// returns the memory to the pool it came from, which is how DLPack deleters
// recycle slots (NOTE [ Block lifetime ] in block_pool.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
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

/// What a delivered batch adds to the loader's counters.
struct BatchCounters {
  int64_t samples = 0;
  int64_t skipped = 0;
  int64_t bytes_read = 0;
  std::vector<int64_t> sources;  ///< BatchWork::source_counts (a mixture's)
};

/// A complete batch in host memory, or the error of the batch at its position.
struct HostBatch {
  int64_t index = -1;               ///< batch number within its epoch
  std::shared_ptr<uint8_t> memory;  ///< base of the slot; owns it (aliasing shared_ptr)
  size_t bytes = 0;                 ///< bytes used from `memory`
  bool pinned = false;              ///< slot memory is page-locked
  std::vector<TensorDesc> tensors;
  BatchCounters counters;
  uint64_t ticket = 0;       ///< what the finisher gave it (batch_handoff.h); 0: none
  std::exception_ptr error;  ///< set instead of the rest when the batch failed
};

}  // namespace stoker
