// Bindings of csrc/cuda: the driver probe, devices (the CUDA driver; the host
// fake is stoker._testing's, tests/ext/fake_device.cpp), page-locked slot memory
// and device delivery for the loader core.
#include <pybind11/pybind11.h>

#include <memory>

#include "common/error.h"
#include "cuda/device_api.h"
#include "cuda/device_delivery.h"
#include "cuda/driver_probe.h"
#include "cuda/pinned_allocator.h"

namespace py = pybind11;

namespace stoker::bindings {

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

  py::class_<DeviceApi, std::shared_ptr<DeviceApi>>(m, "Device",
                                                    "A CUDA device, or the host fake of one.")
      .def_property_readonly("index", &DeviceApi::device)
      .def_property_readonly("fake", &DeviceApi::device_memory_is_host);

  m.def(
      "cuda_device",
      [](int device) {
        py::gil_scoped_release nogil;  // cuInit and context creation can take a while
        return cuda_driver_api(device);
      },
      py::arg("device"),
      "The CUDA driver on `device` (its primary context, shared with PyTorch). Raises CudaError "
      "when the driver or the device is missing.");
  m.def(
      "pinned_memory",
      [](std::shared_ptr<DeviceApi> device) { return pinned_host_allocator(std::move(device)); },
      py::arg("device"), "Page-locked slot memory through `device`'s context.");
  m.def(
      "device_delivery",
      [](std::shared_ptr<DeviceApi> device, int prefetch) {
        return std::static_pointer_cast<Delivery>(
            std::make_shared<DeviceDelivery>(std::move(device), prefetch));
      },
      py::arg("device"), py::arg("prefetch"),
      "Batches copied to `device` on a copy stream of their own, into a pool of device buffers "
      "that serves every epoch (docs/gpu.md).");
}

}  // namespace stoker::bindings
