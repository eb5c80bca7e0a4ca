#include "stage/sample_fetcher.h"

#include <chrono>
#include <cstring>

#include "common/error.h"
#include "producers/sample_writer.h"
#include "sampler/permutation.h"

namespace stoker {

namespace {

int64_t ns_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace

SampleFetcher::SampleFetcher(std::shared_ptr<const Dataset> ds, const RecordOptions& opts)
    : source_(make_record_source(std::move(ds), opts)), seed_(opts.sampler.seed) {}

void SampleFetcher::read(int64_t index, Sample& out, PythonTimes& times) const {
  const auto t0 = std::chrono::steady_clock::now();
  const Dataset& ds = *source_->ds;
  STOKER_CHECK(index >= 0 && index < ds.size(), UsageError, "sample ", index,
               " is outside a dataset of ", ds.size());
  out.index = index;
  out.views.assign(ds.schema().fields.size(), RecordView{});
  out.image_hw.assign(out.views.size(), {0, 0});
  std::string field;
  try {
    const Dataset::Location loc = ds.locate(index);
    out.pin = ds.pin_record(loc);  // the shard, or a remote record by range
    ds.read(out.pin, loc, out.views.data(), source_->verify);
    for (size_t f = 0; f < out.views.size(); ++f) {
      const ImagePipeline* pipe = source_->pipelines[f].get();
      if (!pipe) continue;
      field = ds.schema().fields[f].name;
      out.image_hw[f] = pipe->output_size(out.views[f].data, out.views[f].size);
    }
  } catch (const FetchError&) {  // names the shard's URL: not the sample's fault
    throw;
  } catch (...) {
    rethrow_with_context(ds, index, field);
  }
  int64_t bytes = 0;
  for (const RecordView& v : out.views) bytes += static_cast<int64_t>(v.size);
  times.bytes += bytes;
  times.read_ns += ns_since(t0);
}

std::vector<SampleFetcher::FieldOut> SampleFetcher::outputs(const Sample& s) const {
  const Schema& schema = source_->ds->schema();
  std::vector<FieldOut> out(schema.fields.size());
  for (size_t f = 0; f < out.size(); ++f) {
    const FieldSpec& spec = schema.fields[f];
    const RecordView& v = s.views[f];
    FieldOut& o = out[f];
    o.data = v.data;
    o.size = v.size;
    if (const ImagePipeline* pipe = pipeline(f)) {
      const auto [h, w] = s.image_hw[f];
      o.kind = FieldOut::Kind::kImage;
      o.dtype = pipe->out_dtype();
      o.shape = pipe->layout() == ImageLayout::kCHW ? std::vector<int64_t>{3, h, w}
                                                    : std::vector<int64_t>{h, w, 3};
    } else if (spec.kind == FieldKind::kBlob) {
      o.kind = FieldOut::Kind::kBytes;
    } else {  // Python gives it its shape
      o.kind = FieldOut::Kind::kArray;
      o.dtype = spec.dtype;
      o.shape = {static_cast<int64_t>(v.size / dtype_size(spec.dtype))};
    }
  }
  return out;
}

void SampleFetcher::write(Sample& s, const std::vector<void*>& dst, uint64_t epoch,
                          PythonTimes& times) const {
  const std::vector<FieldOut> out = outputs(s);
  STOKER_CHECK(dst.size() == out.size(), UsageError, "SampleFetcher::write: ", dst.size(),
               " destinations for ", out.size(), " fields");
  for (size_t f = 0; f < out.size(); ++f)
    if (out[f].kind == FieldOut::Kind::kArray) std::memcpy(dst[f], out[f].data, out[f].size);
  for (size_t f = 0; f < out.size(); ++f)
    if (out[f].kind == FieldOut::Kind::kImage) decode_image(s, f, epoch, dst[f], times);
  release(s);
}

void SampleFetcher::decode_image(const Sample& s, size_t f, uint64_t epoch, void* dst,
                                 PythonTimes& times) const {
  const auto t0 = std::chrono::steady_clock::now();
  const ImagePipeline& pipe = *source_->pipelines.at(f);
  // The loader's draws for this image (NOTE [ Random draws ]).
  const uint64_t seed =
      sample_draw_seed(hash_combine(seed_, epoch), s.index, source_->draw_keys.at(f));
  int64_t decode_ns = 0;
  try {
    pipe.run(s.views[f].data, s.views[f].size, seed, dst, s.image_hw[f].first, s.image_hw[f].second,
             &decode_ns, nullptr, source_->cache_slot(f, s.index));
  } catch (...) {
    rethrow_with_context(*source_->ds, s.index, source_->ds->schema().fields[f].name);
  }
  const int64_t total = ns_since(t0);
  times.decode_ns += std::min(decode_ns, total);
  times.ops_ns += total - std::min(decode_ns, total);
}

void SampleFetcher::release(Sample& s) const {
  try {
    source_->ds->check_intact(s.index);
  } catch (...) {
    s.pin = Dataset::ShardPin{};
    rethrow_with_context(*source_->ds, s.index, "");
  }
  s.pin = Dataset::ShardPin{};
}

}  // namespace stoker
