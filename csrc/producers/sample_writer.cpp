#include "producers/sample_writer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <new>
#include <vector>

#include "common/activity.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/stream_copy.h"
#include "format/record_prefetch.h"
#include "geometry/detail/rng.h"
#include "producers/batch_planner.h"
#include "sampler/permutation.h"

namespace stoker {

[[noreturn]] void rethrow_with_context(const Dataset& ds, int64_t index, const std::string& field) {
  Dataset::Location loc = ds.locate(index);
  const std::string& path = ds.shard_path(loc.shard);
  std::string where = field.empty() ? std::string() : ", field '" + field + "'";
  try {
    throw;
  } catch (const DecodeError& e) {
    STOKER_THROW(DecodeError, path, ": record ", loc.record, " (sample ", index, where,
                 "): ", e.what());
  } catch (const DataError& e) {
    std::string msg = e.what();
    if (msg.rfind(path, 0) == 0) throw;  // already names the file and record
    STOKER_THROW(DataError, path, ": record ", loc.record, " (sample ", index, where, "): ", msg);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const UsageError&) {
    throw;
  } catch (const FetchError&) {  // names the shard's URL: not the sample's fault
    throw;
  } catch (const std::exception& e) {
    STOKER_THROW(DataError, path, ": record ", loc.record, " (sample ", index, where,
                 "): ", e.what());
  }
}

namespace {

// A bad sample's error as the loop gets it (on_error="raise"): with what to do about it.
// Its type and source location stay; a failed download or a usage error is not the
// sample's fault and goes as it is.
[[noreturn]] void rethrow_with_fix() {
  static const std::string kFix =
      "; Loader(..., on_error=\"skip\") replaces such samples with the next readable one "
      "(docs/troubleshooting.md)";
  try {
    throw;
  } catch (const DecodeError& e) {
    throw DecodeError(e.what() + kFix, e.where());
  } catch (const DataError& e) {
    throw DataError(e.what() + kFix, e.where());
  }
}

}  // namespace

// How many records ahead of the one being written its table entry is prefetched.
constexpr int64_t kEntryAhead = 4;
// Without image fields, one sample in this many has its stages timed (NOTE [ Stage
// times ]).
constexpr int64_t kTimedEvery = 16;

// NOTE [ Stage times ]
// A worker accounts its time to stages: reading (locating, verifying) and
// decoding (for arrays and scalars: copying into the batch), plus for images the
// ops. With images every sample is timed: two clock reads are nothing next to a
// decode. A record of arrays takes a couple of microseconds, and two clock reads
// per sample cost about 5% of it on a VM, so there the unit is timed as a whole
// (two reads) and split between the stages in the proportion measured on every
// kTimedEvery-th sample (three reads each):
//
//   unit:   |s0 . . . . . . . s8 . . . . . . . s16 ...|
//            ^timed            ^timed             ^timed
//   read_ns + decode_ns = the unit's time; read_ns / decode_ns = that of the timed samples

class SampleWriter {
 public:
  using Clock = std::chrono::steady_clock;

  /// Writes samples of `b` that come from `ds` (a mixture's batch: one run of
  /// samples of one source at a time).
  SampleWriter(RecordBatch& b, const Dataset& ds, uint8_t* base, WorkerContext& ctx)
      : b_(b),
        src_(*b.src_),
        ds_(ds),
        schema_(ds_.schema()),
        base_(base),
        ctx_(ctx),
        views_(views_buffer(schema_.fields.size())),
        time_each_(!src_.groups.empty() ||
                   std::any_of(src_.pipelines.begin(), src_.pipelines.end(),
                               [](const auto& p) { return p != nullptr; }) ||
                   std::any_of(src_.videos.begin(), src_.videos.end(),
                               [](const auto& p) { return p != nullptr; }) ||
                   std::any_of(src_.audios.begin(), src_.audios.end(),
                               [](const auto& p) { return p != nullptr; })) {}

  // Samples [lo, hi) of the batch. Returns early (leaving the rest unwritten)
  // once the stream stops.
  void run(int64_t lo, int64_t hi) {
    struct Flush {  // the unit's bytes and times, counted once rather than per sample
      SampleWriter& w;
      ~Flush() {
        w.b_.bytes_read.fetch_add(w.bytes_, std::memory_order_relaxed);
        w.ctx_.times.bytes += w.bytes_;
        if (!w.time_each_) w.split_unit_time();
      }
    } flush{*this};
    const int64_t n = ds_.size();
    // Each sample is located once, for its two prefetches and its read.
    std::vector<Dataset::Location>& locs = locations_buffer();
    locs.resize(static_cast<size_t>(std::max<int64_t>(0, hi - lo)));
    for (int64_t p = lo; p < hi; ++p)
      locs[static_cast<size_t>(p - lo)] = ds_.locate(b_.indices[static_cast<size_t>(p)]);
    const auto at = [&](int64_t p) { return locs[static_cast<size_t>(p - lo)]; };
    unit_start_ = last_ = Clock::now();
    // Ahead of the record being written (format/record_prefetch.h): its table
    // entry kEntryAhead records on, the first line of each page two records on
    // (the TLB miss), and every line of the next record while this one is
    // copied (stream_copy's `ahead`), so that the next checksum pass reads from
    // cache. Without image fields that is the whole cost of a record: read it
    // once from memory, write it once.
    for (int64_t p = lo; p < std::min(hi, lo + kEntryAhead); ++p) prefetch_record_entry(ds_, at(p));
    if (lo < hi) prefetch_record(ds_, at(lo));
    if (lo + 1 < hi) prefetch_record(ds_, at(lo + 1));
    for (int64_t pos = lo; pos < hi; ++pos) {
      if (ctx_.stopped()) return;
      const int64_t index = b_.indices[static_cast<size_t>(pos)];
      if (pos + kEntryAhead < hi) prefetch_record_entry(ds_, at(pos + kEntryAhead));
      next_ = {};
      if (pos + 2 < hi) prefetch_record(ds_, at(pos + 2));
      if (pos + 1 < hi) {
        if (const ShardReader* r = ds_.mapped_reader(at(pos + 1).shard))
          next_ = r->record_unchecked_or_empty(at(pos + 1).record);
      }
      try {
        write(pos, index, at(pos), time_each_ || (pos - lo) % kTimedEvery == 0);
      } catch (...) {
        // A failed download is skipped too: its shard is fetched again on a later
        // demand (NOTE [ Deferred shards ] in format/shard_gate.h).
        if (!src_.skip_errors) rethrow_with_fix();
        // on_error="skip": the next valid sample in dataset order takes its
        // place, so the replacement is the same whatever thread does it.
        std::exception_ptr first = std::current_exception();
        bool replaced = false;
        for (int64_t step = 1; step < n && !replaced; ++step) {
          if (ctx_.stopped()) return;
          const int64_t alt = (index + step) % n;
          try {
            const Dataset::Location loc = ds_.locate(alt);
            Dataset::ShardPin held;  // a deferred shard (format/dataset.h)
            if (ds_.deferred()) held = ds_.pin_record(loc);
            ds_.read(held, loc, views_.data(), src_.verify);
            if (!fits()) continue;
            write(pos, alt, loc, true);
            replaced = true;
          } catch (...) {
          }
        }
        if (!replaced) std::rethrow_exception(first);
        b_.skipped.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }

 private:
  // Reads, verifies and writes sample `index` (at `loc`) as position `pos` of
  // the batch. A timed sample chains its clock reads from the previous timed
  // one's end when every sample is timed (two per sample), or takes a third
  // (NOTE [ Stage times ]).
  void write(int64_t pos, int64_t index, Dataset::Location loc, bool timed) {
    set_activity(Activity::kReading);
    Clock::time_point t0;
    if (timed) t0 = time_each_ ? last_ : Clock::now();
    // A deferred shard (a URL's) is read under a hold: on the shard (NOTE [ Released
    // shards ] in format/shard_gate.h) or on its record fetched by range (NOTE
    // [ Records by range ]).
    Dataset::ShardPin held;
    if (ds_.deferred()) held = ds_.pin_record(loc);
    ds_.read(held, loc, views_.data(), src_.verify);
    Clock::time_point t1;
    if (timed) t1 = Clock::now();
    set_activity(Activity::kDecoding);
    size_t f = 0;
    image_decode_ns_ = -1;  // no image field written yet
    try {
      for (f = 0; f < schema_.fields.size(); ++f) write_field(f, pos, index);
    } catch (...) {
      rethrow_with_context(ds_, index, schema_.fields[f].name);
    }
    // The bytes written were verified, but a shard cut short under its mapping
    // after that would have given zeros (NOTE [ Shards changed under a reader ]).
    ds_.check_intact(loc);
    int64_t bytes = 0;
    for (const RecordView& v : views_) bytes += static_cast<int64_t>(v.size);
    bytes_ += bytes;
    if (!timed) return;
    last_ = Clock::now();
    const int64_t read_ns = ns_between(t0, t1), fields_ns = ns_between(t1, last_);
    if (!time_each_) {  // arrays and scalars: copying is their decode
      sampled_read_ns_ += read_ns;
      sampled_fields_ns_ += fields_ns;
      return;
    }
    ctx_.times.read_ns += read_ns;
    if (image_decode_ns_ < 0) {
      ctx_.times.decode_ns += fields_ns;
    } else {
      // Images: the codec's time is decode, the rest ops (the copies of the
      // record's other fields, small next to an image, go with the ops).
      const int64_t d = std::min(image_decode_ns_, fields_ns);
      ctx_.times.decode_ns += d;
      ctx_.times.ops_ns += fields_ns - d;
    }
  }

  // The unit's time, split between reading and decoding as in its timed samples.
  void split_unit_time() {
    const int64_t total = ns_since(unit_start_);
    const int64_t sampled = sampled_read_ns_ + sampled_fields_ns_;
    const int64_t read = sampled > 0 ? static_cast<int64_t>(static_cast<double>(total) *
                                                            static_cast<double>(sampled_read_ns_) /
                                                            static_cast<double>(sampled))
                                     : total;
    ctx_.times.read_ns += read;
    ctx_.times.decode_ns += total - read;
  }

  // Per-thread buffers: a writer is made for every unit.
  static std::vector<RecordView>& views_buffer(size_t n) {
    thread_local std::vector<RecordView> v;
    v.assign(n, RecordView{});
    return v;
  }
  static std::vector<Dataset::Location>& locations_buffer() {
    thread_local std::vector<Dataset::Location> v;
    return v;
  }
  void write_field(size_t f, int64_t pos, int64_t index) {
    const FieldSpec& spec = schema_.fields[f];
    const FieldPlan& plan = b_.plans[f];
    const TensorDesc& out = b_.tensors[plan.out];
    uint8_t* dst = base_ + (plan.raw != SIZE_MAX ? plan.raw : out.offset) +
                   static_cast<size_t>(pos) * plan.sample_bytes;
    const RecordView& v = views_[f];
    if (const int g = src_.group_of[f]; g >= 0) {
      if (src_.group_leader[g] == f) write_group(static_cast<size_t>(g), pos, index);
    } else if (spec.kind == FieldKind::kImage) {
      const uint64_t seed =
          sample_draw_seed(b_.sample_seed_, draw_key(pos, index), src_.draw_keys[f]);
      if (image_decode_ns_ < 0) image_decode_ns_ = 0;
      src_.pipelines[f]->run(v.data, v.size, seed, dst, plan.img_h, plan.img_w, &image_decode_ns_,
                             nullptr, src_.cache_slot(f, index));
      set_activity(Activity::kDecoding);
    } else if (spec.kind == FieldKind::kVideo || spec.kind == FieldKind::kAudio) {
      write_media(f, pos, index, dst);
    } else if (!spec.variable()) {
      stream_copy(dst, v.data, v.size, next_.data, next_.size);
      next_ = {};
    } else {
      const int64_t rows = static_cast<int64_t>(v.size / spec.row_bytes());
      if (rows > plan.max_rows)
        STOKER_THROW(DataError, "length changed while reading (", rows, " > ", plan.max_rows,
                     " rows)");
      stream_copy(dst, v.data, v.size, next_.data, next_.size);
      next_ = {};
      finish_rows(f, pos, rows);
    }
  }

  // A video's clip and its times, or an audio crop and its length (NOTE [ Clip
  // sampling ] in geometry/video_pipeline.h, [ Audio crops ] in augment/audio_pipeline.h).
  void write_media(size_t f, int64_t pos, int64_t index, uint8_t* dst) {
    const FieldPlan& plan = b_.plans[f];
    const RecordView& v = views_[f];
    const uint64_t seed =
        sample_draw_seed(b_.sample_seed_, draw_key(pos, index), src_.draw_keys[f]);
    if (image_decode_ns_ < 0) image_decode_ns_ = 0;
    if (const VideoPipeline* vp = src_.videos[f].get()) {
      auto* pts =
          reinterpret_cast<double*>(base_ + b_.tensors[plan.pts].offset) + pos * vp->num_frames();
      vp->run(v.data, v.size, seed, dst, pts, plan.img_h, plan.img_w, &image_decode_ns_);
    } else {
      const int64_t got = src_.audios[f]->run(v.data, v.size, seed, reinterpret_cast<float*>(dst),
                                              plan.channels, plan.max_rows, &image_decode_ns_);
      std::memcpy(base_ + b_.tensors[plan.lengths].offset + static_cast<size_t>(pos) * 8, &got, 8);
    }
    set_activity(Activity::kDecoding);
  }

  // What sample `index` at `pos` keys its random draws by: its index, or a
  // mixture's per-row key, unique per occurrence (NOTE [ Random draws ]).
  int64_t draw_key(int64_t pos, int64_t index) const {
    return b_.sample_keys.empty() ? index
                                  : static_cast<int64_t>(b_.sample_keys[static_cast<size_t>(pos)]);
  }

  // The padding after `rows` rows of variable field f at `pos`, and its length.
  void finish_rows(size_t f, int64_t pos, int64_t rows) {
    const FieldPlan& plan = b_.plans[f];
    uint8_t* dst =
        base_ + b_.tensors[plan.out].offset + static_cast<size_t>(pos) * plan.sample_bytes;
    const size_t used = static_cast<size_t>(rows) * schema_.fields[f].row_bytes();
    const std::vector<uint8_t>& pad = src_.pad_values[f];
    if (pad.empty()) {
      std::memset(dst + used, 0, plan.sample_bytes - used);
    } else {
      for (size_t i = used; i < plan.sample_bytes; i += pad.size())
        std::memcpy(dst + i, pad.data(), pad.size());
    }
    const TensorDesc& lt = b_.tensors[plan.lengths];
    std::memcpy(base_ + lt.offset + static_cast<size_t>(pos) * 8, &rows, 8);
  }

  // Every field of transform group g, at once (transform_group.h); with the
  // other samples the group reads (a Mosaic's, a DetectionMixUp's), read here (NOTE [ Mosaic ] in
  // geometry/transform_group.cpp).
  void write_group(size_t g, int64_t pos, int64_t index) {
    const TransformGroup& group = *src_.groups[g];
    const std::vector<size_t>& fields = src_.group_fields[g];
    thread_local std::vector<MemberIO> io;
    io.assign(fields.size(), MemberIO{});
    const int others = group.samples() - 1;
    thread_local std::vector<RecordView> other_views[kMaxSamples - 1];
    thread_local std::vector<MemberIO> other_io[kMaxSamples - 1];
    const MemberIO* other_ptrs[kMaxSamples - 1] = {};
    Dataset::ShardPin pins[kMaxSamples - 1];
    int64_t partner[kMaxSamples - 1] = {};
    Dataset::Location locs[kMaxSamples - 1];
    if (others > 0) {
      b_.partners(g, pos, index, partner);
      for (int k = 0; k < others; ++k) {
        std::vector<RecordView>& v = other_views[k];
        v.assign(schema_.fields.size(), RecordView{});
        try {
          locs[k] = ds_.locate(partner[k]);
          if (ds_.deferred()) pins[k] = ds_.pin_record(locs[k]);
          ds_.read(pins[k], locs[k], v.data());
        } catch (...) {
          rethrow_with_context(ds_, partner[k], schema_.fields[fields[0]].name);
        }
        other_io[k].assign(fields.size(), MemberIO{});
        for (size_t i = 0; i < fields.size(); ++i)
          other_io[k][i] = {v[fields[i]].data, v[fields[i]].size};
        other_ptrs[k] = other_io[k].data();
      }
    }
    for (size_t i = 0; i < fields.size(); ++i) {
      const size_t f = fields[i];
      const FieldPlan& plan = b_.plans[f];
      const RecordView& v = views_[f];
      if (schema_.fields[f].variable() && schema_.fields[f].kind != FieldKind::kImage) {
        int64_t rows = static_cast<int64_t>(v.size / schema_.fields[f].row_bytes());
        for (int k = 0; k < others; ++k)
          rows += static_cast<int64_t>(other_views[k][f].size / schema_.fields[f].row_bytes());
        if (rows > plan.max_rows)
          STOKER_THROW(DataError, "length of '", schema_.fields[f].name,
                       "' changed while reading (more than ", plan.max_rows, " rows)");
      }
      io[i] = {v.data, v.size,
               base_ + b_.tensors[plan.out].offset + static_cast<size_t>(pos) * plan.sample_bytes};
      io[i].cache = src_.cache_slot(f, index);
    }
    const FieldPlan& lead = b_.plans[src_.group_leader[g]];
    const uint64_t seed = b_.group_seed(g, pos, index);
    if (image_decode_ns_ < 0) image_decode_ns_ = 0;
    group.run(io.data(), seed, lead.img_h, lead.img_w, &image_decode_ns_,
              others > 0 ? other_ptrs : nullptr);
    for (int k = 0; k < others; ++k) {
      ds_.check_intact(locs[k]);
      for (size_t i = 0; i < fields.size(); ++i)
        bytes_ += static_cast<int64_t>(other_views[k][fields[i]].size);
    }
    set_activity(Activity::kDecoding);
    for (size_t i = 0; i < fields.size(); ++i)
      if (b_.plans[fields[i]].lengths != SIZE_MAX) finish_rows(fields[i], pos, io[i].out_rows);
  }

  // Whether the sample in views_ fits the batch's plan (padded length, image size).
  bool fits() const {
    for (size_t f = 0; f < schema_.fields.size(); ++f) {
      const FieldSpec& spec = schema_.fields[f];
      const FieldPlan& plan = b_.plans[f];
      if (const int g = src_.group_of[f]; g >= 0) {
        const TransformGroup& group = *src_.groups[g];
        if (src_.group_leader[g] == f && !group.fixed_size()) {
          const std::vector<size_t>& fields = src_.group_fields[g];
          std::vector<MemberIO> io(fields.size());
          for (size_t i = 0; i < fields.size(); ++i)
            io[i] = {views_[fields[i]].data, views_[fields[i]].size};
          if (group.output_size(io.data()) != std::make_pair(plan.img_h, plan.img_w)) return false;
        }
        if (spec.variable() && spec.kind != FieldKind::kImage &&
            static_cast<int64_t>(views_[f].size / spec.row_bytes()) > plan.max_rows)
          return false;
      } else if (spec.kind == FieldKind::kImage) {
        const ImagePipeline& pipe = *src_.pipelines[f];
        if (pipe.fixed_size()) continue;
        auto s = pipe.output_size(views_[f].data, views_[f].size);
        if (s.first != plan.img_h || s.second != plan.img_w) return false;
      } else if (spec.kind == FieldKind::kVideo) {
        const VideoPipeline& vp = *src_.videos[f];
        if (vp.fixed_size()) continue;
        if (vp.output_size(views_[f].data, views_[f].size) !=
            std::make_pair(plan.img_h, plan.img_w))
          return false;
      } else if (spec.kind == FieldKind::kAudio) {
        const AudioPipeline::Shape s = src_.audios[f]->output_shape(views_[f].data, views_[f].size);
        if (s.channels != plan.channels || s.samples > plan.max_rows) return false;
      } else if (spec.variable() &&
                 static_cast<int64_t>(views_[f].size / spec.row_bytes()) > plan.max_rows) {
        return false;
      }
    }
    return true;
  }

  RecordBatch& b_;
  const RecordSource& src_;
  const Dataset& ds_;
  const Schema& schema_;
  uint8_t* base_;
  WorkerContext& ctx_;
  std::vector<RecordView>& views_;  // a per-thread buffer
  const bool time_each_;            // every sample timed (image fields): NOTE [ Stage times ]
  Clock::time_point unit_start_;    // when the unit started
  Clock::time_point last_;          // the end of the previous timed sample's work
  int64_t sampled_read_ns_ = 0, sampled_fields_ns_ = 0;  // the timed samples' stages
  RecordView next_;               // the next record, for the copy to prefetch (empty: none)
  int64_t bytes_ = 0;             // source bytes of this unit's samples
  int64_t image_decode_ns_ = -1;  // codec time of this record's images (-1: none)
};

uint64_t RecordBatch::group_seed(size_t g, int64_t pos, int64_t index) const {
  const uint64_t key =
      sample_keys.empty() ? static_cast<uint64_t>(index) : sample_keys[static_cast<size_t>(pos)];
  return sample_draw_seed(sample_seed_, static_cast<int64_t>(key),
                          src_->draw_keys[src_->group_fields[g][0]]);
}

void RecordBatch::partners(size_t g, int64_t pos, int64_t index, int64_t* out) const {
  src_->groups[g]->partners(group_seed(g, pos, index), dataset_of(pos).size(), out);
}

void RecordBatch::run(int u, uint8_t* base, WorkerContext& ctx) {
  const int64_t len = static_cast<int64_t>(indices.size());
  const int64_t lo = static_cast<int64_t>(u) * unit_samples;
  const int64_t hi = std::min(len, lo + unit_samples);
  if (sources.empty()) {
    SampleWriter(*this, *src_->ds, base, ctx).run(lo, hi);
    return;
  }
  // A mixture's batch: its samples come grouped by source, a run of each.
  for (int64_t a = lo; a < hi;) {
    const uint16_t s = sources[static_cast<size_t>(a)];
    int64_t e = a + 1;
    while (e < hi && sources[static_cast<size_t>(e)] == s) ++e;
    SampleWriter(*this, src_->dataset(s), base, ctx).run(a, e);
    if (ctx.stopped()) return;
    a = e;
  }
  const TensorDesc& t = tensors[source_tensor];
  for (int64_t p = lo; p < hi; ++p) {
    const int64_t s = sources[static_cast<size_t>(p)];
    std::memcpy(base + t.offset + static_cast<size_t>(p) * sizeof s, &s, sizeof s);
  }
}

// NOTE [ Batch transforms ]
// MixUp and CutMix mix each row with the row before it, so they run once the
// whole batch is written (BatchWork::finish). Their draw is keyed by (seed,
// epoch) and the batch's first dataset index and length: the same batch gets
// the same mix whatever the thread count, and a resumed loader, whose batches
// are the same, gets the same mixes. A mixture's batch is keyed by its first
// row's draw key in place of the index (which several sources share): the key
// of one source's c-th row, which no other batch of the epoch holds.
void RecordBatch::finish(uint8_t* base, WorkerContext& ctx) {
  if (!src_->mix || indices.empty()) return;
  set_activity(Activity::kDecoding);
  const auto t0 = std::chrono::steady_clock::now();
  const BatchMixSource& mix = *src_->mix;
  const Schema& schema = src_->ds->schema();
  const int64_t len = static_cast<int64_t>(indices.size());
  // The integer labels, as int64, each checked against num_classes with the
  // sample's file and record in the error.
  const FieldPlan& lp = plans[mix.labels];
  const FieldSpec& lf = schema.fields[mix.labels];
  thread_local std::vector<int64_t> labels;
  labels.resize(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    const uint8_t* p = base + lp.raw + static_cast<size_t>(i) * lp.sample_bytes;
    int64_t y = 0;
    switch (lf.dtype) {
      case DType::kUInt8:
        y = *p;
        break;
      case DType::kInt8:
        y = static_cast<int8_t>(*p);
        break;
      case DType::kUInt16: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        y = v;
        break;
      }
      case DType::kInt16: {
        int16_t v;
        std::memcpy(&v, p, 2);
        y = v;
        break;
      }
      case DType::kUInt32: {
        uint32_t v;
        std::memcpy(&v, p, 4);
        y = v;
        break;
      }
      case DType::kInt32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        y = v;
        break;
      }
      case DType::kUInt64: {
        uint64_t v;
        std::memcpy(&v, p, 8);
        y = v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v);
        break;
      }
      default:
        std::memcpy(&y, p, 8);
        break;
    }
    if (y < 0 || y >= mix.spec.num_classes) {
      try {
        STOKER_THROW(DataError, "batch_transforms: label ", y,
                     " is outside [0, num_classes=", mix.spec.num_classes, ")");
      } catch (...) {
        rethrow_with_context(dataset_of(i), indices[static_cast<size_t>(i)], lf.name);
      }
    }
    labels[static_cast<size_t>(i)] = y;
  }
  const FieldPlan& ip = plans[mix.image];
  const TensorDesc& img = tensors[ip.out];
  const bool chw = src_->layouts[mix.image] == ImageLayout::kCHW;
  const uint64_t first = sample_keys.empty() ? static_cast<uint64_t>(indices[0]) : sample_keys[0];
  uint64_t key = hash_combine(hash_combine(sample_seed_, 0x6d69787570ull /* "mixup" */), first);
  key = hash_combine(key, static_cast<uint64_t>(len));
  detail::SplitMix64 rng(key);
  const MixDraw d = draw_batch_mix(mix.spec, ip.img_h, ip.img_w, rng);
  mix_images(base + img.offset, img.dtype, chw, len, ip.img_h, ip.img_w, 3, d);
  mix_labels(labels.data(), len, mix.spec.num_classes, d,
             reinterpret_cast<float*>(base + tensors[lp.out].offset));
  ctx.times.ops_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
}

}  // namespace stoker
