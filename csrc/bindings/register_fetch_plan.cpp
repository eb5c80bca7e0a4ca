// Bindings of sampler/fetch_plan.h: what a remote dataset's fetcher asks each turn.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "pipeline/loader_core.h"
#include "producers/mix_record_producer.h"
#include "producers/record_producer.h"
#include "sampler/fetch_plan.h"
#include "stage/python_producer.h"

namespace py = pybind11;

namespace stoker::bindings {
namespace {

// A loader's producer: RecordProducer, or PythonProducer over a stoker dataset
// (both say which shards an epoch reads, in order).
template <class Producer>
void follow(FetchPlan& p, const std::shared_ptr<LoaderCore>& core,
            const std::shared_ptr<Producer>& producer, int64_t world_size) {
  // Held weakly: a dropped loader stops being followed at the next turn.
  std::weak_ptr<LoaderCore> weak = core;
  FetchPlan::Follower f;
  f.position = [weak]() -> std::optional<ReadPosition> {
    std::shared_ptr<LoaderCore> c = weak.lock();
    if (!c) return std::nullopt;
    const LoaderState st = c->state();
    return ReadPosition{st.epoch, st.offset, st.world_size};
  };
  f.order = [producer](uint64_t epoch, int64_t world) {
    EpochKey key;
    key.epoch = epoch;
    key.world_size = world;  // rank 0: the schedule is the whole job's
    return producer->epoch_order(key);
  };
  f.world_size = world_size;
  p.follow(reinterpret_cast<uintptr_t>(core.get()), std::move(f));
}

// Source `source` of a record mixture: its stream of passes, followed as a
// plain one-rank reader of that source (MixRecordProducer::source_position).
void follow_source(FetchPlan& p, const std::shared_ptr<LoaderCore>& core,
                   const std::shared_ptr<MixRecordProducer>& producer, size_t source) {
  producer->source_order(source, 0);  // checks `source`
  std::weak_ptr<LoaderCore> weak = core;
  FetchPlan::Follower f;
  f.position = [weak, producer, source]() -> std::optional<ReadPosition> {
    std::shared_ptr<LoaderCore> c = weak.lock();
    if (!c) return std::nullopt;
    const LoaderState st = c->state();
    return producer->source_position(source, st.epoch, st.offset);
  };
  f.order = [producer, source](uint64_t pass, int64_t) {
    return producer->source_order(source, pass);
  };
  f.world_size = 1;
  p.follow(reinterpret_cast<uintptr_t>(core.get()), std::move(f));
}

}  // namespace

void register_fetch_plan(py::module_& m) {
  py::class_<FetchPlan, std::shared_ptr<FetchPlan>>(
      m, "FetchPlan", "NOTE [ Fetch plan ] in csrc/sampler/fetch_plan.h.")
      .def(py::init<std::shared_ptr<Dataset>, std::vector<int64_t>>(), py::arg("dataset"),
           py::arg("shard_bytes"))
      .def("follow", &follow<RecordProducer>, py::arg("core"), py::arg("producer"),
           py::arg("world_size"),
           "Follows a loader (its core and record producer) for as long as it lives.")
      .def("follow", &follow<PythonProducer>, py::arg("core"), py::arg("producer"),
           py::arg("world_size"),
           "Follows a loader whose samples go through the Python stage (map=, collate_fn=).")
      .def("follow", &follow_source, py::arg("core"), py::arg("producer"), py::arg("source"),
           "Follows source `source` of a loader over a record mixture (stoker.Mix).")
      .def_property_readonly("followers", &FetchPlan::followers)
      .def(
          "turn",
          [](FetchPlan& p, int64_t budget, std::vector<size_t> holds, std::vector<size_t> inflight,
             size_t max_fetch) {
            FetchPlan::Options o;
            o.budget = budget;
            o.holds = std::move(holds);
            o.inflight = std::move(inflight);
            o.max_fetch = max_fetch;
            FetchPlan::Turn t;
            {
              py::gil_scoped_release nogil;
              t = p.turn(o);
            }
            py::dict d;
            d["fetch"] = t.fetch;
            d["urgent"] = t.urgent;
            d["released"] = t.released;
            d["must_bytes"] = t.must_bytes;
            d["wanted_bytes"] = t.wanted_bytes;
            d["held_bytes"] = t.held_bytes;
            d["following"] = t.following;
            return d;
          },
          py::arg("budget"), py::arg("holds"), py::arg("inflight"), py::arg("max_fetch"),
          "One turn: {fetch, urgent, released, must_bytes, wanted_bytes, held_bytes, "
          "following}; budget < 0: none.");
}

}  // namespace stoker::bindings
