// stoker._testing: the host fake of a CUDA device (cuda/fake_device_api.h), for
// the tests of the device path without a GPU (tests/conftest.py's
// fake_device_loader). It comes out as a _core.Device, which the loader takes as
// it takes the CUDA driver's.
#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>

#include "common/error.h"
#include "cuda/device_api.h"
#include "cuda/fake_device_api.h"

namespace py = pybind11;

namespace stoker::testing {

void register_fake_device(py::module_& m) {
  m.def(
      "fake_device",
      [](int64_t copy_delay_us) {
        STOKER_CHECK(copy_delay_us >= 0, UsageError, "copy_delay_us must be >= 0");
        return std::static_pointer_cast<DeviceApi>(
            fake_device_api({0, std::chrono::microseconds(copy_delay_us)}));
      },
      py::arg("copy_delay_us") = 0,
      "A host-only device with CUDA's stream and event semantics (streams are threads): "
      "batches come out as CPU tensors.");
}

}  // namespace stoker::testing
