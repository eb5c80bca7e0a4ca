// Bindings of the token side: token sources (format/token_source.h) and the
// token BatchProducer (producers/token_producer.h). The loader core takes the
// producer as a BatchProducer; `batch()` and `run_batches()` run a producer's
// batches without the core (pipeline/batch_runner.h: tests, the Python
// reference, benchmarks).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "common/error.h"
#include "format/megatron_index.h"
#include "format/record_tokens.h"
#include "format/token_file.h"
#include "pipeline/batch_runner.h"
#include "producers/token_producer.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

struct PyEpochPlan {
  std::shared_ptr<const EpochPlan> plan;
  EpochKey key;
};

py::dict batch_to_numpy(const BatchWork& w, std::shared_ptr<BatchBuffer> buf) {
  py::dict out;
  // one owner for all arrays of the batch
  auto* keep = new std::shared_ptr<BatchBuffer>(std::move(buf));
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<BatchBuffer>*>(p); });
  for (const TensorDesc& t : w.tensors) {
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    out[py::str(t.name)] =
        py::array(py::dtype(dtype_name(t.dtype)), shape, (*keep)->data() + t.offset, owner);
  }
  return out;
}

TokenMode mode_from(const std::string& m) {
  if (m == "windows") return TokenMode::kWindows;
  if (m == "concat") return TokenMode::kConcat;
  if (m == "document") return TokenMode::kDocument;
  if (m == "budget") return TokenMode::kBudget;
  STOKER_THROW(UsageError, "unknown token mode '", m, "'");
}

py::array_t<int64_t> vector_array(std::vector<int64_t> v) {
  auto* keep = new std::vector<int64_t>(std::move(v));
  py::capsule owner(keep, [](void* p) { delete static_cast<std::vector<int64_t>*>(p); });
  return py::array_t<int64_t>(static_cast<py::ssize_t>(keep->size()), keep->data(), owner);
}

}  // namespace

void register_tokens(py::module_& m) {
  // The loader core's bindings may register the base first; the token side
  // only needs it to exist so a TokenProducer converts to it.
  if (!py::detail::get_type_info(typeid(BatchProducer)))
    py::class_<BatchProducer, std::shared_ptr<BatchProducer>>(m, "BatchProducer");

  py::class_<TokenSource, std::shared_ptr<TokenSource>>(m, "TokenSource")
      .def_property_readonly("dtype", [](const TokenSource& s) { return dtype_name(s.dtype()); })
      .def_property_readonly("num_docs", &TokenSource::num_docs)
      .def_property_readonly("num_tokens", &TokenSource::num_tokens)
      .def("doc_lengths",
           [](const TokenSource& s) {
             std::vector<int64_t> v(static_cast<size_t>(s.num_docs()));
             for (int64_t d = 0; d < s.num_docs(); ++d) v[static_cast<size_t>(d)] = s.doc_length(d);
             return vector_array(std::move(v));
           })
      .def("doc_start", &TokenSource::doc_start)
      .def(
          "doc",
          [](std::shared_ptr<TokenSource> s, int64_t d) {
            STOKER_CHECK(d >= 0 && d < s->num_docs(), UsageError, "document ", d,
                         " out of range [0, ", s->num_docs(), ")");
            TokenSpan span;
            {
              py::gil_scoped_release nogil;
              span = s->doc(d);
            }
            // a read-only view into the mapping; the source stays alive with it
            auto* keep = new std::shared_ptr<TokenSource>(s);
            py::capsule owner(
                keep, [](void* p) { delete static_cast<std::shared_ptr<TokenSource>*>(p); });
            py::array a(py::dtype(dtype_name(s->dtype())), {static_cast<py::ssize_t>(span.length)},
                        span.data, owner);
            py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            return a;
          },
          py::arg("doc"), "Tokens of document `doc` (verified; a read-only view).")
      .def(
          "no_loss_prefix",
          [](const TokenSource& s, int64_t d) {
            STOKER_CHECK(d >= 0 && d < s.num_docs(), UsageError, "document ", d,
                         " out of range [0, ", s.num_docs(), ")");
            py::gil_scoped_release nogil;
            return s.doc(d).no_loss_prefix;
          },
          py::arg("doc"), "Leading prompt tokens of document `doc` (no training target).")
      .def("where", &TokenSource::where)
      .def("describe", &TokenSource::describe);

  m.def(
      "open_token_files",
      [](const std::vector<std::string>& paths, const std::string& dtype,
         std::optional<int64_t> eos) {
        DType t = dtype_from_name(dtype);
        py::gil_scoped_release nogil;
        return open_token_files(paths, t, eos);
      },
      py::arg("paths"), py::arg("dtype"), py::arg("eos") = py::none());
  m.def(
      "open_megatron",
      [](const std::vector<std::string>& prefixes) {
        py::gil_scoped_release nogil;
        return open_megatron(prefixes);
      },
      py::arg("prefixes"));
  m.def(
      "open_record_tokens",
      [](std::shared_ptr<Dataset> ds, const std::string& field,
         const std::string& prompt_field) -> std::shared_ptr<TokenSource> {
        py::gil_scoped_release nogil;
        return std::make_shared<RecordTokenSource>(std::move(ds), field, prompt_field);
      },
      py::arg("dataset"), py::arg("field"), py::arg("prompt_field") = "");

  py::class_<PyEpochPlan>(m, "TokenEpochPlan")
      .def_property_readonly("num_batches",
                             [](const PyEpochPlan& p) { return p.plan->num_batches(); })
      .def_property_readonly("epoch", [](const PyEpochPlan& p) { return p.key.epoch; })
      .def_property_readonly("offset", [](const PyEpochPlan& p) { return p.key.offset; });

  py::class_<TokenProducer, BatchProducer, std::shared_ptr<TokenProducer>>(m, "TokenProducer")
      .def(
          py::init([](std::shared_ptr<TokenSource> source, const std::string& mode, int64_t seq_len,
                      int64_t stride, int64_t batch_size, int64_t max_tokens, int64_t max_length,
                      int64_t pad_to_multiple_of, bool shuffle, uint64_t seed, bool drop_last,
                      const std::string& token_dtype, int64_t pad_id, int64_t ignore_index,
                      const std::string& pack_fit, int64_t pack_window, const std::string& overlong,
                      int64_t vocab_size, bool attention_mask, bool unshifted, bool even_batches) {
            TokenOptions o;
            o.mode = mode_from(mode);
            o.seq_len = seq_len;
            o.stride = stride;
            o.batch_size = batch_size;
            o.max_tokens = max_tokens;
            o.max_length = max_length;
            o.pad_to_multiple_of = pad_to_multiple_of;
            o.shuffle = shuffle;
            o.seed = seed;
            o.drop_last = drop_last;
            o.token_dtype = dtype_from_name(token_dtype);
            o.pad_id = pad_id;
            o.ignore_index = ignore_index;
            if (pack_fit == "best_fit")
              o.fit = PackFit::kBest;
            else if (pack_fit == "first_fit")
              o.fit = PackFit::kFirst;
            else
              STOKER_THROW(UsageError, "pack_fit must be 'best_fit' or 'first_fit', got '",
                           pack_fit, "'");
            o.pack_window = pack_window;
            if (overlong == "split")
              o.overlong = Overlong::kSplit;
            else if (overlong == "truncate")
              o.overlong = Overlong::kTruncate;
            else if (overlong == "error")
              o.overlong = Overlong::kError;
            else
              STOKER_THROW(UsageError, "overlong must be 'split', 'truncate' or 'error', got '",
                           overlong, "'");
            o.vocab_size = vocab_size;
            o.attention_mask = attention_mask;
            o.unshifted = unshifted;
            o.even_batches = even_batches;
            py::gil_scoped_release nogil;
            return std::make_shared<TokenProducer>(std::move(source), o);
          }),
          py::arg("source"), py::kw_only(), py::arg("mode"), py::arg("seq_len") = 0,
          py::arg("stride") = 0, py::arg("batch_size") = 1, py::arg("max_tokens") = 0,
          py::arg("max_length") = 0, py::arg("pad_to_multiple_of") = 1, py::arg("shuffle") = false,
          py::arg("seed") = 0, py::arg("drop_last") = false, py::arg("token_dtype") = "int64",
          py::arg("pad_id") = 0, py::arg("ignore_index") = -100, py::arg("pack_fit") = "best_fit",
          py::arg("pack_window") = 64, py::arg("overlong") = "split", py::arg("vocab_size") = 0,
          py::arg("attention_mask") = true, py::arg("unshifted") = false,
          py::arg("even_batches") = true)
      .def("num_batches", &TokenProducer::num_batches, py::arg("rank") = 0,
           py::arg("world_size") = 1)
      .def_property_readonly("num_samples", &TokenProducer::num_samples,
                             "What a mixture draws: windows, packed rows or budget batches.")
      .def_property_readonly("real_tokens", &TokenProducer::real_tokens,
                             "Real (non-pad) tokens of all of them.")
      .def("epoch_samples", &TokenProducer::epoch_samples)
      .def(
          "consumed_after",
          [](const TokenProducer& p, uint64_t epoch, int64_t rank, int64_t world, int64_t offset,
             int64_t batches) {
            py::gil_scoped_release nogil;
            return p.consumed_after({epoch, rank, world, offset}, batches);
          },
          py::arg("epoch"), py::arg("rank"), py::arg("world_size"), py::arg("offset"),
          py::arg("batches"))
      .def_property_readonly("pad_fraction", &TokenProducer::pad_fraction)
      .def_property_readonly("unused_tokens", &TokenProducer::unused_tokens)
      .def_property_readonly("epoch_rows", &TokenProducer::epoch_rows)
      .def_property_readonly("source", [](const TokenProducer& p) { return p.source().describe(); })
      .def(
          "plan_epoch",
          [](const TokenProducer& p, uint64_t epoch, int64_t rank, int64_t world, int64_t offset) {
            EpochKey key{epoch, rank, world, offset};
            py::gil_scoped_release nogil;
            return PyEpochPlan{p.plan_epoch(key), key};
          },
          py::arg("epoch") = 0, py::arg("rank") = 0, py::arg("world_size") = 1,
          py::arg("offset") = 0)
      .def(
          "batch",
          [](const TokenProducer& p, const PyEpochPlan& plan, int64_t k, int threads) {
            std::unique_ptr<BatchWork> w;
            std::shared_ptr<BatchBuffer> buf;
            {
              py::gil_scoped_release nogil;
              w = p.plan_batch(*plan.plan, k);
              buf = std::make_shared<BatchBuffer>(w->bytes);
              run_units(*w, buf->data(), threads);
            }
            return batch_to_numpy(*w, std::move(buf));
          },
          py::arg("plan"), py::arg("k"), py::arg("threads") = 1,
          "Batch k of the plan as numpy arrays, its units run on `threads` threads.")
      .def(
          "run_batches",
          [](const TokenProducer& p, const PyEpochPlan& plan, int64_t first, int64_t count,
             int threads) {
            RunBatchesResult r;
            {
              py::gil_scoped_release nogil;
              r = run_batches(p, *plan.plan, first, count, threads);
            }
            return py::make_tuple(r.batches, r.bytes, r.seconds);
          },
          py::arg("plan"), py::arg("first"), py::arg("count"), py::arg("threads") = 1,
          "(batches, output bytes, seconds) of batches [first, first + count) on `threads` "
          "threads, each taking whole batches into its own reused buffer: the producer alone.");
}

}  // namespace stoker::bindings
