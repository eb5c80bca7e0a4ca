// Bindings of mixtures: the sampler (sampler/mixture.h), the rows of a mixture's
// stream, for the Python layer (epoch lengths) and for tests that check them; and
// the two producers (producers/mix_record_producer.h, producers/mix_token_producer.h).
// A source's own stream (sampler/source_stream.h) is stoker._testing's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline/batch_runner.h"
#include "producers/mix_record_producer.h"
#include "producers/mix_token_producer.h"
#include "sampler/mixture.h"

namespace py = pybind11;

namespace stoker::bindings {

void register_mixture(py::module_& m) {
  py::class_<MixSequence>(m, "MixSequence",
                          "Which source each row of a mixture's stream comes from "
                          "(NOTE [ Mixtures ] in csrc/sampler/mixture.h).")
      .def_static("constant", &MixSequence::constant, py::arg("counts"),
                  "counts[s] rows of source s in every sum(counts) rows.")
      .def_static("schedule", &MixSequence::schedule, py::arg("starts"), py::arg("weights"),
                  py::arg("linear"), "weights[i] from row starts[i], constant or linear between.")
      .def_property_readonly("num_sources", &MixSequence::num_sources)
      .def_property_readonly("is_constant", &MixSequence::is_constant)
      .def_property_readonly("period", &MixSequence::period)
      .def_property_readonly("period_counts", &MixSequence::period_counts)
      .def(
          "counts",
          [](const MixSequence& s, int64_t rows) {
            py::array_t<int64_t> out(static_cast<py::ssize_t>(s.num_sources()));
            s.counts(rows, out.mutable_data());
            return out;
          },
          py::arg("rows"), "Rows of each source among rows [0, rows).")
      .def(
          "rows",
          [](const MixSequence& s, int64_t first, int64_t n) {
            py::array_t<int32_t> src(n);
            py::array_t<int64_t> idx(n);
            {
              py::gil_scoped_release nogil;
              s.rows(first, n, src.mutable_data(), idx.mutable_data());
            }
            return py::make_tuple(src, idx);
          },
          py::arg("first"), py::arg("n"),
          "(source, position in that source's stream) of rows [first, first + n).")
      .def("weights_at", &MixSequence::weights_at, py::arg("row"))
      .def("rows_until", &MixSequence::rows_until, py::arg("source"), py::arg("count"),
           "One past the row of source's count-th row.");

  py::class_<MixRecordProducer, BatchProducer, std::shared_ptr<MixRecordProducer>>(
      m, "MixRecordProducer", "Batches of a mixture of record datasets with the same fields.")
      .def(py::init([](std::vector<std::shared_ptr<Dataset>> sets, const MixSequence& seq,
                       int64_t epoch_rows, std::vector<uint64_t> keys, RecordOptions opts) {
             std::vector<std::shared_ptr<const Dataset>> cs(sets.begin(), sets.end());
             return std::make_shared<MixRecordProducer>(std::move(cs), seq, epoch_rows,
                                                        std::move(keys), std::move(opts));
           }),
           py::arg("datasets"), py::arg("sequence"), py::arg("epoch_rows"), py::arg("keys"),
           py::arg("options"), "options: the record options of one dataset (_core.RecordOptions).")
      .def("set_sequence", &MixRecordProducer::set_sequence, py::arg("sequence"))
      .def("sequence", &MixRecordProducer::sequence)
      .def("shard_schedule", &MixRecordProducer::shard_schedule, py::arg("source"),
           py::arg("epoch"), py::arg("position"), py::arg("max_shards"),
           "The shards of `source` the whole job reads from global `position` of `epoch` on.");

  py::class_<MixTokenProducer, BatchProducer, std::shared_ptr<MixTokenProducer>>(
      m, "MixTokenProducer", "Batches of a mixture of token sources.")
      .def(py::init([](std::vector<std::shared_ptr<TokenProducer>> sources, const MixSequence& seq,
                       int64_t epoch_rows, std::vector<uint64_t> keys) {
             std::vector<std::shared_ptr<const TokenProducer>> cs(sources.begin(), sources.end());
             return std::make_shared<MixTokenProducer>(std::move(cs), seq, epoch_rows,
                                                       std::move(keys));
           }),
           py::arg("sources"), py::arg("sequence"), py::arg("epoch_rows"), py::arg("keys"))
      .def("set_sequence", &MixTokenProducer::set_sequence, py::arg("sequence"))
      .def("sequence", &MixTokenProducer::sequence)
      .def(
          "run_batches",
          [](const MixTokenProducer& p, uint64_t epoch, int64_t first, int64_t count, int threads) {
            py::gil_scoped_release nogil;
            const auto plan = p.plan_epoch(EpochKey{epoch, 0, 1, 0, 0});
            const RunBatchesResult r = run_batches(p, *plan, first, count, threads);
            return std::make_tuple(r.batches, r.bytes, r.seconds);
          },
          py::arg("epoch"), py::arg("first"), py::arg("count"), py::arg("threads") = 1,
          "(batches, output bytes, seconds) of batches [first, first + count) of epoch `epoch` "
          "(rank 0 of 1), without the loader core: the producer's own cost.");
}

}  // namespace stoker::bindings
