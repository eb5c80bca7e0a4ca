// Export of batch memory as DLPack capsules ("dltensor"), consumed by
// torch.from_dlpack without a copy. The capsule's deleter drops a reference to
// the batch memory; the last one returns the slot or device buffer to its pool.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "pipeline/batch.h"

namespace stoker::bindings {

namespace py = pybind11;

/// DLPack device types used here (values from the DLPack ABI).
constexpr int kDLCPU = 1;
constexpr int kDLCUDA = 2;
constexpr int kDLCUDAHost = 3;

/// Wraps `desc` (at base + desc.offset) as a "dltensor" capsule that keeps `base` alive.
py::capsule make_dlpack_capsule(const std::shared_ptr<uint8_t>& base, const TensorDesc& desc,
                                int device_type, int device_id);

/// The list [(name, capsule), ...] for all tensors of a batch.
py::list batch_to_capsules(const std::shared_ptr<uint8_t>& base,
                           const std::vector<TensorDesc>& tensors, int device_type, int device_id);

}  // namespace stoker::bindings
