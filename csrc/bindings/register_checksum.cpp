// Bindings of the streaming form of the format checksum (common/checksum.h), for code that
// checks whole files as they arrive (the remote shard cache) without reading them twice.
#include <pybind11/pybind11.h>

#include "common/checksum.h"
#include "common/error.h"

namespace py = pybind11;

namespace stoker::bindings {

void register_checksum(py::module_& m) {
  py::class_<StreamingChecksum>(m, "Checksum32",
                                "checksum32 over consecutive pieces: update() them in order, "
                                "then digest() equals checksum32 of their concatenation.")
      .def(py::init<>())
      .def(
          "update",
          [](StreamingChecksum& c, const py::buffer& data) {
            py::buffer_info info = data.request();
            STOKER_CHECK(PyBuffer_IsContiguous(reinterpret_cast<Py_buffer*>(info.view()), 'C'),
                         UsageError, "buffer must be C-contiguous");
            const size_t n = static_cast<size_t>(info.size * info.itemsize);
            py::gil_scoped_release nogil;
            c.update(info.ptr, n);
          },
          py::arg("data"))
      .def("digest", &StreamingChecksum::digest);
}

}  // namespace stoker::bindings
