// Bindings of csrc/cuda: the driver probe, GPU delivery (CudaTransfer) and
// page-locked slot allocators.
#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <optional>

#include "bindings/dlpack.h"
#include "bindings/host_source.h"
#include "common/error.h"
#include "cuda/device_api.h"
#include "cuda/driver_probe.h"
#include "cuda/fake_device_api.h"
#include "cuda/pinned_allocator.h"
#include "cuda/transfer_engine.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

std::shared_ptr<DeviceApi> open_device(int device, bool fake, int64_t fake_delay_us) {
  STOKER_CHECK(fake_delay_us >= 0, UsageError, "fake_delay_us must be >= 0");
  py::gil_scoped_release nogil;  // cuInit and context creation can take a while
  if (fake) return fake_device_api({device, std::chrono::microseconds(fake_delay_us)});
  return cuda_driver_api(device);
}

/// A device and the pool of buffers that a loader's epochs copy into
/// (NOTE [ Pool across epochs ] in cuda/transfer_engine.h).
class DeviceContext {
 public:
  DeviceContext(int device, int max_idle, bool fake, int64_t fake_delay_us)
      : api_(open_device(device, fake, fake_delay_us)), fake_(fake) {
    STOKER_CHECK(max_idle >= 0, UsageError, "max_idle must be >= 0, got ", max_idle);
    pool_ = DeviceBufferPool::create(api_, static_cast<size_t>(max_idle));
  }
  py::dict stats() const {
    py::dict d;
    d["pool_buffers"] = pool_->buffers();
    d["pool_bytes"] = pool_->bytes();
    return d;
  }

  const std::shared_ptr<DeviceApi>& api() const { return api_; }
  const std::shared_ptr<DeviceBufferPool>& pool() const { return pool_; }
  int device() const { return api_->device(); }
  bool fake() const { return fake_; }

 private:
  std::shared_ptr<DeviceApi> api_;
  bool fake_;
  std::shared_ptr<DeviceBufferPool> pool_;
};

/// One epoch's batches delivered to a device; wraps TransferEngine.
class CudaTransfer {
 public:
  /// A transfer with a pool of its own, freed when it stops.
  CudaTransfer(py::object source, int device, int prefetch, bool fake, int64_t fake_delay_us)
      : source_(std::move(source)), fake_(fake) {
    STOKER_CHECK(prefetch >= 1, UsageError, "prefetch must be >= 1, got ", prefetch);
    auto src = host_source(source_);  // with the GIL: it reads the Python object
    api_ = open_device(device, fake, fake_delay_us);
    py::gil_scoped_release nogil;
    engine_ = std::make_unique<TransferEngine>(api_, std::move(src),
                                               static_cast<size_t>(prefetch));
  }

  /// A transfer into `context`'s pool, which outlives it.
  CudaTransfer(py::object source, const DeviceContext& context, int prefetch)
      : source_(std::move(source)), fake_(context.fake()), api_(context.api()) {
    STOKER_CHECK(prefetch >= 1, UsageError, "prefetch must be >= 1, got ", prefetch);
    auto src = host_source(source_);
    py::gil_scoped_release nogil;
    engine_ = std::make_unique<TransferEngine>(api_, std::move(src),
                                               static_cast<size_t>(prefetch), context.pool());
  }

  ~CudaTransfer() {
    try {
      stop();
    } catch (...) {  // a destructor reports nothing; stop() already did its best
    }
  }

  py::object next(uintptr_t consumer_stream) {
    using namespace std::chrono_literals;
    std::optional<DeviceBatch> b;
    for (;;) {
      TransferEngine::Status s;
      {
        py::gil_scoped_release nogil;
        s = engine_->next_for(consumer_stream, 50ms, b);
        // The fake's memory is read by the host right away: the host is its
        // consumer, so it waits for the stream the copy was ordered on.
        if (s == TransferEngine::Status::kBatch && fake_) api_->synchronize_stream(consumer_stream);
      }
      if (s == TransferEngine::Status::kBatch) break;
      if (s == TransferEngine::Status::kEnd) return py::none();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C while waiting
    }
    const bool host = api_->device_memory_is_host();
    return batch_to_capsules(b->memory, b->tensors, host ? kDLCPU : kDLCUDA,
                             host ? 0 : b->device);
  }

  /// NOTE [ Transfer shutdown ] (cuda/transfer_engine.h): the source is
  /// stopped first so that a copy thread blocked on it returns.
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    if (source_ && py::hasattr(source_, "stop")) source_.attr("stop")();
    py::gil_scoped_release nogil;
    engine_->stop();
  }

  py::dict stats() const {
    const TransferStats s = engine_->stats();
    py::dict d;
    d["copies"] = s.copies;
    d["bytes"] = s.bytes;
    d["copy_seconds"] = s.copy_seconds;
    d["wait_seconds"] = s.wait_seconds;
    d["pool_buffers"] = s.pool_buffers;
    d["pool_bytes"] = s.pool_bytes;
    d["copy_gbps"] = s.copy_seconds > 0 ? static_cast<double>(s.bytes) / s.copy_seconds * 1e-9 : 0.0;
    return d;
  }

  int device() const { return api_->device(); }
  bool fake() const { return fake_; }

 private:
  py::object source_;
  bool fake_;
  bool stopped_ = false;
  std::shared_ptr<DeviceApi> api_;
  std::unique_ptr<TransferEngine> engine_;
};

}  // namespace

void register_cuda(py::module_& m) {
  m.def(
      "cuda_status",
      [] {
        CudaStatus s;
        {
          py::gil_scoped_release nogil;  // cuInit can take a while
          s = cuda_status();
        }
        return py::make_tuple(s.available, s.device_count, s.reason);
      },
      "(available, device_count, reason): probes libcuda.so.1 at run time; never raises.");

  py::class_<DeviceContext, std::shared_ptr<DeviceContext>>(
      m, "DeviceContext",
      "A CUDA device (or the host fake) and a pool of device buffers that outlives the "
      "transfers using it, so that consecutive epochs reuse the buffers and ending an epoch "
      "never waits for the GPU.")
      .def(py::init<int, int, bool, int64_t>(), py::arg("device"), py::arg("max_idle"),
           py::arg("fake") = false, py::arg("fake_delay_us") = 0,
           "max_idle: idle buffers kept for reuse. Raises CudaError when the driver or the "
           "device is missing.")
      .def("stats", &DeviceContext::stats, "pool_buffers, pool_bytes: device buffers alive.")
      .def_property_readonly("device", &DeviceContext::device)
      .def_property_readonly("fake", &DeviceContext::fake);

  py::class_<CudaTransfer>(m, "CudaTransfer",
                           "Copies one epoch's host batches to a device on a copy stream of its "
                           "own (see docs/gpu.md).")
      .def(py::init<py::object, int, int, bool, int64_t>(), py::arg("source"), py::arg("device"),
           py::arg("prefetch"), py::arg("fake") = false, py::arg("fake_delay_us") = 0,
           "source: a _core.Iteration. fake=True uses the host fake device (CPU tensors), for "
           "tests. The transfer has a buffer pool of its own, freed when it stops. Raises "
           "CudaError when the driver or the device is missing.")
      .def(py::init<py::object, const DeviceContext&, int>(), py::arg("source"),
           py::arg("context"), py::arg("prefetch"),
           "Copies into `context`'s buffer pool, which outlives the transfer.")
      .def("next", &CudaTransfer::next, py::arg("consumer_stream"),
           "The next batch as [(name, dltensor capsule)] on the device, or None at the end. "
           "`consumer_stream` (a CUstream as int, 0 = legacy default) is made to wait for the "
           "copy; the memory returns to the pool after work queued on it before the last "
           "tensor is freed.")
      .def("stop", &CudaTransfer::stop,
           "Stops the source and the copy thread; batches already returned stay valid.")
      .def("stats", &CudaTransfer::stats,
           "copies, bytes, copy_seconds (device time), wait_seconds, pool_buffers, pool_bytes, "
           "copy_gbps.")
      .def_property_readonly("device", &CudaTransfer::device)
      .def_property_readonly("fake", &CudaTransfer::fake);

  m.def(
      "pinned_allocator",
      [](int device) {
        py::gil_scoped_release nogil;
        return HostAllocatorHandle{pinned_host_allocator(cuda_driver_api(device))};
      },
      py::arg("device"), "Page-locked slot memory for the loader (CUDA device `device`).");
  m.def(
      "fake_pinned_allocator",
      [] { return HostAllocatorHandle{pinned_host_allocator(fake_device_api())}; },
      "Slot memory from the host fake device, for tests.");
}

}  // namespace stoker::bindings
