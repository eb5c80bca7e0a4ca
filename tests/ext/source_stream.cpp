// stoker._testing: a mixture source's stream (sampler/source_stream.h) on its own,
// for tests/test_mix.py; the loader reaches it only through a mixture's producer.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "sampler/source_stream.h"

namespace py = pybind11;

namespace stoker::testing {

void register_source_stream(py::module_& m) {
  py::class_<SourceStream>(m, "SourceStream",
                           "A mixture source's samples pass after pass, each pass in a fresh "
                           "keyed order.")
      .def(py::init<std::vector<int64_t>, bool, int64_t, uint64_t>(), py::arg("shard_records"),
           py::arg("shuffle"), py::arg("shard_window"), py::arg("key"))
      .def_property_readonly("size", &SourceStream::size)
      .def(
          "map",
          [](const SourceStream& st, py::array_t<int64_t, py::array::c_style> c) {
            py::array_t<int64_t> out(c.size());
            const int64_t* in = c.data();
            const size_t n = static_cast<size_t>(c.size());
            {
              py::gil_scoped_release nogil;
              st.map(in, out.mutable_data(), n);
            }
            return out;
          },
          py::arg("positions"), "The dataset index of each stream position.")
      .def("shard_schedule", &SourceStream::shard_schedule, py::arg("position"),
           py::arg("max_shards"));
}

}  // namespace stoker::testing
