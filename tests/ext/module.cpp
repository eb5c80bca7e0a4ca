// stoker._testing: entry points that only tests and benchmarks call (kernels one
// at a time on NumPy arrays, the host fake of a device, a mixture source's stream),
// kept out of stoker._core (csrc/bindings/ holds nothing test-only). Built for the
// development install (CMake option STOKER_TESTING_MODULE, ON by default); the
// wheel users get is built without it (scripts/build-wheel.sh).
//
// It links its own copy of the core and shares stoker._core's pybind11 types
// (ImageOp, Device) and exception translators, so _core is imported first. Its
// functions keep no state of the core's: a process-wide counter read here would be
// this module's copy, not the loader's.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace stoker::testing {
void register_augment_kernels(py::module_& m);
void register_fake_device(py::module_& m);
void register_source_stream(py::module_& m);
}  // namespace stoker::testing

PYBIND11_MODULE(_testing, m, py::mod_gil_not_used()) {
  m.doc() = "stoker's test-only entry points (not in the wheel)";
  py::module_::import("stoker._core");  // its types and exception translators
  stoker::testing::register_augment_kernels(m);
  stoker::testing::register_fake_device(m);
  stoker::testing::register_source_stream(m);
}
