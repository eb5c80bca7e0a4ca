// Bindings of csrc/cuda.
#include <pybind11/pybind11.h>

#include "cuda/driver_probe.h"

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
}

}  // namespace stoker::bindings
