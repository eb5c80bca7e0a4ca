// Glue between the host pipeline's bindings and the CUDA transfer bindings.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>
#include <optional>

#include "pipeline/batch.h"

namespace stoker::bindings {

namespace py = pybind11;

/// A blocking source of host batches over a Python-side `_core.Iteration`:
/// returns the next batch in order, nullopt at the end of the epoch, throws
/// the error of the batch at that position (or UsageError once stopped).
/// Safe to call without the GIL from any one thread.
std::function<std::optional<HostBatch>()> host_source(const py::object& iteration);

/// Opaque handle to a slot allocator, passed from Python to the engine.
struct HostAllocatorHandle {
  std::shared_ptr<HostAllocator> alloc;
};

}  // namespace stoker::bindings
