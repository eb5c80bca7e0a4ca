// Batches of a sharded record dataset: the producer behind stoker.Loader over
// a stoker.Dataset (fixed-shape arrays, scalars, padded variable-length arrays
// and blobs, images decoded and transformed in C++).
//
// Batch k of an epoch is planned once (batch_planner.h: which samples, the
// output layout, one slot) and then written in units of a few samples each
// (sample_writer.h), by any number of workers at once: each sample writes only
// its own rows, so the bytes do not depend on which thread wrote what.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "augment/audio_pipeline.h"
#include "augment/batch_mix.h"
#include "cache/decoded_cache.h"
#include "format/dataset.h"
#include "geometry/image_pipeline.h"
#include "geometry/transform_group.h"
#include "geometry/video_pipeline.h"
#include "pipeline/batch_producer.h"
#include "producers/mapping_warmer.h"
#include "sampler/permutation.h"
#include "sampler/sampler.h"

namespace stoker {

/// What one field of a transform group is, as its Python field type says
/// (transform_group.h): an RGB image, a mask (an image of mode "L", or an
/// integer array of the image's size), boxes, keypoints, or per-box rows.
/// The rest (row sizes, the number of keypoints, an array mask's size and
/// element size) comes from the schema.
struct TargetSpec {
  GroupMember::Kind kind = GroupMember::Kind::kImage;
  BoxFormat format = BoxFormat::kXYXY;  ///< boxes
  bool normalized = false;              ///< boxes, keypoints
};

/// Ops applied to a group of fields with one set of random draws per sample
/// (NOTE [ Random draws ]).
struct TransformSpec {
  std::vector<std::string> fields;
  std::vector<ImageOp> ops;         ///< applied in order
  std::vector<TargetSpec> targets;  ///< per field; empty: RGB images
};

/// MixUp / CutMix on each assembled batch (augment/batch_mix.h): `image` mixed
/// in place, the integer field `labels` delivered as soft labels, float32
/// (batch, num_classes).
struct BatchMixOptions {
  BatchMixSpec spec;
  std::string image;
  std::string labels;
};

struct RecordOptions {
  SamplerOptions sampler;
  bool skip_errors = false;  ///< replace a bad sample by the next valid one, counted
  /// When a record's checksum is hashed: the first read in this process, or every
  /// read (NOTE [ Verified once ] in format/shard_reader.h).
  Verify verify = Verify::kFirst;
  /// Decoded pixels of the RGB image fields kept here (Loader(cache="decoded")):
  /// slots() = records x RGB image fields, in schema order. Not with a mixture.
  std::shared_ptr<DecodedCache> cache;
  std::map<std::string, ImageFieldSpec> images;  ///< per image field; others use defaults
  /// Per video field: its clip and frame ops (a video field needs one).
  std::map<std::string, VideoFieldSpec> videos;
  std::map<std::string, AudioFieldSpec> audios;  ///< per audio field; others as stored
  std::vector<TransformSpec> transforms;         ///< a field is in one group at most
  /// Per variable-length field: one element (its dtype's bytes) that pads
  /// samples shorter than the batch's longest; others pad with zeros.
  std::map<std::string, std::vector<uint8_t>> pad_values;
  std::optional<BatchMixOptions> mix;
  /// Samples per unit of work; 0 = chosen from the batch size and `threads`.
  int64_t unit_samples = 0;
  int threads_hint = 1;
  /// Hand each assembled batch to the loader's finisher (batch_map in the
  /// Python stage: pipeline/batch_handoff.h) before it is published.
  bool handoff = false;
  /// Bytes of the shards the first epoch reads that are mapped and faulted in
  /// when the producer is made (NOTE [ Warm mappings ] in mapping_warmer.h);
  /// -1: MappingWarmer::default_budget(), 0: none.
  int64_t warm_bytes = -1;
};

// NOTE [ Random draws ]
// The ops of one sample draw from a stream seeded by (seed, epoch), the
// sample's dataset index and the key of its transform group: the schema
// position of the group's first field. So a sample's draws do not depend on
// the thread, the batch or the position in it, and every field of a group
// (an image and its mask) sees the same crop and flip. A group of one field
// is keyed by that field, as fields were keyed before groups existed.

/// The seed of the draws of sample `index`'s transform group `key`, from the
/// epoch's seed hash_combine(seed, epoch).
inline uint64_t sample_draw_seed(uint64_t epoch_seed, int64_t index, uint64_t key) {
  return hash_combine(epoch_seed, static_cast<uint64_t>(index) * 64 + key);
}

/// The mix of batch_transforms, resolved to schema fields.
struct BatchMixSource {
  BatchMixSpec spec;
  size_t image = 0;   ///< field index
  size_t labels = 0;  ///< field index
};

/// What workers share: the dataset, one image pipeline per RGB image field
/// alone, one TransformGroup per group with targets.
struct RecordSource {
  std::shared_ptr<const Dataset> ds;
  /// A mixture's datasets, all with ds's schema (sets[0] is ds); empty otherwise.
  std::vector<std::shared_ptr<const Dataset>> sets;
  std::vector<std::unique_ptr<ImagePipeline>> pipelines;  ///< per field; null if not an image alone
  std::vector<std::unique_ptr<VideoPipeline>> videos;     ///< per field; null if not a video
  std::vector<std::unique_ptr<AudioPipeline>> audios;     ///< per field; null if not audio
  std::vector<std::unique_ptr<TransformGroup>> groups;
  std::vector<int> group_of;                      ///< per field: its TransformGroup, or -1
  std::vector<int> member_of;                     ///< per field in a group: its member index there
  std::vector<size_t> group_leader;               ///< per group: its first field in schema order
  std::vector<std::vector<size_t>> group_fields;  ///< per group: the field of each member
  std::vector<ImageLayout> layouts;               ///< per field: an image field's layout
  std::vector<uint64_t> draw_keys;  ///< per field: its group's key (NOTE [ Random draws ])
  std::vector<std::vector<uint8_t>> pad_values;  ///< per field: one element; empty: zeros
  std::optional<BatchMixSource> mix;
  bool skip_errors = false;
  Verify verify = Verify::kFirst;       ///< RecordOptions::verify
  std::shared_ptr<DecodedCache> cache;  ///< RecordOptions::cache
  std::vector<int> cache_field;         ///< per field: its place among the image fields if it is
                                        ///< decoded as RGB (a cached image), else -1
  int cache_fields = 0;                 ///< image fields: the cache's slots per record

  /// Where the decoded pixels of field `f` of record `index` of ds are kept
  /// (none for a field that is not an RGB image, or without a cache).
  CacheSlot cache_slot(size_t f, int64_t index) const {
    if (!cache || cache_field[f] < 0) return {};
    return {cache.get(), index * cache_fields + cache_field[f]};
  }

  /// The dataset of a batch's source `s` (a mixture's), else ds.
  const Dataset& dataset(size_t s) const { return sets.empty() ? *ds : *sets[s]; }
};

/// The source of `opts`'s batches (also the Python stage's fetch of one
/// sample: stage/sample_fetcher.h). UsageError for image specs or
/// transforms naming non-image or unknown fields, or a field in two groups.
std::shared_ptr<RecordSource> make_record_source(std::shared_ptr<const Dataset> ds,
                                                 const RecordOptions& opts);

class RecordProducer final : public BatchProducer {
 public:
  /// UsageError for image specs or transforms naming non-image or unknown
  /// fields, or a field in two transform groups.
  RecordProducer(std::shared_ptr<const Dataset> ds, RecordOptions opts);

  int64_t num_batches(int64_t rank, int64_t world_size) const override;
  int64_t rank_samples(int64_t rank, int64_t world_size) const override;
  int64_t epoch_samples() const override {
    return sampler_batches(opts_.sampler) ? opts_.sampler.listed->num_samples()
                                          : source_->ds->size();
  }
  int64_t consumed_after(const EpochKey& key, int64_t batches) const override;
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const override;
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& epoch, int64_t k) const override;
  void close() const override { warmer_->stop(); }

  const Dataset& dataset() const { return *source_->ds; }
  /// The order of one epoch (for one rank, from an offset), as plan_epoch uses
  /// it: EpochOrder::shard_schedule says which shards it reads next.
  EpochOrder epoch_order(const EpochKey& key) const;
  /// The shards the whole job reads in `epoch` from global position
  /// `from_position` on (EpochOrder::shard_schedule), for a remote dataset's
  /// fetcher: what to download next, what it may give back.
  std::vector<size_t> shard_schedule(uint64_t epoch, int64_t world_size, int64_t from_position,
                                     size_t max_shards) const;
  /// NOTE [ Warm mappings ]: the thread mapping the first epoch's shards ahead.
  const MappingWarmer& warmer() const { return *warmer_; }

 private:
  std::shared_ptr<RecordSource> source_;
  RecordOptions opts_;
  std::vector<int64_t> shard_records_;     // per shard, for the shard-window order
  std::unique_ptr<MappingWarmer> warmer_;  // NOTE [ Warm mappings ]
};

}  // namespace stoker
