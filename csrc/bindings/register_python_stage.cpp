// Bindings of the Python stage (NOTE [ Python stage ] in
// python/stoker/_stage/__init__.py): its producer, the hand-off its threads take
// chunks from, and the fetch of one stoker sample by the C++ path. Every wait
// and every read or decode runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <pthread.h>

#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/dlpack.h"
#include "common/error.h"
#include "pipeline/loader_core.h"
#include "pipeline/shared_memory.h"
#include "stage/iterable_producer.h"
#include "stage/python_handoff.h"
#include "stage/python_producer.h"
#include "stage/sample_fetcher.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

using Clock = std::chrono::steady_clock;

// A NumPy array over `bytes` of memory that `owner` keeps alive.
template <typename T>
py::array owned_array(const std::shared_ptr<T>& owner, void* data, py::dtype dtype,
                      std::vector<py::ssize_t> shape, bool writable) {
  auto* keep = new std::shared_ptr<T>(owner);
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<T>*>(p); });
  py::array a(std::move(dtype), std::move(shape), data, base);
  if (!writable) a.attr("setflags")(py::arg("write") = false);
  return a;
}

std::vector<TensorDesc> tensors_from_py(const py::list& specs) {
  std::vector<TensorDesc> out;
  out.reserve(specs.size());
  for (const py::handle& h : specs) {
    auto [name, dtype, shape, offset, nbytes] =
        h.cast<std::tuple<std::string, std::string, std::vector<int64_t>, size_t, size_t>>();
    out.push_back(
        TensorDesc{std::move(name), dtype_from_name(dtype), std::move(shape), offset, nbytes});
  }
  return out;
}

SamplerOptions sampler_options(int64_t batch_size, bool shuffle, uint64_t seed, bool drop_last,
                               bool even_batches, int64_t shard_window,
                               std::shared_ptr<ListedOrders> listed) {
  return SamplerOptions{batch_size,   shuffle,          seed, drop_last, even_batches,
                        shard_window, std::move(listed)};
}

}  // namespace

void register_python_stage(py::module_& m) {
  m.def(
      "set_thread_name",
      [](const std::string& name) {
        // The kernel's limit is 15 characters; what top, py-spy and gdb show.
        pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      },
      py::arg("name"), "Names the calling OS thread (the Python stage's threads by role).");
  // NOTE [ Shared batch memory ] in pipeline/shared_memory.h
  m.def("shared_memory", &shared_allocator,
        "Batch slots in shared memory, which Python worker processes write into.");
  m.def(
      "shared_block",
      [](uintptr_t address) -> py::object {
        std::optional<SharedBlock> b = find_shared_block(reinterpret_cast<const void*>(address));
        if (!b) return py::none();
        return py::make_tuple(b->fd, b->id, b->offset, b->size);
      },
      py::arg("address"),
      "(fd, id, offset, size) of the shared block `address` lies in, or None. The "
      "descriptor stays the block's: valid while the block lives.");
  m.def("dead_shared_blocks", &dead_shared_blocks, py::arg("ids"),
        "Those of `ids` that name no live shared block.");
  m.def("forget_shared_blocks_after_fork", &forget_shared_blocks_after_fork,
        "In the loader's worker process just forked: the shared blocks it inherited are "
        "unmapped and their descriptors closed.");
  m.def("mark_shared_blocks_forked", &mark_shared_blocks_forked,
        "In the parent of a fork whose child keeps its mappings: every live shared block "
        "is freed when given back, never reused (the child's batches stay as they were).");
  // A failed batch of the stage: the consumer raises the Python exception the
  // stage keeps under `ticket` (stoker/_stage/stage.py). Registered after the
  // module's translator of stoker::Error, so it is tried first.
  static py::handle stage_error =
      py::exception<PythonStageError>(m, "PythonStageError", PyExc_RuntimeError).release();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const PythonStageError& e) {
      py::object exc = py::reinterpret_borrow<py::object>(stage_error)(e.what());
      exc.attr("ticket") = e.ticket();
      PyErr_SetObject(stage_error.ptr(), exc.ptr());
    }
  });

  py::class_<PythonProducer, BatchProducer, std::shared_ptr<PythonProducer>>(
      m, "PythonProducer",
      "Batches of sample indices for the Python stage: the loader's sampler over a map-style "
      "dataset or a stoker dataset.")
      .def(py::init([](int64_t n, int64_t batch_size, bool shuffle, uint64_t seed, bool drop_last,
                       bool even_batches, std::shared_ptr<ListedOrders> listed) {
             return std::make_shared<PythonProducer>(
                 n, sampler_options(batch_size, shuffle, seed, drop_last, even_batches, 0,
                                    std::move(listed)));
           }),
           py::arg("num_samples"), py::arg("batch_size"), py::arg("shuffle"), py::arg("seed"),
           py::arg("drop_last"), py::arg("even_batches"), py::arg("listed") = nullptr)
      .def(py::init([](std::shared_ptr<Dataset> ds, int64_t batch_size, bool shuffle, uint64_t seed,
                       bool drop_last, bool even_batches, int64_t shard_window,
                       std::shared_ptr<ListedOrders> listed) {
             return std::make_shared<PythonProducer>(
                 std::move(ds), sampler_options(batch_size, shuffle, seed, drop_last, even_batches,
                                                shard_window, std::move(listed)));
           }),
           py::arg("dataset"), py::arg("batch_size"), py::arg("shuffle"), py::arg("seed"),
           py::arg("drop_last"), py::arg("even_batches"), py::arg("shard_window"),
           py::arg("listed") = nullptr)
      .def("shard_schedule", &PythonProducer::shard_schedule, py::arg("epoch"),
           py::arg("world_size"), py::arg("position"), py::arg("max_shards"));

  py::class_<IterableProducer, BatchProducer, std::shared_ptr<IterableProducer>>(
      m, "IterableProducer",
      "Batches of rows of a source read in order, whose epoch ends where the source does "
      "(an IterableDataset: csrc/stage/iterable_producer.h).")
      .def(py::init<int64_t>(), py::arg("batch_size"));
  m.attr("UNKNOWN_BATCHES") = kUnknownBatches;

  py::class_<PythonTask, std::shared_ptr<PythonTask>>(
      m, "PythonTask", "A batch handed to the Python stage (stage/python_handoff.h).")
      .def_readonly("id", &PythonTask::id)
      .def_readonly("epoch", &PythonTask::epoch)
      .def_readonly("rank", &PythonTask::rank)
      .def_readonly("world_size", &PythonTask::world_size)
      .def_readonly("stream", &PythonTask::stream,
                    "The stream the batch belongs to (one per iterator running an epoch).")
      .def_readonly("offset", &PythonTask::offset,
                    "Global samples of the epoch consumed before the batch's segment.")
      .def_readonly("batch", &PythonTask::number)
      .def_property_readonly("samples", &PythonTask::samples)
      .def_property_readonly(
          "indices",
          [](const std::shared_ptr<PythonTask>& t) {
            return owned_array(t, t->indices.data(), py::dtype::of<int64_t>(),
                               {static_cast<py::ssize_t>(t->indices.size())}, false);
          },
          "Dataset index of each sample (read-only int64 array).")
      .def_property_readonly(
          "tensors",
          [](const PythonTask& t) {
            // A record batch's tensors (batch_map over the C++ batch), as capsules.
            return batch_to_capsules(t.memory, t.tensors, kDLCPU, 0);
          },
          "[(name, dltensor capsule)] of what the C++ units wrote; [] for index batches.")
      .def_readonly("nbytes", &PythonTask::bytes)
      .def_property_readonly("stopped", &PythonTask::stopped,
                             "Nobody will read the batch: its stream stopped.")
      .def("chunk_done", &PythonTask::chunk_done,
           "Marks a chunk done; True for the batch's last (its thread completes the batch).")
      .def(
          "add_times",
          [](PythonTask& t, int64_t python_ns, int64_t cpu_ns, int64_t read_ns, int64_t decode_ns,
             int64_t ops_ns, int64_t bytes, int64_t wait_ns) {
            t.add_times(PythonTimes{python_ns, cpu_ns, read_ns, decode_ns, ops_ns, bytes, wait_ns});
          },
          py::arg("python_ns"), py::arg("cpu_ns"), py::arg("read_ns"), py::arg("decode_ns"),
          py::arg("ops_ns"), py::arg("bytes"), py::arg("wait_ns") = 0)
      .def(
          "allocate",
          [](PythonTask& t, size_t nbytes) {
            std::shared_ptr<uint8_t> mem;
            {
              py::gil_scoped_release nogil;
              mem = t.allocate(nbytes);
            }
            return owned_array(mem, mem.get(), py::dtype::of<uint8_t>(),
                               {static_cast<py::ssize_t>(nbytes)}, true);
          },
          py::arg("nbytes"),
          "A writable uint8 array of `nbytes` from the loader's batch memory; the batch's "
          "tensors are laid out in it.")
      .def(
          "complete",
          [](PythonTask& t, const py::list& tensors, size_t nbytes, uint64_t ticket,
             int64_t skipped) {
            std::vector<TensorDesc> descs = tensors_from_py(tensors);
            py::gil_scoped_release nogil;
            t.complete(std::move(descs), nbytes, ticket, skipped);
          },
          py::arg("tensors"), py::arg("nbytes"), py::arg("ticket"), py::arg("skipped"),
          "Publishes the batch: tensors as [(name, dtype, shape, offset, nbytes)] in the "
          "memory allocate() gave.")
      .def(
          "keep",
          [](PythonTask& t, uint64_t ticket) {
            py::gil_scoped_release nogil;
            t.keep(ticket);
          },
          py::arg("ticket"), "Publishes a C++-assembled batch as it is, with `ticket`.")
      .def(
          "fail",
          [](PythonTask& t, uint64_t ticket, const std::string& message) {
            py::gil_scoped_release nogil;
            t.fail(ticket, message);
          },
          py::arg("ticket"), py::arg("message"))
      .def(
          "end",
          [](PythonTask& t) {
            py::gil_scoped_release nogil;
            t.end();
          },
          "Ends an open-ended epoch before this batch: the source had no row left for it "
          "(NOTE [ Open-ended epochs ] in csrc/pipeline/batch_producer.h).")
      .def("set_samples", &PythonTask::set_samples, py::arg("samples"),
           "The batch holds fewer samples than planned (an open-ended epoch's last).");

  py::class_<PythonHandoff, BatchFinisher, std::shared_ptr<PythonHandoff>>(
      m, "PythonHandoff", "Where the Python stage's threads take chunks of batches.")
      .def(py::init([](int64_t chunk_samples, int64_t batch_size) {
             return std::make_shared<PythonHandoff>(chunk_samples, batch_size);
           }),
           py::arg("chunk_samples"), py::arg("batch_size"))
      .def(
          "bind",
          [](PythonHandoff& h, const LoaderCore& core) { h.set_stats(core.stats_handle()); },
          py::arg("core"), "Counts the stage's time in this loader core's stats.")
      .def(
          "take",
          [](PythonHandoff& h, int64_t timeout_ms) -> py::object {
            PythonHandoff::Chunk c;
            bool got;
            {
              py::gil_scoped_release nogil;
              got = h.take(c, Clock::now() + std::chrono::milliseconds(timeout_ms));
            }
            if (!got) return py::none();
            return py::make_tuple(std::move(c.task), c.lo, c.hi);
          },
          py::arg("timeout_ms"),
          "(task, lo, hi): samples [lo, hi) of the oldest batch waiting, or None after "
          "timeout_ms or once closed.")
      .def("close", &PythonHandoff::close, py::call_guard<py::gil_scoped_release>())
      .def("drop_stopped", &PythonHandoff::drop_stopped, py::call_guard<py::gil_scoped_release>(),
           "Drops the batches waiting whose stream stopped; how many.")
      .def_property_readonly("waiting", &PythonHandoff::waiting)
      .def_property_readonly("chunk_samples", &PythonHandoff::chunk_samples)
      .def("set_chunk_samples", &PythonHandoff::set_chunk_samples, py::arg("n"),
           "Samples per chunk of the batches handed off from now on.");

  py::class_<SampleFetcher, std::shared_ptr<SampleFetcher>>(
      m, "SampleFetcher",
      "One sample of a stoker dataset as a loader worker reads it: verified, images decoded "
      "and transformed with the loader's draws.")
      .def(py::init([](std::shared_ptr<Dataset> ds, const RecordOptions& options) {
             return std::make_shared<SampleFetcher>(std::move(ds), options);
           }),
           py::arg("dataset"), py::arg("options"),
           "options: the RecordOptions the loader's C++ batches would have (images, "
           "transforms, the sampler's seed).")
      .def(
          "fetch",
          [](const SampleFetcher& f, int64_t index, uint64_t epoch) {
            using Kind = SampleFetcher::FieldOut::Kind;
            PythonTimes times;
            SampleFetcher::Sample s;
            {
              py::gil_scoped_release nogil;
              f.read(index, s, times);
            }
            py::list values;
            std::vector<void*> dst;
            for (const SampleFetcher::FieldOut& o : f.outputs(s)) {
              if (o.kind == Kind::kBytes) {
                values.append(py::bytes(reinterpret_cast<const char*>(o.data), o.size));
                dst.push_back(nullptr);
              } else {
                py::array a(py::dtype(dtype_name(o.dtype)),
                            std::vector<py::ssize_t>(o.shape.begin(), o.shape.end()));
                dst.push_back(a.mutable_data());
                values.append(a);
              }
            }
            std::vector<int64_t> left;
            {
              py::gil_scoped_release nogil;
              left = f.write(s, dst, epoch, times);
            }
            for (size_t i = 0; i < left.size(); ++i)
              if (left[i] >= 0) values[i] = values[i].attr("__getitem__")(py::slice(0, left[i], 1));
            return py::make_tuple(values, times.read_ns, times.decode_ns, times.ops_ns,
                                  times.bytes);
          },
          py::arg("index"), py::arg("epoch"),
          "([value per field], read_ns, decode_ns, ops_ns, bytes): images as decoded arrays "
          "(a transform group's masks (h, w, 1)), blobs as bytes, other fields as flat writable "
          "arrays of their dtype (a group's boxes, keypoints and rows without the rows of the "
          "boxes it dropped).");
}

}  // namespace stoker::bindings
