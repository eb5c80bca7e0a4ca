// Bindings of csrc/format: the dataset reader, the shard writer, checksums.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/checksum.h"
#include "common/error.h"
#include "common/file_checks.h"
#include "format/dataset.h"
#include "format/mapped_file.h"
#include "format/read_benchmark.h"
#include "format/shard_reader.h"
#include "format/shard_table.h"
#include "format/shard_writer.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

FieldKind kind_from_name(const std::string& k) {
  if (k == "scalar") return FieldKind::kScalar;
  if (k == "ndarray") return FieldKind::kNDArray;
  if (k == "blob") return FieldKind::kBlob;
  if (k == "image") return FieldKind::kImage;
  if (k == "video") return FieldKind::kVideo;
  if (k == "audio") return FieldKind::kAudio;
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

// A shard's identity as index.json gives it: (dataset_id_hex, ordinal, header_checksum,
// table_checksum), or None for format version 1.
std::optional<ShardIdentity> identity_from_py(const py::handle& h) {
  if (h.is_none()) return std::nullopt;
  auto id = h.cast<std::tuple<std::string, uint64_t, uint32_t, uint32_t>>();
  return ShardIdentity{DatasetId::from_hex(std::get<0>(id)), std::get<1>(id), std::get<2>(id),
                       std::get<3>(id)};
}

const ShardGate& gate_of(const Dataset& d) {
  STOKER_CHECK(d.gate() != nullptr, UsageError, "the dataset is not deferred");
  return *d.gate();
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
      "random_read_rate",
      [](const Dataset& ds, int threads, bool verify, int rounds) {
        py::gil_scoped_release nogil;
        return random_read_rate(ds, threads, verify, rounds);
      },
      py::arg("dataset"), py::arg("threads"), py::arg("verify"), py::arg("rounds") = 3,
      "Records/s of reading every record in a random order on `threads` threads, each "
      "prefetched one ahead, verified or not, and copied: the loader's hardware ceiling.");
  m.def(
      "checksum32",
      [](const py::buffer& data) {
        py::buffer_info info = request_contiguous(data);
        const size_t n = static_cast<size_t>(info.size * info.itemsize);
        py::gil_scoped_release nogil;
        return checksum32(info.ptr, n);
      },
      py::arg("data"), "The shard format's checksum of a buffer (low 32 bits of XXH3-64).");

  m.def("live_mappings", &MappedFile::live_mappings, "Shard files mapped in this process now.");
  m.def("new_file_check_round", &new_file_check_round,
        "An epoch begins: every shard mapping checks its file again before a read skips a "
        "record's hash (NOTE [ Verified once ] in format/shard_reader.h).");

  py::class_<Dataset, std::shared_ptr<Dataset>>(m, "Dataset")
      .def(py::init([](const py::list& fields, uint64_t schema_hash, const py::list& shards,
                       bool probe_on_open, bool map_on_open, int lease_fd, bool deferred,
                       bool releasable, bool record_ranges, bool preload) {
             Schema schema = schema_from_py(fields, schema_hash);
             std::vector<ShardInfo> infos;
             infos.reserve(shards.size());
             for (const auto& item : shards) {
               auto t = item.cast<py::tuple>();
               STOKER_CHECK(t.size() >= 3 && t.size() <= 5, UsageError,
                            "shard entries are (path, num_records, bytes[, identity[, checksum]])");
               ShardInfo info{t[0].cast<std::string>(), t[1].cast<int64_t>(), t[2].cast<int64_t>(),
                              std::nullopt, std::nullopt};
               if (t.size() >= 4) info.identity = identity_from_py(t[3]);
               if (t.size() == 5 && !t[4].is_none()) info.checksum = t[4].cast<uint32_t>();
               infos.push_back(std::move(info));
             }
             Dataset::Options opts;
             opts.probe_on_open = probe_on_open;
             opts.map_on_open = map_on_open;
             opts.deferred = deferred;
             opts.releasable = releasable;
             opts.record_ranges = record_ranges;
             opts.preload = preload;
             std::shared_ptr<Dataset> ds;
             {
               py::gil_scoped_release nogil;
               ds = std::make_shared<Dataset>(std::move(schema), std::move(infos), opts);
             }
             // Only a dataset that opened takes the lease; on an error the caller still owns it.
             if (lease_fd >= 0) ds->hold_lease(lease_fd);
             return ds;
           }),
           py::arg("fields"), py::arg("schema_hash"), py::arg("shards"),
           py::arg("probe_on_open") = true, py::arg("map_on_open") = false,
           py::arg("lease_fd") = -1, py::arg("deferred") = false, py::arg("releasable") = false,
           py::arg("record_ranges") = false, py::arg("preload") = false,
           "Shards are (path, num_records, bytes, identity[, checksum]) with identity "
           "(dataset_id_hex, ordinal, header_checksum, table_checksum) or None (format version "
           "1), checksum the file's from index.json or None. On success "
           "the dataset owns lease_fd and closes it when destroyed. deferred: the shard files "
           "are not there yet; each is read after provide() (NOTE [ Deferred shards ] in "
           "csrc/format/shard_gate.h). releasable: deferred, and try_release() gives shards back "
           "(NOTE [ Released shards ]). record_ranges: deferred, and readers may have records "
           "fetched by range before their shard (NOTE [ Records by range ]). preload: every "
           "shard is read into memory now (NOTE [ Preloaded shards ]).")
      .def_property_readonly("deferred", &Dataset::deferred)
      .def_property_readonly("releasable", &Dataset::releasable)
      .def("try_release", &Dataset::try_release, py::arg("shard"),
           py::call_guard<py::gil_scoped_release>(),
           "Releasable datasets: unmaps shard `shard` and makes it pending again unless a reader "
           "holds it; whether it did.")
      .def("pins", &Dataset::pins, py::arg("shard"), "Readers holding shard `shard` now.")
      .def_property_readonly("record_ranges", &Dataset::record_ranges)
      .def("take_record_demands", &Dataset::take_record_demands,
           "Records readers wait for, as (shard, record) pairs; taken.")
      .def(
          "provide_table",
          [](Dataset& d, size_t s, const std::string& url, const py::bytes& head,
             const py::bytes& tail) {
            const std::string_view h = head, t = tail;
            d.provide_table(s, url, reinterpret_cast<const uint8_t*>(h.data()), h.size(),
                            reinterpret_cast<const uint8_t*>(t.data()), t.size());
          },
          py::arg("shard"), py::arg("url"), py::arg("head"), py::arg("tail"),
          "The header and the tail (record table and footer) of shard `shard`, fetched by "
          "range; DataError naming `url` if they do not match index.json.")
      .def(
          "provide_record",
          [](Dataset& d, size_t s, int64_t r, const py::bytes& data) {
            const std::string_view v = data;
            d.provide_record(s, r, reinterpret_cast<const uint8_t*>(v.data()), v.size());
          },
          py::arg("shard"), py::arg("record"), py::arg("data"),
          "Bytes of one record fetched by range, for the readers waiting for it; DataError "
          "if they do not match the table.")
      .def("no_ranges", &Dataset::no_ranges, py::arg("shard"),
           "Shard `shard` is not served by range: its readers wait for the whole shard.")
      .def_property_readonly("buffered_records", &Dataset::buffered_records,
                             "(records, bytes) held for readers, fetched by range.")
      .def("provide", &Dataset::provide, py::arg("shard"),
           "Deferred shards: shard `shard` is local now; readers waiting for it go on.")
      .def("fail", &Dataset::fail, py::arg("shard"), py::arg("why"),
           "Deferred shards: readers of shard `shard` raise RemoteError(why).")
      .def("demands", &Dataset::demands,
           "Deferred shards: those readers wait for, neither provided nor failed.")
      .def(
          "hold",
          [](const Dataset& d, size_t s) {
            STOKER_CHECK(s < d.num_shards(), UsageError, "shard ", s, " out of range");
            if (d.releasable()) gate_of(d).hold(s);
          },
          py::arg("shard"),
          "Releasable datasets: shard `shard` is not given back until unhold() (a read "
          "outside a loader makes it local, then reads it).")
      .def(
          "unhold",
          [](const Dataset& d, size_t s) {
            STOKER_CHECK(s < d.num_shards(), UsageError, "shard ", s, " out of range");
            if (d.releasable()) gate_of(d).leave(s);
          },
          py::arg("shard"))
      .def("reset", &Dataset::reset, py::arg("shard"),
           "Deferred shards: a failed shard is pending again; its next read demands it.")
      .def("gate_prepare", [](const Dataset& d) { return gate_of(d).prepare(); })
      .def(
          "gate_wait",
          [](const Dataset& d, uint32_t seen, double timeout) {
            gate_of(d).wait(seen, std::chrono::steady_clock::now() +
                                      std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::duration<double>(timeout)));
          },
          py::arg("seen"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
          "Sleeps until a reader demands a shard or gate_notify(), after gate_prepare() "
          "returned `seen`, at most `timeout` seconds.")
      .def("gate_notify", [](const Dataset& d) { gate_of(d).notify(); })
      .def(
          "state",
          [](const Dataset& d, size_t s) {
            STOKER_CHECK(s < d.num_shards(), UsageError, "shard ", s, " out of range");
            static const char* const kNames[] = {"pending", "demanded", "ready", "failed",
                                                 "releasing"};
            return std::string(kNames[gate_of(d).state(s)]);
          },
          py::arg("shard"),
          "Deferred shards: the state of shard `shard` (NOTE [ Deferred "
          "shards ] in csrc/format/shard_gate.h).")
      .def_property_readonly("in_memory", &Dataset::in_memory,
                             "Whether the shards were read into memory at open (preload).")
      .def_property_readonly("memory_bytes", &Dataset::memory_bytes)
      .def_property_readonly("gate_wait_seconds", &Dataset::gate_wait_seconds,
                             "Seconds readers waited for deferred shards.")
      .def("__len__", &Dataset::size)
      .def_property_readonly("num_shards", &Dataset::num_shards)
      .def("shard_path",
           [](const Dataset& d, size_t s) {
             STOKER_CHECK(s < d.num_shards(), UsageError, "shard ", s, " out of range");
             return d.shard_path(s);
           })
      .def(
          "open_shard", [](const Dataset& d, size_t s) { (void)d.pin(s); }, py::arg("shard"),
          py::call_guard<py::gil_scoped_release>(),
          "Maps and validates shard `shard` now (otherwise done on first use).")
      .def("is_mapped", &Dataset::is_mapped, py::arg("shard"))
      .def_property_readonly("mapped_shards", &Dataset::mapped_shards)
      .def("check_intact", py::overload_cast<int64_t>(&Dataset::check_intact, py::const_),
           py::arg("index"))
      .def("locate",
           [](const Dataset& d, int64_t i) {
             auto loc = d.locate(i);
             return py::make_tuple(loc.shard, loc.record);
           })
      .def(
          "read",
          [](const Dataset& d, int64_t i) {
            std::vector<RecordView> views(d.schema().fields.size());
            Dataset::ShardPin held;  // the views point into the shard until copied out
            {
              py::gil_scoped_release nogil;
              const Dataset::Location loc = d.locate(i);
              held = d.pin(loc.shard);
              d.read(loc, views.data());
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
            d.check_intact(i);  // the copies above are good only if no page vanished meanwhile
            return out;
          },
          py::arg("index"), "Verified field payloads of sample `index`.")
      .def(
          "verify_shard",
          [](const Dataset& d, size_t s) {
            // Every record: checksum and field structure. Returns (file_checksum or None,
            // [(record, reason)]), record -1 for the shard as a whole. Never stops at the first.
            std::vector<std::pair<int64_t, std::string>> bad;
            std::optional<uint32_t> file_checksum;
            {
              py::gil_scoped_release nogil;
              const std::string& path = d.shard_path(s);
              auto reason = [&](const std::exception& e) {
                std::string msg = e.what();
                if (msg.rfind(path + ": ", 0) == 0) msg.erase(0, path.size() + 2);
                return msg;
              };
              const ShardReader* r = nullptr;
              Dataset::ShardPin held;
              try {
                held = d.pin(s);
                r = &held.reader();
              } catch (const DataError& e) {
                bad.emplace_back(-1, reason(e));
              }
              if (r) {
                std::vector<RecordView> views(d.schema().fields.size());
                bool changed = false;
                for (int64_t i = 0; i < r->num_records() && !changed; ++i) {
                  try {
                    split_record(d.schema(), r->record(i), views.data());
                  } catch (const std::exception& e) {
                    // A file changed under the mapping makes every later record
                    // suspect: one report for the shard, not one per record.
                    changed = r->changed_on_disk();
                    std::string msg = reason(e);
                    const std::string prefix = "record " + std::to_string(i) + ": ";
                    if (msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
                    bad.emplace_back(
                        changed ? -1 : i,
                        changed ? "from record " + std::to_string(i) + " on: " + msg : msg);
                  }
                }
                if (!changed) {
                  file_checksum = r->file_checksum();
                  if (r->faulted())
                    bad.emplace_back(-1,
                                     "changed on disk while in use (the file was cut "
                                     "short under the reader)");
                }
              }
            }
            return py::make_tuple(file_checksum, bad);
          },
          py::arg("shard"));

  py::class_<ShardTable>(m, "ShardTable",
                         "A shard's validated record table, parsed from bytes fetched by range "
                         "(parse_shard_table).")
      .def_property_readonly("path", &ShardTable::path)
      .def_property_readonly("num_records", &ShardTable::num_records)
      .def_property_readonly("num_fields", &ShardTable::num_fields)
      .def_property_readonly("version", &ShardTable::version)
      .def_property_readonly("file_size", &ShardTable::file_size)
      .def_property_readonly("table_offset", &ShardTable::table_offset)
      .def(
          "entry",
          [](const ShardTable& t, int64_t i) {
            const format::RecordEntry& e = t.entry(i);
            return py::make_tuple(e.offset, e.length, e.sum);
          },
          py::arg("record"), "(offset, length, checksum) of record `record`.")
      .def(
          "verify",
          [](const ShardTable& t, int64_t i, const py::buffer& data) {
            py::buffer_info info = request_contiguous(data);
            py::gil_scoped_release nogil;
            verify_record_bytes(t, i, static_cast<const uint8_t*>(info.ptr),
                                static_cast<size_t>(info.size * info.itemsize));
          },
          py::arg("record"), py::arg("data"),
          "Checks record `record`'s bytes (length, checksum); DataError naming the shard and the "
          "record otherwise.");
  m.def(
      "parse_shard_table",
      [](const std::string& path, const py::buffer& head, const py::buffer& tail,
         uint64_t file_size, uint64_t schema_hash, int64_t num_records,
         const py::object& identity) {
        py::buffer_info h = request_contiguous(head), t = request_contiguous(tail);
        ShardExpectation expect{schema_hash, num_records, static_cast<int64_t>(file_size),
                                identity_from_py(identity)};
        py::gil_scoped_release nogil;
        return parse_shard_table(path, static_cast<const uint8_t*>(h.ptr),
                                 static_cast<size_t>(h.size * h.itemsize),
                                 static_cast<const uint8_t*>(t.ptr),
                                 static_cast<size_t>(t.size * t.itemsize), file_size, expect);
      },
      py::arg("path"), py::arg("head"), py::arg("tail"), py::arg("file_size"),
      py::arg("schema_hash"), py::arg("num_records") = -1, py::arg("identity") = py::none(),
      "A shard's record table from its first 64 bytes (`head`) and its last bytes (`tail`: "
      "shard_tail_bytes(num_records) of them), checked as opening the shard file checks it "
      "against index.json: `file_size` is its size there, identity as for Dataset's shards. "
      "DataError naming `path` (the shard's URL) on a mismatch.");
  m.def("shard_tail_bytes", &shard_tail_bytes, py::arg("num_records"),
        "Bytes at the end of a shard of `num_records` records that hold its table and footer.");

  py::class_<ShardWriter>(m, "ShardFileWriter")
      .def(py::init([](std::string path, uint64_t schema_hash, uint32_t num_fields,
                       const std::string& dataset_id, uint64_t ordinal) {
             return std::make_unique<ShardWriter>(std::move(path), schema_hash, num_fields,
                                                  DatasetId::from_hex(dataset_id), ordinal);
           }),
           py::arg("path"), py::arg("schema_hash"), py::arg("num_fields"), py::arg("dataset_id"),
           py::arg("ordinal"))
      .def(
          "append",
          [](ShardWriter& w, const py::buffer& record) {
            py::buffer_info info = request_contiguous(record);
            w.append(static_cast<const uint8_t*>(info.ptr),
                     static_cast<size_t>(info.size * info.itemsize));
          },
          py::arg("record"))
      .def(
          "append_shard",
          [](ShardWriter& w, const std::string& path, uint64_t schema_hash) {
            ShardReader src(path, ShardExpectation{schema_hash, -1, -1, std::nullopt});
            w.append_shard(src);
          },
          py::arg("path"), py::arg("schema_hash"), py::call_guard<py::gil_scoped_release>(),
          "Appends every record of the shard file `path` (verified, copied as they are).")
      .def_property_readonly("bytes_written", &ShardWriter::bytes_written)
      .def_property_readonly("num_records", &ShardWriter::num_records)
      .def("finish",
           [](ShardWriter& w) {
             ShardSummary s = w.finish();
             return py::make_tuple(s.num_records, s.bytes, s.checksum, s.header_sum, s.table_sum);
           })
      .def("abort", &ShardWriter::abort);
}

}  // namespace stoker::bindings
