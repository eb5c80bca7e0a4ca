#include "producers/record_producer.h"

#include <algorithm>

#include "common/error.h"
#include "producers/batch_planner.h"

namespace stoker {

namespace {

class RecordEpoch final : public EpochPlan {
 public:
  RecordEpoch(EpochOrder order, uint64_t sample_seed)
      : order(std::move(order)), sample_seed(sample_seed) {}
  int64_t num_batches() const override { return order.num_batches(); }

  const EpochOrder order;
  const uint64_t sample_seed;
};

}  // namespace

std::shared_ptr<RecordSource> make_record_source(std::shared_ptr<const Dataset> ds,
                                                 const RecordOptions& opts) {
  STOKER_CHECK(ds != nullptr, UsageError, "RecordProducer: no dataset");
  auto source = std::make_shared<RecordSource>();
  const Schema& schema = ds->schema();
  const size_t nf = schema.fields.size();
  auto image_field = [&](const std::string& name, const char* what) {
    const size_t f = schema.index_of(name);
    STOKER_CHECK(schema.fields[f].kind == FieldKind::kImage, UsageError, "field '", name,
                 "' is not an image field; ", what, " apply to stoker.image() fields only");
    return f;
  };
  for (const auto& [name, spec] : opts.images) image_field(name, "image options");
  auto image_spec = [&](const std::string& name) {
    auto it = opts.images.find(name);
    return it != opts.images.end() ? it->second : ImageFieldSpec{};
  };
  // NOTE [ Random draws ]: each field is keyed by its group.
  RecordSource& src = *source;
  std::vector<const TransformSpec*> group_of(nf, nullptr);
  src.draw_keys.resize(nf);
  src.group_of.assign(nf, -1);
  src.member_of.assign(nf, -1);
  src.pad_values.resize(nf);
  src.layouts.resize(nf);
  for (size_t f = 0; f < nf; ++f) {
    src.draw_keys[f] = f;
    src.layouts[f] = image_spec(schema.fields[f].name).layout;
  }
  for (const TransformSpec& t : opts.transforms) {
    STOKER_CHECK(!t.fields.empty(), UsageError, "a transform names no field");
    STOKER_CHECK(t.targets.empty() || t.targets.size() == t.fields.size(), UsageError,
                 "a transform group gives ", t.targets.size(), " target kinds for ",
                 t.fields.size(), " fields");
    std::vector<size_t> fields;
    for (const std::string& name : t.fields) {
      const size_t f = schema.index_of(name);
      STOKER_CHECK(group_of[f] == nullptr, UsageError, "field '", name,
                   "' has two lists of transforms");
      group_of[f] = &t;
      src.draw_keys[f] = schema.index_of(t.fields[0]);
      fields.push_back(f);
    }
    // (A Mosaic reads more samples: only a group runs it, even for an image alone.)
    const bool one_image = t.fields.size() == 1 && samples_read(t.ops) == 1 &&
                           (t.targets.empty() || t.targets[0].kind == GroupMember::Kind::kImage);
    GroupSpec g;
    g.ops = t.ops;
    bool have_image = false;
    for (size_t i = 0; i < fields.size(); ++i) {
      const FieldSpec& fs = schema.fields[fields[i]];
      const TargetSpec ts = t.targets.empty() ? TargetSpec{} : t.targets[i];
      GroupMember m;
      m.kind = ts.kind;
      m.name = fs.name;
      const bool floats = fs.dtype == DType::kFloat32 && fs.kind == FieldKind::kNDArray;
      switch (ts.kind) {
        case GroupMember::Kind::kImage:
          image_field(fs.name, "image ops");
          g.image = image_spec(fs.name);
          have_image = true;
          break;
        case GroupMember::Kind::kMask:
          if (fs.kind == FieldKind::kImage) {
            m.encoded = true;
            if (!have_image) g.image = image_spec(fs.name);
          } else {
            const auto& sh = fs.shape;
            const bool shaped = fs.kind == FieldKind::kNDArray && !fs.variable() &&
                                (sh.size() == 2 || (sh.size() == 3 && sh[2] == 1)) && sh[0] > 0 &&
                                sh[1] > 0;
            STOKER_CHECK(shaped && dtype_is_integer(fs.dtype), UsageError, "field '", fs.name,
                         "' cannot be a mask: a mask is stoker.image(mode='L') or an integer "
                         "ndarray of fixed shape (h, w) or (h, w, 1)");
            m.encoded = false;
            m.elem_bytes = static_cast<int>(dtype_size(fs.dtype));
            m.signed_elems = fs.dtype == DType::kInt8 || fs.dtype == DType::kInt16 ||
                             fs.dtype == DType::kInt32 || fs.dtype == DType::kInt64;
            m.array_h = static_cast<int>(sh[0]);
            m.array_w = static_cast<int>(sh[1]);
          }
          break;
        case GroupMember::Kind::kBoxes:
          STOKER_CHECK(floats && fs.shape == std::vector<int64_t>({-1, 4}), UsageError, "field '",
                       fs.name, "' cannot be boxes: boxes are float32 (None, 4) (stoker.boxes())");
          m.format = ts.format;
          m.normalized = ts.normalized;
          break;
        case GroupMember::Kind::kKeypoints:
          STOKER_CHECK(floats && fs.shape.size() == 3 && fs.shape[0] == -1 && fs.shape[1] > 0 &&
                           fs.shape[2] == 3,
                       UsageError, "field '", fs.name,
                       "' cannot be keypoints: keypoints are float32 (None, k, 3) "
                       "(stoker.keypoints(k))");
          m.num_keypoints = static_cast<int>(fs.shape[1]);
          m.normalized = ts.normalized;
          break;
        case GroupMember::Kind::kRows:
          STOKER_CHECK(fs.variable() && fs.kind != FieldKind::kImage, UsageError, "field '",
                       fs.name,
                       "' has no geometry to follow: a group takes images, masks, boxes, "
                       "keypoints and variable-length per-box rows (class ids), not a "
                       "fixed-size field");
          m.row_bytes = fs.row_bytes();
          break;
      }
      g.members.push_back(std::move(m));
    }
    // Every group is checked as a group (ops that need boxes or keypoints, mask
    // fills); an RGB image alone then runs on its own pipeline, as before groups.
    auto group = std::make_unique<TransformGroup>(std::move(g));
    if (one_image) continue;
    const int gi = static_cast<int>(src.groups.size());
    for (size_t i = 0; i < fields.size(); ++i) {
      src.group_of[fields[i]] = gi;
      src.member_of[fields[i]] = static_cast<int>(i);
    }
    src.group_leader.push_back(*std::min_element(fields.begin(), fields.end()));
    src.group_fields.push_back(fields);
    src.groups.push_back(std::move(group));
  }
  for (size_t f = 0; f < nf; ++f) {
    if (schema.fields[f].kind != FieldKind::kImage || src.group_of[f] >= 0) {
      src.pipelines.emplace_back();
      continue;
    }
    src.pipelines.push_back(
        std::make_unique<ImagePipeline>(image_spec(schema.fields[f].name),
                                        group_of[f] ? group_of[f]->ops : std::vector<ImageOp>{}));
  }
  // Video and audio fields (NOTE [ Clip sampling ], [ Audio crops ]): each its own
  // draws, keyed by the field as a group of one is.
  for (const auto& [name, spec] : opts.videos)
    STOKER_CHECK(schema.fields[schema.index_of(name)].kind == FieldKind::kVideo, UsageError,
                 "field '", name, "' is not a video field; clips apply to stoker.video() fields");
  for (const auto& [name, spec] : opts.audios)
    STOKER_CHECK(schema.fields[schema.index_of(name)].kind == FieldKind::kAudio, UsageError,
                 "field '", name,
                 "' is not an audio field; audio crops apply to stoker.audio() "
                 "fields");
  src.videos.resize(nf);
  src.audios.resize(nf);
  for (size_t f = 0; f < nf; ++f) {
    const FieldSpec& fs = schema.fields[f];
    STOKER_CHECK(
        group_of[f] == nullptr || (fs.kind != FieldKind::kVideo && fs.kind != FieldKind::kAudio),
        UsageError, "field '", fs.name, "' is a ", fs.kind == FieldKind::kVideo ? "video" : "audio",
        " field: its clip and ops go in RecordOptions.videos / audios");
    if (fs.kind == FieldKind::kVideo) {
      auto it = opts.videos.find(fs.name);
      STOKER_CHECK(it != opts.videos.end(), UsageError, "video field '", fs.name,
                   "' needs a clip: transforms={'", fs.name,
                   "': [stoker.ops.RandomClip(16), ...]} (or CenterClip)");
      src.videos[f] = std::make_unique<VideoPipeline>(it->second);
    } else if (fs.kind == FieldKind::kAudio) {
      auto it = opts.audios.find(fs.name);
      src.audios[f] =
          std::make_unique<AudioPipeline>(it != opts.audios.end() ? it->second : AudioFieldSpec{});
    }
  }
  for (const auto& [name, value] : opts.pad_values) {
    const size_t f = schema.index_of(name);
    const FieldSpec& fs = schema.fields[f];
    STOKER_CHECK(fs.variable() && fs.kind != FieldKind::kImage && fs.kind != FieldKind::kVideo &&
                     fs.kind != FieldKind::kAudio,
                 UsageError, "pad_values: field '", name,
                 "' is not a variable-length field: only those are padded");
    const size_t elem = fs.kind == FieldKind::kBlob ? 1 : dtype_size(fs.dtype);
    STOKER_CHECK(value.size() == elem, UsageError, "pad_values: field '", name, "' takes ", elem,
                 "-byte values, got ", value.size(), " bytes");
    src.pad_values[f] = value;
  }
  if (opts.mix) {
    const BatchMixOptions& m = *opts.mix;
    STOKER_CHECK(m.spec.mixup || m.spec.cutmix, UsageError,
                 "batch_transforms: MixUp or CutMix, got neither");
    STOKER_CHECK(m.spec.num_classes > 0, UsageError, "batch_transforms: num_classes must be > 0");
    BatchMixSource mix;
    mix.spec = m.spec;
    mix.image = image_field(m.image, "MixUp and CutMix");
    STOKER_CHECK(
        src.group_of[mix.image] < 0 ||
            src.groups[src.group_of[mix.image]]->image_member() == src.member_of[mix.image],
        UsageError, "batch_transforms: '", m.image, "' is a mask, not an RGB image");
    mix.labels = schema.index_of(m.labels);
    const FieldSpec& lf = schema.fields[mix.labels];
    STOKER_CHECK(lf.kind == FieldKind::kScalar && dtype_is_integer(lf.dtype), UsageError,
                 "batch_transforms: labels field '", m.labels,
                 "' must be an integer scalar (stoker.scalar('int64')), one class id per sample");
    src.mix = mix;
  }
  src.ds = std::move(ds);
  src.skip_errors = opts.skip_errors;
  src.verify = opts.verify;
  // One cache slot per record and image field, whatever the field's mode and
  // transforms (the schema alone says how many: stoker/_cache.py image_fields);
  // the images decoded as RGB, each on its own pipeline or as its group's
  // image, use theirs, and a mask's stays empty.
  src.cache_field.assign(nf, -1);
  int rgb_fields = 0;
  for (size_t f = 0; f < nf; ++f) {
    if (schema.fields[f].kind != FieldKind::kImage) continue;
    const int place = src.cache_fields++;
    const int g = src.group_of[f];
    const bool rgb =
        g >= 0 ? src.groups[g]->image_member() == src.member_of[f] : src.pipelines[f] != nullptr;
    if (rgb) {
      src.cache_field[f] = place;
      ++rgb_fields;
    }
  }
  if (opts.cache) {
    const int64_t want = src.ds->size() * src.cache_fields;
    STOKER_CHECK(rgb_fields > 0, UsageError,
                 "cache='decoded' keeps decoded RGB images, and this dataset has no "
                 "stoker.image() field of mode 'RGB'");
    STOKER_CHECK(opts.cache->options().slots == want, UsageError, "the decoded cache has ",
                 opts.cache->options().slots, " image slots, this dataset needs ", want, " (",
                 src.ds->size(), " records x ", src.cache_fields, " image fields)");
    src.cache = opts.cache;
  }
  return source;
}

RecordProducer::RecordProducer(std::shared_ptr<const Dataset> ds, RecordOptions opts)
    : source_(make_record_source(ds, opts)), opts_(std::move(opts)) {
  const Dataset& d = *source_->ds;
  shard_records_.reserve(d.num_shards());
  for (size_t s = 0; s < d.num_shards(); ++s) shard_records_.push_back(d.shard_info(s).num_records);
  // Validates the sampling options once, here, rather than at the first epoch.
  if (!sampler_batches(opts_.sampler))
    EpochOrder(shard_records_, counting_options(opts_.sampler), 0, 0, 1, 0);
  // NOTE [ Warm mappings ]: the shards of epoch 0, in the whole job's order.
  const size_t budget = opts_.warm_bytes < 0 ? MappingWarmer::default_budget()
                                             : static_cast<size_t>(opts_.warm_bytes);
  std::vector<size_t> order;  // (a user sampler's order is not listed yet: none)
  if (budget > 0 && !source_->ds->deferred() && !opts_.sampler.listed)
    order = shard_schedule(0, 1, 0, source_->ds->num_shards());
  warmer_ = std::make_unique<MappingWarmer>(source_->ds, std::move(order), budget);
}

// Counts do not depend on the order, so they need no shard layout.
int64_t RecordProducer::num_batches(int64_t rank, int64_t world_size) const {
  if (sampler_batches(opts_.sampler)) return opts_.sampler.listed->num_batches();
  return EpochOrder(source_->ds->size(), counting_options(opts_.sampler), 0, rank, world_size, 0)
      .num_batches();
}

int64_t RecordProducer::rank_samples(int64_t rank, int64_t world_size) const {
  if (sampler_batches(opts_.sampler)) return opts_.sampler.listed->num_samples();
  return EpochOrder(source_->ds->size(), counting_options(opts_.sampler), 0, rank, world_size, 0)
      .num_samples();
}

int64_t RecordProducer::consumed_after(const EpochKey& key, int64_t batches) const {
  return EpochOrder(source_->ds->size(), counting_options(opts_.sampler), key.epoch, key.rank,
                    key.world_size, key.offset, key.pad_from)
      .consumed_after(batches);
}

EpochOrder RecordProducer::epoch_order(const EpochKey& key) const {
  return EpochOrder(shard_records_, opts_.sampler, key.epoch, key.rank, key.world_size, key.offset,
                    key.pad_from);
}

std::vector<size_t> RecordProducer::shard_schedule(uint64_t epoch, int64_t world_size,
                                                   int64_t from_position, size_t max_shards) const {
  EpochKey key;
  key.epoch = epoch;
  key.world_size = world_size;  // rank 0: the schedule is the whole job's
  return epoch_order(key).shard_schedule(from_position, max_shards);
}

std::shared_ptr<const EpochPlan> RecordProducer::plan_epoch(const EpochKey& key) const {
  return std::make_shared<RecordEpoch>(epoch_order(key),
                                       hash_combine(opts_.sampler.seed, key.epoch));
}

std::unique_ptr<BatchWork> RecordProducer::plan_batch(const EpochPlan& epoch, int64_t k) const {
  const auto& e = static_cast<const RecordEpoch&>(epoch);
  const int64_t len = e.order.batch_length(k);
  std::vector<int64_t> indices(static_cast<size_t>(len));
  e.order.batch_indices(k, indices.data());
  // A URL's shards not local yet: the first batch's records are asked for by range
  // now, together (NOTE [ Records by range ] in format/record_ranges.h).
  if (k == 0) source_->ds->want_records(indices.data(), indices.size());
  // About four units per thread, so the first batch is ready after 1/T of its work.
  int64_t unit = opts_.unit_samples;
  if (unit <= 0) {
    const int64_t parts = 4 * std::max(1, opts_.threads_hint);
    unit = std::max<int64_t>(1, (opts_.sampler.batch_size + parts - 1) / parts);
  }
  unit = std::max<int64_t>(unit, (len + 65534) / 65535);  // at most 65535 units
  auto b = std::make_unique<RecordBatch>(source_, e.sample_seed);
  plan_record_batch(*source_, std::move(indices), unit, *b);
  b->handoff = opts_.handoff;
  return b;
}

}  // namespace stoker
