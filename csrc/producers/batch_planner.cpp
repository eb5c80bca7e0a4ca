#include "producers/batch_planner.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "common/error.h"
#include "common/stop_flag.h"
#include "producers/sample_writer.h"

namespace stoker {

namespace {

constexpr size_t kTensorAlign = 64;
size_t align_up(size_t n) { return (n + kTensorAlign - 1) / kTensorAlign * kTensorAlign; }

// A pin, and the dataset it is of (a mixture's batch reads several).
struct Held {
  Dataset::ShardPin pin;
  const Dataset* ds = nullptr;
};

// Reads sample `index` of `ds` verified and split into `views`, which stay valid
// while `hold` holds its shard or record (deferred shards: NOTE [ Released shards ]
// in format/shard_gate.h, NOTE [ Records by range ] in format/record_ranges.h); a
// failure is that sample's error, with its file, record and field.

bool read_for_plan(const RecordSource& src, const Dataset& ds, int64_t index,
                   const std::string& field, std::vector<RecordView>& views, Held& hold,
                   bool verify, std::exception_ptr& first_error) {
  try {
    try {
      const Dataset::Location loc = ds.locate(index);
      if (ds.deferred() && (hold.ds != &ds || !hold.pin.holds(loc.shard))) {
        hold.pin.reset();  // never hold one shard while waiting for another
        hold.pin = ds.pin_record(loc);
        hold.ds = &ds;
      }
      ds.read(hold.pin, loc, views.data(), verify ? src.verify : Verify::kNever);
      return true;
    } catch (...) {
      rethrow_with_context(ds, index, field);
    }
  } catch (...) {
    // on_error="skip" passes over a failed download too (its shard is fetched again
    // on a later demand: NOTE [ Deferred shards ] in format/shard_gate.h).
    if (!src.skip_errors) throw;
    if (!first_error) first_error = std::current_exception();
    return false;
  }
}

// on_error="skip": reads into `views` the sample that the sample writer puts in
// place of the unreadable sample `index` (the next readable one in dataset
// order), so that a batch is sized by what it will hold even when none of its
// own samples can be read (a whole batch inside a shard whose download failed).
// False if there is none, or the worker's stream stopped.
bool read_replacement(const RecordSource& src, const Dataset& ds, int64_t index,
                      const std::string& field, std::vector<RecordView>& views, Held& hold,
                      bool verify) {
  const int64_t n = ds.size();
  for (int64_t step = 1; step < n && !stop_requested(); ++step) {
    std::exception_ptr ignored;
    if (read_for_plan(src, ds, (index + step) % n, field, views, hold, verify, ignored))
      return true;
  }
  return false;
}

}  // namespace

void plan_record_batch(const RecordSource& src, std::vector<int64_t> indices, int64_t unit_samples,
                       RecordBatch& b) {
  const Schema& schema = src.ds->schema();
  const int64_t len = static_cast<int64_t>(indices.size());
  b.indices = std::move(indices);
  b.samples = len;
  b.unit_samples = std::max<int64_t>(1, unit_samples);
  b.units = static_cast<int>(std::max<int64_t>(1, (len + b.unit_samples - 1) / b.unit_samples));
  b.plans.assign(schema.fields.size(), FieldPlan{});
  b.tensors.clear();
  size_t offset = 0;
  auto add_tensor = [&](std::string name, DType dt, std::vector<int64_t> shape) {
    size_t n = dtype_size(dt);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    b.tensors.push_back(TensorDesc{std::move(name), dt, std::move(shape), offset, n});
    offset = align_up(offset + n);
    return b.tensors.size() - 1;
  };

  std::vector<RecordView> views(schema.fields.size());
  Held hold;  // the shard the views point into (releasable datasets)
  // The output size of every image and group whose ops do not fix it: the one
  // size all its images share, read from their headers.
  auto common_size = [&](const std::string& name, const auto& size_of) {
    std::exception_ptr first_error;
    bool have = false;
    std::pair<int, int> hw;
    for (int64_t p = 0; p < len; ++p) {
      const int64_t idx = b.indices[static_cast<size_t>(p)];
      const Dataset& ds = b.dataset_of(p);  // a mixture's row: its own source's
      // An image header is parsed: verified first (a corrupt one is that sample's
      // DataError, never a misleading size error).
      if (!read_for_plan(src, ds, idx, name, views, hold, true, first_error) &&
          !read_replacement(src, ds, idx, name, views, hold, true))
        continue;
      std::pair<int, int> s;
      try {
        try {
          s = size_of();
        } catch (...) {
          rethrow_with_context(ds, idx, name);
        }
      } catch (...) {
        if (!src.skip_errors) throw;
        if (!first_error) first_error = std::current_exception();
        continue;
      }
      if (!have) {
        hw = s;
        have = true;
      } else if (s != hw) {
        STOKER_THROW(UsageError, "images of field '", name, "' have different sizes (", hw.first,
                     "x", hw.second, " and ", s.first, "x", s.second, " at sample ", idx,
                     "); add a crop to its transforms, e.g. stoker.ops.CenterCrop(224), "
                     "to batch them");
      }
    }
    if (!have && first_error) std::rethrow_exception(first_error);
    return hw;  // (0, 0) for an empty batch
  };
  std::vector<std::pair<int, int>> group_hw(src.groups.size());
  std::vector<MemberIO> io;
  for (size_t g = 0; g < src.groups.size(); ++g) {
    const TransformGroup& group = *src.groups[g];
    if (auto fixed = group.fixed_size()) {
      group_hw[g] = *fixed;
      continue;
    }
    const std::vector<size_t>& fields = src.group_fields[g];
    group_hw[g] = common_size(schema.fields[src.group_leader[g]].name, [&] {
      io.assign(fields.size(), MemberIO{});
      for (size_t i = 0; i < fields.size(); ++i)
        io[i] = {views[fields[i]].data, views[fields[i]].size};
      return group.output_size(io.data());
    });
  }

  for (size_t f = 0; f < schema.fields.size(); ++f) {
    const FieldSpec& spec = schema.fields[f];
    FieldPlan& plan = b.plans[f];
    const int g = src.group_of[f];
    const GroupMember* member =
        g >= 0 ? &src.groups[g]->spec().members[static_cast<size_t>(src.member_of[f])] : nullptr;
    const bool chw = src.layouts[f] == ImageLayout::kCHW;
    if (member && member->kind == GroupMember::Kind::kImage) {
      const auto [h, w] = group_hw[g];
      const DType dt = src.groups[g]->image_dtype();
      plan.img_h = h;
      plan.img_w = w;
      plan.sample_bytes = static_cast<size_t>(h) * w * 3 * dtype_size(dt);
      plan.out =
          add_tensor(spec.name, dt,
                     chw ? std::vector<int64_t>{len, 3, h, w} : std::vector<int64_t>{len, h, w, 3});
    } else if (member && member->kind == GroupMember::Kind::kMask) {
      const auto [h, w] = group_hw[g];
      plan.img_h = h;
      plan.img_w = w;
      plan.sample_bytes = static_cast<size_t>(h) * w * member->elem_bytes;
      std::vector<int64_t> shape;
      if (member->encoded)  // an image of one channel, in its layout
        shape = chw ? std::vector<int64_t>{len, 1, h, w} : std::vector<int64_t>{len, h, w, 1};
      else  // an array of the field's shape, at the output size
        shape = spec.shape.size() == 3 ? std::vector<int64_t>{len, h, w, 1}
                                       : std::vector<int64_t>{len, h, w};
      plan.out = add_tensor(spec.name, member->encoded ? DType::kUInt8 : spec.dtype, shape);
    } else if (spec.kind == FieldKind::kImage) {
      const ImagePipeline& pipe = *src.pipelines[f];
      std::pair<int, int> hw;
      if (auto fixed = pipe.fixed_size())
        hw = *fixed;
      else
        hw = common_size(spec.name, [&] { return pipe.output_size(views[f].data, views[f].size); });
      plan.img_h = hw.first;
      plan.img_w = hw.second;
      plan.sample_bytes =
          static_cast<size_t>(hw.first) * hw.second * 3 * dtype_size(pipe.out_dtype());
      std::vector<int64_t> shape = pipe.layout() == ImageLayout::kCHW
                                       ? std::vector<int64_t>{len, 3, hw.first, hw.second}
                                       : std::vector<int64_t>{len, hw.first, hw.second, 3};
      plan.out = add_tensor(spec.name, pipe.out_dtype(), shape);
    } else if (spec.kind == FieldKind::kVideo) {
      const VideoPipeline& vp = *src.videos[f];
      std::pair<int, int> hw;
      if (auto fixed = vp.fixed_size())
        hw = *fixed;
      else
        hw = common_size(spec.name, [&] { return vp.output_size(views[f].data, views[f].size); });
      const auto [h, w] = hw;
      const int64_t t = vp.num_frames();
      plan.img_h = h;
      plan.img_w = w;
      plan.sample_bytes = static_cast<size_t>(t) * vp.frame_bytes(h, w);
      plan.out =
          add_tensor(spec.name, vp.out_dtype(),
                     vp.layout() == ImageLayout::kCHW ? std::vector<int64_t>{len, t, 3, h, w}
                                                      : std::vector<int64_t>{len, t, h, w, 3});
      plan.pts = add_tensor(spec.name + "_pts", DType::kFloat64, {len, t});
    } else if (spec.kind == FieldKind::kAudio) {
      // One channel count for the batch; rows of the crop's length, or of the
      // longest sample without one (NOTE [ Audio crops ]).
      const AudioPipeline& ap = *src.audios[f];
      std::exception_ptr first_error;
      bool have = false;
      AudioPipeline::Shape common;
      int64_t longest = 0;
      for (int64_t p = 0; p < len; ++p) {
        const int64_t idx = b.indices[static_cast<size_t>(p)];
        const Dataset& ds = b.dataset_of(p);
        if (!read_for_plan(src, ds, idx, spec.name, views, hold, true, first_error) &&
            !read_replacement(src, ds, idx, spec.name, views, hold, true))
          continue;
        AudioPipeline::Shape s;
        try {
          try {
            s = ap.output_shape(views[f].data, views[f].size);
          } catch (...) {
            rethrow_with_context(ds, idx, spec.name);
          }
        } catch (...) {
          if (!src.skip_errors) throw;
          if (!first_error) first_error = std::current_exception();
          continue;
        }
        if (!have) {
          common = s;
          have = true;
        } else if (s.channels != common.channels || s.rate != common.rate) {
          STOKER_THROW(UsageError, "audio of field '", spec.name, "' comes as ", common.rate,
                       " Hz x ", common.channels, " and ", s.rate, " Hz x ", s.channels,
                       " (sample ", idx,
                       "); give the field a sample_rate and channels to batch "
                       "them: stoker.audio(sample_rate=16000, channels=1)");
        }
        longest = std::max(longest, s.samples);
      }
      if (!have && len > 0 && first_error) std::rethrow_exception(first_error);
      const int64_t crop = ap.crop_samples(common.rate);
      plan.max_rows = crop >= 0 ? crop : longest;
      plan.channels = common.channels;
      plan.sample_bytes = static_cast<size_t>(plan.channels) * plan.max_rows * sizeof(float);
      plan.out = add_tensor(spec.name, DType::kFloat32, {len, plan.channels, plan.max_rows});
      plan.lengths = add_tensor(spec.name + "_lengths", DType::kInt64, {len});
    } else if (!spec.variable()) {
      plan.sample_bytes = spec.fixed_bytes();
      if (src.mix && src.mix->labels == f) {
        // Soft labels out, the integer labels written aside for finish().
        plan.out = add_tensor(spec.name, DType::kFloat32, {len, src.mix->spec.num_classes});
        plan.raw = offset;
        offset = align_up(offset + static_cast<size_t>(len) * plan.sample_bytes);
        continue;
      }
      std::vector<int64_t> shape{len};
      shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
      plan.out = add_tensor(spec.name, spec.dtype, shape);
    } else {
      // Padded to the longest valid sample of the batch; a group that reads more
      // samples (a Mosaic) holds the rows of all of them.
      int64_t max_rows = 0;
      const size_t row = spec.row_bytes();
      const int others = g >= 0 ? src.groups[g]->samples() - 1 : 0;
      int64_t partner[8];
      std::exception_ptr first_error;
      bool have = false;
      for (int64_t p = 0; p < len; ++p) {
        // Only the length is used, bounded by the record's own size: no checksum here
        // (the sample writer verifies the record, and a length that differs from the
        // verified one is that sample's error, or under on_error="skip" a padding a
        // little longer than needed).
        const int64_t idx = b.indices[static_cast<size_t>(p)];
        const Dataset& ds = b.dataset_of(p);
        if (!read_for_plan(src, ds, idx, spec.name, views, hold, false, first_error) &&
            !read_replacement(src, ds, idx, spec.name, views, hold, false))
          continue;
        have = true;
        int64_t rows = static_cast<int64_t>(views[f].size / row);
        if (others > 0) {
          b.partners(static_cast<size_t>(g), p, idx, partner);
          for (int k = 0; k < others; ++k)
            if (read_for_plan(src, ds, partner[k], spec.name, views, hold, false, first_error))
              rows += static_cast<int64_t>(views[f].size / row);
        }
        max_rows = std::max<int64_t>(max_rows, rows);
      }
      if (!have && len > 0) std::rethrow_exception(first_error);
      plan.max_rows = max_rows;
      plan.sample_bytes = static_cast<size_t>(max_rows) * row;
      std::vector<int64_t> shape{len, max_rows};
      if (spec.kind == FieldKind::kNDArray)
        shape.insert(shape.end(), spec.shape.begin() + 1, spec.shape.end());
      plan.out =
          add_tensor(spec.name, spec.kind == FieldKind::kBlob ? DType::kUInt8 : spec.dtype, shape);
      plan.lengths = add_tensor(spec.name + "_lengths", DType::kInt64, {len});
    }
  }
  if (b.mixture) b.source_tensor = add_tensor("source", DType::kInt64, {len});
  b.bytes = offset;
}

}  // namespace stoker
