// Bindings of csrc/pipeline: the engine and one epoch's iteration.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>

#include "bindings/dlpack.h"
#include "bindings/host_source.h"
#include "common/error.h"
#include "pipeline/loader_engine.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

ImageFieldSpec image_spec_from_py(const py::tuple& t) {
  // (layout, [(kind, [args...]), ...], max_pixels)
  ImageFieldSpec spec;
  auto layout = t[0].cast<std::string>();
  STOKER_CHECK(layout == "HWC" || layout == "CHW", UsageError, "image layout must be 'HWC' or "
               "'CHW', got '", layout, "'");
  spec.layout = layout == "CHW" ? ImageLayout::kCHW : ImageLayout::kHWC;
  for (const auto& op : t[1].cast<py::list>()) {
    auto o = op.cast<py::tuple>();
    spec.ops.push_back(OpSpec{o[0].cast<std::string>(), o[1].cast<std::vector<double>>()});
  }
  spec.max_pixels = t[2].cast<int64_t>();
  return spec;
}

// Waits for the next batch in short slices so Ctrl-C reaches Python promptly.
bool next_batch(Iteration& it, HostBatch& out) {
  using namespace std::chrono_literals;
  for (;;) {
    Iteration::Status s;
    {
      py::gil_scoped_release nogil;
      s = it.next(out, 50ms);
    }
    if (s == Iteration::Status::kBatch) return true;
    if (s == Iteration::Status::kEnd) return false;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

}  // namespace

std::function<std::optional<HostBatch>()> host_source(const py::object& iteration) {
  auto it = iteration.cast<std::shared_ptr<Iteration>>();
  return [it]() -> std::optional<HostBatch> {
    HostBatch b;
    for (;;) {
      switch (it->next(b, std::chrono::milliseconds(100))) {
        case Iteration::Status::kBatch:
          return b;
        case Iteration::Status::kEnd:
          return std::nullopt;
        case Iteration::Status::kTimeout:
          break;  // next() throws once the iteration is stopped
      }
    }
  };
}

void register_loader(py::module_& m) {
  py::class_<HostAllocatorHandle>(m, "HostAllocatorHandle")
      .def_property_readonly("pinned", [](const HostAllocatorHandle& h) {
        return h.alloc && h.alloc->pinned();
      });

  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine")
      .def(py::init([](std::shared_ptr<Dataset> ds, int64_t batch_size, bool shuffle,
                       uint64_t seed, bool drop_last, int64_t rank, int64_t world_size,
                       int num_threads, int prefetch, bool skip_errors, const py::dict& images,
                       const HostAllocatorHandle* allocator) {
             EngineOptions o;
             o.sampler = SamplerOptions{batch_size, shuffle, seed, drop_last, rank, world_size};
             o.num_threads = num_threads;
             o.prefetch = prefetch;
             o.skip_errors = skip_errors;
             for (const auto& [name, spec] : images)
               o.images[name.cast<std::string>()] = image_spec_from_py(spec.cast<py::tuple>());
             if (allocator) o.allocator = allocator->alloc;
             return Engine::create(std::move(ds), std::move(o));
           }),
           py::arg("dataset"), py::arg("batch_size"), py::arg("shuffle"), py::arg("seed"),
           py::arg("drop_last"), py::arg("rank"), py::arg("world_size"), py::arg("num_threads"),
           py::arg("prefetch"), py::arg("skip_errors") = false, py::arg("images") = py::dict(),
           py::arg("allocator") = nullptr)
      .def_property_readonly("num_batches", &Engine::num_batches)
      .def_property_readonly("num_samples",
                             [](const Engine& e) { return e.sampler().num_samples(); })
      .def(
          "start",
          [](Engine& e, uint64_t epoch, int64_t first_batch, int held) {
            return std::shared_ptr<Iteration>(e.start(epoch, first_batch, held));
          },
          py::arg("epoch"), py::arg("first_batch") = 0, py::arg("held") = 0,
          "held: batches of the prefetch window held back until Iteration.release_held().")
      .def("stats", [](Engine& e) {
        EngineStats& s = e.stats();
        py::dict d;
        d["batches"] = s.batches.load();
        d["samples"] = s.samples.load();
        d["bytes_read"] = s.bytes_read.load();
        d["skipped"] = s.skipped.load();
        d["read_seconds"] = s.read_ns.load() * 1e-9;
        d["decode_seconds"] = s.decode_ns.load() * 1e-9;
        d["prepare_seconds"] = s.prepare_ns.load() * 1e-9;
        d["wait_seconds"] = s.wait_ns.load() * 1e-9;
        d["worker_idle_seconds"] = s.worker_idle_ns.load() * 1e-9;
        d["slots"] = e.pool().slots_allocated();
        d["slot_bytes"] = e.pool().bytes_allocated();
        return d;
      });

  py::class_<Iteration, std::shared_ptr<Iteration>>(m, "Iteration")
      .def(
          "next",
          [](Iteration& it) -> py::object {
            HostBatch b;
            if (!next_batch(it, b)) return py::none();
            return batch_to_capsules(b.memory, b.tensors, kDLCPU, 0);
          },
          "The next batch as [(name, dltensor capsule)], or None at the end of the epoch.")
      .def("stop", &Iteration::stop, py::call_guard<py::gil_scoped_release>())
      .def("release_held", &Iteration::release_held, py::arg("n"),
           "Gives back n batches of the window held at Engine.start().")
      .def_property_readonly("held", &Iteration::held)
      .def_property_readonly("epoch", &Iteration::epoch)
      .def_property_readonly("position", &Iteration::position)
      .def_property_readonly("end", &Iteration::end)
      .def_property_readonly("ready_batches", &Iteration::ready_batches)
      .def_property_readonly("live_workers", &Iteration::live_workers);
}

}  // namespace stoker::bindings
