// Bindings of csrc/format: the dataset reader, the shard writer, checksums.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/checksum.h"
#include "common/error.h"
#include "format/dataset.h"
#include "format/shard_writer.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

FieldKind kind_from_name(const std::string& k) {
  if (k == "scalar") return FieldKind::kScalar;
  if (k == "ndarray") return FieldKind::kNDArray;
  if (k == "blob") return FieldKind::kBlob;
  if (k == "image") return FieldKind::kImage;
  STOKER_THROW(UsageError, "unknown field kind '", k, "'");
}

Schema schema_from_py(const py::list& fields, uint64_t hash) {
  Schema s;
  s.hash = hash;
  for (const auto& item : fields) {
    auto d = item.cast<py::dict>();
    FieldSpec f;
    f.name = d["name"].cast<std::string>();
    f.kind = kind_from_name(d["kind"].cast<std::string>());
    f.dtype = dtype_from_name(d.contains("dtype") ? d["dtype"].cast<std::string>() : "uint8");
    if (d.contains("shape")) f.shape = d["shape"].cast<std::vector<int64_t>>();
    for (size_t i = 0; i < f.shape.size(); ++i)
      STOKER_CHECK(f.shape[i] >= 0 || (i == 0 && f.kind == FieldKind::kNDArray), UsageError,
                   "field '", f.name, "': only the first dimension may be variable (None)");
    s.fields.push_back(std::move(f));
  }
  return s;
}

py::buffer_info request_contiguous(const py::buffer& b) {
  py::buffer_info info = b.request();
  STOKER_CHECK(PyBuffer_IsContiguous(reinterpret_cast<Py_buffer*>(info.view()), 'C'), UsageError,
               "buffer must be C-contiguous");
  return info;
}

}  // namespace

void register_format(py::module_& m) {
  m.def(
      "checksum32",
      [](const py::buffer& data) {
        py::buffer_info info = request_contiguous(data);
        const size_t n = static_cast<size_t>(info.size * info.itemsize);
        py::gil_scoped_release nogil;
        return checksum32(info.ptr, n);
      },
      py::arg("data"), "The shard format's checksum of a buffer (low 32 bits of XXH3-64).");
  m.def("checksum_impl", &checksum_impl);

  py::class_<Dataset, std::shared_ptr<Dataset>>(m, "Dataset")
      .def(py::init([](const py::list& fields, uint64_t schema_hash,
                       const std::vector<std::tuple<std::string, int64_t, int64_t>>& shards) {
             Schema schema = schema_from_py(fields, schema_hash);
             std::vector<ShardInfo> infos;
             for (const auto& [path, n, bytes] : shards) infos.push_back({path, n, bytes});
             py::gil_scoped_release nogil;
             return std::make_shared<Dataset>(std::move(schema), infos);
           }),
           py::arg("fields"), py::arg("schema_hash"), py::arg("shards"))
      .def("__len__", &Dataset::size)
      .def_property_readonly("num_shards", &Dataset::num_shards)
      .def("shard_path", [](const Dataset& d, size_t s) { return d.shard(s).path(); })
      .def("locate",
           [](const Dataset& d, int64_t i) {
             auto loc = d.locate(i);
             return py::make_tuple(loc.shard, loc.record);
           })
      .def(
          "read",
          [](const Dataset& d, int64_t i) {
            std::vector<RecordView> views(d.schema().fields.size());
            {
              py::gil_scoped_release nogil;
              d.read(i, views.data());
            }
            py::list out;
            for (size_t f = 0; f < views.size(); ++f) {
              const char* p = reinterpret_cast<const char*>(views[f].data);
              FieldKind k = d.schema().fields[f].kind;
              if (k == FieldKind::kBlob || k == FieldKind::kImage)
                out.append(py::bytes(p, views[f].size));
              else  // writable, so numpy arrays made from it are writable
                out.append(py::reinterpret_steal<py::object>(
                    PyByteArray_FromStringAndSize(p, static_cast<Py_ssize_t>(views[f].size))));
            }
            return out;
          },
          py::arg("index"), "Verified field payloads of sample `index`.")
      .def(
          "verify_shard",
          [](const Dataset& d, size_t s) {
            // Every record: checksum and field structure. Returns (file_checksum, [(record,
            // reason)]).
            std::vector<std::pair<int64_t, std::string>> bad;
            uint32_t file_checksum;
            {
              py::gil_scoped_release nogil;
              const ShardReader& r = d.shard(s);
              std::vector<RecordView> views(d.schema().fields.size());
              for (int64_t i = 0; i < r.num_records(); ++i) {
                try {
                  split_record(d.schema(), r.record(i), views.data());
                } catch (const std::exception& e) {
                  bad.emplace_back(i, e.what());
                }
              }
              file_checksum = r.file_checksum();
            }
            return py::make_tuple(file_checksum, bad);
          },
          py::arg("shard"));

  py::class_<ShardWriter>(m, "ShardFileWriter")
      .def(py::init<std::string, uint64_t, uint32_t>(), py::arg("path"), py::arg("schema_hash"),
           py::arg("num_fields"))
      .def(
          "append",
          [](ShardWriter& w, const py::buffer& record) {
            py::buffer_info info = request_contiguous(record);
            w.append(static_cast<const uint8_t*>(info.ptr),
                     static_cast<size_t>(info.size * info.itemsize));
          },
          py::arg("record"))
      .def_property_readonly("bytes_written", &ShardWriter::bytes_written)
      .def_property_readonly("num_records", &ShardWriter::num_records)
      .def("finish",
           [](ShardWriter& w) {
             ShardSummary s = w.finish();
             return py::make_tuple(s.num_records, s.bytes, s.checksum);
           })
      .def("abort", &ShardWriter::abort);
}

}  // namespace stoker::bindings
