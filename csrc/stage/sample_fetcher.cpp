#include "stage/sample_fetcher.h"

#include <algorithm>
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
    : source_(make_record_source(std::move(ds), opts)), seed_(opts.sampler.seed) {
  for (const auto& g : source_->groups)
    STOKER_CHECK(g->samples() == 1, UsageError, op_name(g->spec().ops[0]),
                 " reads more samples, which the loader's workers do: map= and ds.sample do "
                 "not run it (use it in transforms without map=)");
}

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
      field = ds.schema().fields[f].name;
      const RecordView& v = out.views[f];
      if (const ImagePipeline* pipe = source_->pipelines[f].get()) {
        out.image_hw[f] = pipe->output_size(v.data, v.size);
      } else if (const VideoPipeline* vp = source_->videos[f].get()) {
        out.image_hw[f] = vp->fixed_size() ? *vp->fixed_size() : vp->output_size(v.data, v.size);
      } else if (const AudioPipeline* ap = source_->audios[f].get()) {
        const AudioPipeline::Shape sh = ap->output_shape(v.data, v.size);
        out.image_hw[f] = {sh.channels, static_cast<int>(sh.samples)};
      }
    }
    for (size_t g = 0; g < source_->groups.size(); ++g) {
      const std::vector<size_t>& fields = source_->group_fields[g];
      std::vector<MemberIO> io(fields.size());
      for (size_t i = 0; i < fields.size(); ++i)
        io[i] = {out.views[fields[i]].data, out.views[fields[i]].size};
      field = ds.schema().fields[source_->group_leader[g]].name;
      const std::pair<int, int> hw = source_->groups[g]->output_size(io.data());
      for (size_t f : fields) out.image_hw[f] = hw;
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
    const int g = source_->group_of[f];
    const GroupMember* member =
        g >= 0 ? &source_->groups[g]->spec().members[source_->member_of[f]] : nullptr;
    if (const ImagePipeline* pipe = pipeline(f)) {
      const auto [h, w] = s.image_hw[f];
      o.kind = FieldOut::Kind::kImage;
      o.dtype = pipe->out_dtype();
      o.shape = pipe->layout() == ImageLayout::kCHW ? std::vector<int64_t>{3, h, w}
                                                    : std::vector<int64_t>{h, w, 3};
    } else if (member && member->kind == GroupMember::Kind::kImage) {
      const auto [h, w] = s.image_hw[f];
      o.kind = FieldOut::Kind::kImage;
      o.dtype = source_->groups[g]->image_dtype();
      o.shape = source_->layouts[f] == ImageLayout::kCHW ? std::vector<int64_t>{3, h, w}
                                                         : std::vector<int64_t>{h, w, 3};
    } else if (member && member->kind == GroupMember::Kind::kMask) {
      // As the loader's batch has it: an image of one channel in its layout, or
      // an array of the field's shape at the output size.
      const auto [h, w] = s.image_hw[f];
      o.kind = FieldOut::Kind::kImage;
      o.dtype = member->encoded ? DType::kUInt8 : spec.dtype;
      if (member->encoded)
        o.shape = source_->layouts[f] == ImageLayout::kCHW ? std::vector<int64_t>{1, h, w}
                                                           : std::vector<int64_t>{h, w, 1};
      else
        o.shape =
            spec.shape.size() == 3 ? std::vector<int64_t>{h, w, 1} : std::vector<int64_t>{h, w};
    } else if (const VideoPipeline* vp = source_->videos[f].get()) {
      const auto [h, w] = s.image_hw[f];
      const int64_t t = vp->num_frames();
      o.kind = FieldOut::Kind::kImage;
      o.dtype = vp->out_dtype();
      o.shape = vp->layout() == ImageLayout::kCHW ? std::vector<int64_t>{t, 3, h, w}
                                                  : std::vector<int64_t>{t, h, w, 3};
    } else if (source_->audios[f]) {
      o.kind = FieldOut::Kind::kImage;
      o.dtype = DType::kFloat32;
      o.shape = {s.image_hw[f].first, s.image_hw[f].second};
    } else if (spec.kind == FieldKind::kBlob) {
      o.kind = FieldOut::Kind::kBytes;
    } else {  // Python gives it its shape
      o.kind = FieldOut::Kind::kArray;
      o.dtype = spec.dtype;
      o.shape = {static_cast<int64_t>(v.size / dtype_size(spec.dtype))};
    }
  }
  for (size_t f = 0; f < schema.fields.size(); ++f) {
    if (const VideoPipeline* vp = source_->videos[f].get()) {
      FieldOut o;
      o.kind = FieldOut::Kind::kImage;
      o.dtype = DType::kFloat64;
      o.shape = {vp->num_frames()};
      out.push_back(std::move(o));
    }
  }
  return out;
}

std::vector<int64_t> SampleFetcher::write(Sample& s, const std::vector<void*>& dst, uint64_t epoch,
                                          PythonTimes& times) const {
  const std::vector<FieldOut> out = outputs(s);
  STOKER_CHECK(dst.size() == out.size(), UsageError, "SampleFetcher::write: ", dst.size(),
               " destinations for ", out.size(), " fields");
  std::vector<int64_t> left(out.size(), -1);
  const size_t nf = source_->ds->schema().fields.size();
  for (size_t f = 0; f < nf; ++f)
    if (out[f].kind == FieldOut::Kind::kArray && source_->group_of[f] < 0)
      std::memcpy(dst[f], out[f].data, out[f].size);
  for (size_t f = 0; f < nf; ++f)
    if (pipeline(f)) decode_image(s, f, epoch, dst[f], times);
  size_t extra = nf;  // the video fields' frame times, after the fields
  for (size_t f = 0; f < nf; ++f)
    if (source_->videos[f] || source_->audios[f])
      decode_media(s, f, epoch, dst[f], source_->videos[f] ? dst[extra++] : nullptr, times);
  for (size_t g = 0; g < source_->groups.size(); ++g) run_group(s, g, epoch, dst, left, times);
  release(s);
  return left;
}

void SampleFetcher::run_group(const Sample& s, size_t g, uint64_t epoch,
                              const std::vector<void*>& dst, std::vector<int64_t>& left,
                              PythonTimes& times) const {
  const auto t0 = std::chrono::steady_clock::now();
  const TransformGroup& group = *source_->groups[g];
  const std::vector<size_t>& fields = source_->group_fields[g];
  const Schema& schema = source_->ds->schema();
  std::vector<MemberIO> io(fields.size());
  for (size_t i = 0; i < fields.size(); ++i)
    io[i] = {s.views[fields[i]].data, s.views[fields[i]].size, dst[fields[i]]};
  // The loader's draws for this group (NOTE [ Random draws ]).
  const uint64_t seed =
      sample_draw_seed(hash_combine(seed_, epoch), s.index, source_->draw_keys.at(fields[0]));
  const size_t leader = source_->group_leader[g];
  int64_t decode_ns = 0;
  try {
    group.run(io.data(), seed, s.image_hw[leader].first, s.image_hw[leader].second, &decode_ns);
  } catch (...) {
    rethrow_with_context(*source_->ds, s.index, schema.fields[leader].name);
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    const GroupMember::Kind k = group.spec().members[i].kind;
    if (k == GroupMember::Kind::kImage || k == GroupMember::Kind::kMask) continue;
    const FieldSpec& spec = schema.fields[fields[i]];
    left[fields[i]] =
        io[i].out_rows * static_cast<int64_t>(spec.row_bytes() / dtype_size(spec.dtype));
  }
  const int64_t total = ns_since(t0);
  times.decode_ns += std::min(decode_ns, total);
  times.ops_ns += total - std::min(decode_ns, total);
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

void SampleFetcher::decode_media(const Sample& s, size_t f, uint64_t epoch, void* dst, void* pts,
                                 PythonTimes& times) const {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t seed =
      sample_draw_seed(hash_combine(seed_, epoch), s.index, source_->draw_keys.at(f));
  int64_t decode_ns = 0;
  const RecordView& v = s.views[f];
  const auto [h, w] = s.image_hw[f];
  try {
    if (const VideoPipeline* vp = source_->videos[f].get())
      vp->run(v.data, v.size, seed, dst, static_cast<double*>(pts), h, w, &decode_ns);
    else
      source_->audios[f]->run(v.data, v.size, seed, static_cast<float*>(dst), h, w, &decode_ns);
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
