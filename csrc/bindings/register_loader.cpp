// Bindings of csrc/pipeline: the record producer, the loader core and its
// iterators. No logic here beyond converting arguments and waiting with the
// GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <vector>

#include "bindings/dlpack.h"
#include "common/error.h"
#include "pipeline/loader_core.h"
#include "pipeline/placeholder_producer.h"
#include "pipeline/window.h"
#include "producers/record_producer.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

using Clock = std::chrono::steady_clock;

// Waits in slices so that Ctrl-C (and any Python signal handler) runs within
// a slice while the iterating thread is blocked.
constexpr auto kSignalSlice = std::chrono::milliseconds(20);

// The core's log lines, to the "stoker" logger (NOTE [ Slow first batch ]).
void emit_messages(LoaderCore& core) {
  if (!core.has_messages()) return;
  std::vector<LogMessage> msgs = core.take_messages();
  if (msgs.empty()) return;
  py::object logger = py::module_::import("logging").attr("getLogger")("stoker");
  for (const LogMessage& m : msgs) logger.attr("log")(m.level, "%s", m.text);
}

py::object next_batch(LoaderCore::Iterator& it, uintptr_t consumer_stream, bool with_ticket,
                      uintptr_t side_stream, int64_t timeout_ms) {
  DeliveredBatch b;
  Clock::time_point got;  // the batch in hand: from here on, counted with the wait
  const auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                       : Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    LoaderCore::Iterator::Status s;
    {
      py::gil_scoped_release nogil;
      s = it.next(b, std::min(deadline, Clock::now() + kSignalSlice), consumer_stream, side_stream);
      got = Clock::now();
    }
    emit_messages(it.core());
    if (s == LoaderCore::Iterator::Status::kBatch) break;
    if (s == LoaderCore::Iterator::Status::kEnd) return py::none();
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (got >= deadline) return py::bool_(false);  // not yet: the caller decides
  }
  const bool host = b.device < 0;
  py::list caps =
      batch_to_capsules(b.memory, b.tensors, host ? kDLCPU : kDLCUDA, host ? 0 : b.device);
  it.note_handoff(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - got).count());
  if (with_ticket) return py::make_tuple(caps, b.ticket);
  return caps;
}

// A segment's key as Python sees it: (epoch, rank, world_size, offset, pad_from).
py::tuple key_tuple(const EpochKey& k) {
  return py::make_tuple(k.epoch, k.rank, k.world_size, k.offset, k.pad_from);
}

EpochKey epoch_key(const py::tuple& t) {
  STOKER_CHECK(t.size() == 5, UsageError,
               "a segment key is (epoch, rank, world_size, offset, pad_from), got ", t.size(),
               " values");
  return EpochKey{t[0].cast<uint64_t>(), t[1].cast<int64_t>(), t[2].cast<int64_t>(),
                  t[3].cast<int64_t>(), t[4].cast<int64_t>()};
}

py::dict stats_dict(const LoaderStatsSnapshot& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["bytes_read"] = s.bytes_read;
  d["skipped"] = s.skipped;
  d["source_counts"] = s.sources;  // a mixture's (stoker/mix.py shapes them)
  d["read_seconds"] = s.read_seconds;
  d["decode_seconds"] = s.decode_seconds;
  d["ops_seconds"] = s.ops_seconds;
  d["plan_seconds"] = s.plan_seconds;
  d["python_seconds"] = s.python_seconds;
  d["python_cpu_seconds"] = s.python_cpu_seconds;
  d["python_wait_seconds"] = s.python_wait_seconds;
  d["worker_busy_seconds"] = s.worker_busy_seconds;
  d["worker_idle_seconds"] = s.worker_idle_seconds;
  d["wait_seconds"] = s.wait_seconds;
  d["run_seconds"] = s.run_seconds;
  d["first_batch_seconds"] = s.first_batch_seconds < 0
                                 ? py::object(py::none())
                                 : py::object(py::float_(s.first_batch_seconds));
  d["warmup_seconds"] =
      s.warmup_seconds < 0 ? py::object(py::none()) : py::object(py::float_(s.warmup_seconds));
  d["copies"] = s.copies;
  d["copy_bytes"] = s.copy_bytes;
  d["copy_seconds"] = s.copy_seconds;
  d["num_threads"] = s.num_threads;
  d["prefetch"] = s.prefetch;
  d["live_workers"] = s.live_workers;
  d["queue_depth"] = s.queue_depth;
  d["streams"] = s.streams;
  d["host_blocks"] = s.host_blocks;
  d["host_bytes"] = s.host_bytes;
  d["device_buffers"] = s.device_buffers;
  d["device_bytes"] = s.device_bytes;
  d["max_threads"] = s.max_threads;
  d["auto_threads"] = s.auto_threads;
  d["auto_prefetch"] = s.auto_prefetch;
  d["settled"] = s.settled;
  d["max_memory"] = s.max_memory;
  d["batch_bytes"] = s.batch_bytes;
  d["queue_depth_hist"] = s.depth_hist;
  d["queue_depth_mean"] = s.depth_mean;
  d["bottleneck"] = s.bottleneck;
  d["bottleneck_stage"] =
      s.bottleneck_stage.empty() ? py::object(py::none()) : py::object(py::str(s.bottleneck_stage));
  d["verdict"] = s.verdict;
  d["samples_per_second"] = s.samples_per_second;
  d["data_stall"] = s.data_stall;
  d["copy_gbps"] = s.copy_gbps;
  const StageSecondsPerBatch& per = s.stage_seconds_per_batch;
  py::dict stages;
  stages["read"] = per.read;
  stages["decode"] = per.decode;
  stages["ops"] = per.ops;
  stages["plan"] = per.plan;
  stages["python"] = per.python;
  stages["copy"] = per.copy;
  d["stage_seconds_per_batch"] = stages;
  return d;
}

}  // namespace

void register_loader(py::module_& m) {
  py::class_<BatchProducer, std::shared_ptr<BatchProducer>>(
      m, "BatchProducer", "What goes into batches (records of a dataset, token windows...).")
      .def("num_batches", &BatchProducer::num_batches, py::arg("rank"), py::arg("world_size"))
      .def("epoch_samples", &BatchProducer::epoch_samples)
      .def("rank_samples", &BatchProducer::rank_samples, py::arg("rank"), py::arg("world_size"))
      .def(
          "consumed_after",
          [](const BatchProducer& p, uint64_t epoch, int64_t rank, int64_t world, int64_t offset,
             int64_t batches) {
            return p.consumed_after(EpochKey{epoch, rank, world, offset, 0}, batches);
          },
          py::arg("epoch"), py::arg("rank"), py::arg("world_size"), py::arg("offset"),
          py::arg("batches"),
          "Global samples consumed once every rank has taken `batches` batches of that epoch.");

  py::class_<PlaceholderProducer, BatchProducer, std::shared_ptr<PlaceholderProducer>>(
      m, "PlaceholderProducer",
      "A producer's epochs and counts with empty batches: a loader whose batches are made "
      "elsewhere (NOTE [ Placeholder batches ] in pipeline/placeholder_producer.h).")
      .def(py::init([](std::shared_ptr<BatchProducer> inner) {
             return std::make_shared<PlaceholderProducer>(std::move(inner));
           }),
           py::arg("inner"));

  py::class_<ListedOrders, std::shared_ptr<ListedOrders>>(
      m, "ListedOrders", "Per epoch, the order a user's sampler gives (sampler/listed_order.h).")
      .def(py::init<bool>(), py::arg("permutations") = false,
           "permutations: each epoch is a permutation of the dataset (set_permutation), "
           "batched and split by rank as the loader's own order")
      .def(
          "set",
          [](ListedOrders& o, uint64_t epoch,
             py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices,
             py::array_t<int64_t, py::array::c_style | py::array::forcecast> ends,
             int64_t num_records) {
            std::vector<int64_t> idx(indices.data(), indices.data() + indices.size());
            std::vector<int64_t> end(ends.data(), ends.data() + ends.size());
            py::gil_scoped_release release;
            o.set(epoch, std::move(idx), std::move(end), num_records);
          },
          py::arg("epoch"), py::arg("indices"), py::arg("ends"), py::arg("num_records"))
      .def(
          "set_permutation",
          [](ListedOrders& o, uint64_t epoch,
             py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices,
             int64_t num_records) {
            std::vector<int64_t> idx(indices.data(), indices.data() + indices.size());
            py::gil_scoped_release release;
            o.set_permutation(epoch, std::move(idx), num_records);
          },
          py::arg("epoch"), py::arg("indices"), py::arg("num_records"))
      .def_property_readonly("permutations", &ListedOrders::permutations)
      .def("set_hint", &ListedOrders::set_hint, py::arg("batches"), py::arg("samples"))
      .def_property_readonly("num_batches", &ListedOrders::num_batches)
      .def_property_readonly("num_samples", &ListedOrders::num_samples);

  py::class_<SamplerOptions>(m, "SamplerOptions", "Which samples go into which batch.")
      .def(py::init([](int64_t batch_size, bool shuffle, uint64_t seed, bool drop_last,
                       bool even_batches, int64_t shard_window,
                       std::shared_ptr<ListedOrders> listed) {
             return SamplerOptions{batch_size,   shuffle,      seed,  drop_last,
                                   even_batches, shard_window, listed};
           }),
           py::kw_only(), py::arg("batch_size"), py::arg("shuffle") = false, py::arg("seed") = 0,
           py::arg("drop_last") = false, py::arg("even_batches") = true,
           py::arg("shard_window") = 0, py::arg("listed") = nullptr,
           "shard_window: shards per window of the shard-window shuffle, 0 = a global shuffle; "
           "listed: a user sampler's orders (replacing shuffle and the rank split).")
      .def_readonly("batch_size", &SamplerOptions::batch_size)
      .def_readonly("shuffle", &SamplerOptions::shuffle)
      .def_readonly("seed", &SamplerOptions::seed)
      .def_readonly("drop_last", &SamplerOptions::drop_last)
      .def_readonly("even_batches", &SamplerOptions::even_batches)
      .def_readonly("shard_window", &SamplerOptions::shard_window);

  m.def(
      "epoch_batches",
      [](std::vector<int64_t> shard_records, const SamplerOptions& options, uint64_t epoch,
         int64_t rank, int64_t world_size) {
        std::vector<int64_t> indices, ends;
        {
          py::gil_scoped_release release;
          EpochOrder order(shard_records, options, epoch, rank, world_size, 0);
          indices.resize(static_cast<size_t>(order.num_samples()));
          ends.reserve(static_cast<size_t>(order.num_batches()));
          int64_t at = 0;
          for (int64_t k = 0; k < order.num_batches(); ++k) {
            order.batch_indices(k, indices.data() + at);
            at += order.batch_length(k);
            ends.push_back(at);
          }
          indices.resize(static_cast<size_t>(at));
        }
        return py::make_tuple(py::array_t<int64_t>(indices.size(), indices.data()),
                              py::array_t<int64_t>(ends.size(), ends.data()));
      },
      py::arg("shard_records"), py::arg("options"), py::arg("epoch"), py::arg("rank"),
      py::arg("world_size"),
      "(indices, ends): rank `rank`'s whole epoch in the loader's own order (sampler.h), "
      "batch k being indices[ends[k-1]:ends[k]]: what loader.sampler and "
      "loader.batch_sampler iterate.");

  py::class_<RecordOptions>(m, "RecordOptions",
                            "What batches of records hold and how to make them.")
      .def(py::init([](SamplerOptions sampler, bool skip_errors,
                       std::map<std::string, ImageFieldSpec> images,
                       std::vector<TransformSpec> transforms, int threads_hint,
                       int64_t unit_samples, bool handoff, int64_t warm_bytes,
                       const std::map<std::string, py::bytes>& pad_values,
                       std::optional<BatchMixOptions> mix, const std::string& verify,
                       std::shared_ptr<DecodedCache> cache,
                       std::map<std::string, VideoFieldSpec> videos,
                       std::map<std::string, AudioFieldSpec> audios) {
             RecordOptions o;
             STOKER_CHECK(verify == "first" || verify == "always" || verify == "once", UsageError,
                          "verify must be 'first', 'always' or 'once', got '", verify, "'");
             o.verify = verify == "first"    ? Verify::kFirst
                        : verify == "always" ? Verify::kAlways
                                             : Verify::kOnce;
             o.cache = std::move(cache);
             o.handoff = handoff;
             o.sampler = sampler;
             o.skip_errors = skip_errors;
             o.images = std::move(images);
             o.videos = std::move(videos);
             o.audios = std::move(audios);
             o.transforms = std::move(transforms);
             for (const auto& [name, value] : pad_values) {
               const std::string v = value;
               o.pad_values[name] = std::vector<uint8_t>(v.begin(), v.end());
             }
             o.mix = std::move(mix);
             o.threads_hint = threads_hint;
             o.unit_samples = unit_samples;
             o.warm_bytes = warm_bytes;
             return o;
           }),
           py::kw_only(), py::arg("sampler"), py::arg("skip_errors") = false,
           py::arg("images") = std::map<std::string, ImageFieldSpec>{},
           py::arg("transforms") = std::vector<TransformSpec>{}, py::arg("threads_hint") = 1,
           py::arg("unit_samples") = 0, py::arg("handoff") = false, py::arg("warm_bytes") = -1,
           py::arg("pad_values") = std::map<std::string, py::bytes>{}, py::arg("mix") = py::none(),
           py::arg("verify") = "first", py::arg("cache") = py::none(),
           py::arg("videos") = std::map<std::string, VideoFieldSpec>{},
           py::arg("audios") = std::map<std::string, AudioFieldSpec>{},
           "images: {field: ImageFieldSpec}; transforms: [TransformSpec]; threads_hint sizes the "
           "units of work (unit_samples: samples per unit, 0 = from it); handoff: each batch "
           "goes to the loader's finisher (batch_map in the Python stage); warm_bytes: shards "
           "the first epoch reads mapped and faulted in ahead (-1: an eighth of the memory, 0: "
           "none); pad_values: {field: one element's bytes}; mix: BatchMixOptions "
           "(batch_transforms); verify: 'first' (a record's checksum on its first read in this "
           "process, again after its file changed; every read of a version-1 shard), 'always', "
           "or 'once' ('first' for version-1 shards too); cache: a DecodedCache for the image "
           "fields; videos: {field: VideoFieldSpec}; audios: {field: AudioFieldSpec}.")
      .def_readonly("sampler", &RecordOptions::sampler)
      .def_readonly("skip_errors", &RecordOptions::skip_errors)
      .def_readonly("images", &RecordOptions::images)
      .def_readonly("transforms", &RecordOptions::transforms)
      .def_readonly("threads_hint", &RecordOptions::threads_hint)
      .def_readonly("unit_samples", &RecordOptions::unit_samples)
      .def_readonly("handoff", &RecordOptions::handoff)
      .def_readonly("warm_bytes", &RecordOptions::warm_bytes)
      .def_property_readonly("verify",
                             [](const RecordOptions& o) {
                               return o.verify == Verify::kAlways ? "always"
                                      : o.verify == Verify::kOnce ? "once"
                                                                  : "first";
                             })
      .def_readonly("cache", &RecordOptions::cache);

  py::class_<RecordProducer, BatchProducer, std::shared_ptr<RecordProducer>>(m, "RecordProducer")
      .def(py::init([](std::shared_ptr<Dataset> ds, const RecordOptions& options) {
             return std::make_shared<RecordProducer>(std::move(ds), options);
           }),
           py::arg("dataset"), py::arg("options"))
      .def_property_readonly(
          "warmed",
          [](const RecordProducer& p) {
            const MappingWarmer& w = p.warmer();
            return py::make_tuple(w.done(), w.shards(), w.bytes());
          },
          "NOTE [ Warm mappings ]: (finished, shards, bytes) mapped and faulted in ahead.")
      .def("shard_schedule", &RecordProducer::shard_schedule, py::arg("epoch"),
           py::arg("world_size"), py::arg("position"), py::arg("max_shards"),
           "The shards the whole job reads in `epoch` from global `position` on, in order.");

  py::class_<BlockAllocator, std::shared_ptr<BlockAllocator>>(
      m, "HostMemory", "Where batch slots come from (pageable or page-locked).")
      .def_property_readonly(
          "pinned", [](const BlockAllocator& a) { return a.kind() == MemoryKind::kPinned; });
  py::class_<Delivery, std::shared_ptr<Delivery>>(
      m, "Delivery", "How batches reach the consumer (a device copy).");
  py::class_<BatchFinisher, std::shared_ptr<BatchFinisher>>(
      m, "BatchFinisher", "Finishes batches outside the worker pool (the Python stage).");

  m.attr("MAX_PREFETCH") = kMaxPrefetch;  // batches in flight per stream, at most
  py::class_<LoaderOptions>(m, "LoaderOptions")
      .def(py::init<>())
      .def_readwrite("num_threads", &LoaderOptions::num_threads)
      .def_readwrite("prefetch", &LoaderOptions::prefetch)
      .def_readwrite("auto_threads", &LoaderOptions::auto_threads)
      .def_readwrite("auto_prefetch", &LoaderOptions::auto_prefetch)
      .def_readwrite("max_memory", &LoaderOptions::max_memory)
      .def_readwrite("stall_warning", &LoaderOptions::stall_warning)
      .def_property(
          "slow_first_batch_ms", [](const LoaderOptions& o) { return o.slow_first_batch.count(); },
          [](LoaderOptions& o, int64_t ms) { o.slow_first_batch = std::chrono::milliseconds(ms); })
      .def_readwrite("prefetch_next_epoch", &LoaderOptions::prefetch_next_epoch)
      .def_readwrite("host_memory", &LoaderOptions::host_allocator)
      .def_readwrite("delivery", &LoaderOptions::delivery)
      .def_readwrite("finisher", &LoaderOptions::finisher)
      .def_property(
          "linger_ms", [](const LoaderOptions& o) { return o.linger.count(); },
          [](LoaderOptions& o, int64_t ms) { o.linger = std::chrono::milliseconds(ms); });

  py::class_<LoaderCore, std::shared_ptr<LoaderCore>>(m, "LoaderCore")
      .def(py::init([](std::shared_ptr<BatchProducer> p, const LoaderOptions& o) {
             return LoaderCore::create(std::move(p), o);
           }),
           py::arg("producer"), py::arg("options"))
      .def("num_batches", &LoaderCore::num_batches, py::arg("rank"), py::arg("world_size"))
      .def("next_batches", &LoaderCore::next_batches, py::arg("rank"), py::arg("world_size"))
      .def("set_epoch", &LoaderCore::set_epoch, py::arg("epoch"))
      .def_property_readonly("epoch", &LoaderCore::epoch)
      .def("iter", &LoaderCore::iter, py::arg("rank"), py::arg("world_size"),
           py::call_guard<py::gil_scoped_release>())
      .def("state",
           [](const LoaderCore& c) {
             LoaderState s = c.state();
             return py::make_tuple(s.epoch, s.offset, s.world_size);
           })
      .def(
          "load_state",
          [](LoaderCore& c, uint64_t epoch, int64_t offset, int64_t world_size) {
            c.load_state(LoaderState{epoch, offset, world_size});
          },
          py::arg("epoch"), py::arg("offset"), py::arg("world_size") = 0,
          "world_size: of the job that saved the state (padding follows it; 0: unknown)")
      .def("skip", &LoaderCore::skip, py::arg("batches"), py::arg("rank"), py::arg("world_size"))
      .def(
          "run_part",
          [](LoaderCore& c, py::tuple key, int64_t first, int64_t count) {
            c.run_part(epoch_key(key), first, count);
          },
          py::arg("key"), py::arg("first"), py::arg("count"),
          "The next iterator on the key's rank and world size runs batches [first, first + "
          "count) of segment `key` (an iterator's key) and ends (NOTE [ Parts ]).")
      .def("close", &LoaderCore::close, py::call_guard<py::gil_scoped_release>())
      .def("drop_prefetch", &LoaderCore::drop_prefetch, py::call_guard<py::gil_scoped_release>(),
           "Stops the stream kept or started for the next iterator.")
      .def("stats", [](const LoaderCore& c) { return stats_dict(c.stats()); })
      .def_property_readonly("active_threads", &LoaderCore::active_threads);

  py::class_<LoaderCore::Iterator, std::shared_ptr<LoaderCore::Iterator>>(m, "LoaderIterator")
      .def("next", &next_batch, py::arg("consumer_stream") = 0, py::arg("with_ticket") = false,
           py::arg("side_stream") = 0, py::arg("timeout_ms") = -1,
           "The next batch as [(name, dltensor capsule)], or None at the end of the epoch; "
           "with_ticket: ([...], ticket), the Python stage's ticket of the batch (0: none); "
           "side_stream: also ordered after the device copy (batch_map's stream); "
           "timeout_ms >= 0: False if no batch came within it.")
      .def(
          "close", [](LoaderCore::Iterator& it) { it.close(); },
          py::call_guard<py::gil_scoped_release>())
      .def("note_handoff", &LoaderCore::Iterator::note_handoff, py::arg("ns"),
           "Adds ns of the consumer's next() outside next() (the batch's Python objects) to "
           "wait_seconds and data_stall, not to the tuner's wait.")
      .def("claim", &LoaderCore::Iterator::claim, py::call_guard<py::gil_scoped_release>(),
           "Claims the epoch now, as the first next() would, without taking a batch.")
      .def_property_readonly(
          "key", [](const LoaderCore::Iterator& it) { return key_tuple(it.key()); },
          "(epoch, rank, world_size, offset, pad_from): the segment it runs (claimed), else "
          "the one it would claim now; batch k of it is a pure function of this and k.")
      .def_property_readonly("remaining", &LoaderCore::Iterator::remaining)
      .def_property_readonly("epoch", &LoaderCore::Iterator::epoch)
      .def_property_readonly("claimed", &LoaderCore::Iterator::claimed)
      .def_property_readonly("closed", &LoaderCore::Iterator::closed)
      .def_property_readonly("ready_batches", &LoaderCore::Iterator::ready_batches);
}

}  // namespace stoker::bindings
