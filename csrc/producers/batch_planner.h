// Planning one batch of records: which samples (from the epoch order), the
// output tensors and their layout in one buffer. A variable-length field is
// padded to the longest sample of the batch, and an image field without a
// size-fixing op to the one size all its images share, so planning reads
// those samples first through format/: images verified (a corrupt record is
// that sample's error, never a misleading size error; under on_error="skip" it
// is left to the sample writer, which replaces it with a sample that fits),
// lengths without the checksum (bounded by the record's size; the sample
// writer verifies every record it copies, so planning costs no second hash).
// The variable fields of a transform group (boxes, per-box rows) are padded to
// their longest input: a group drops rows, never adds them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pipeline/batch_producer.h"
#include "producers/record_producer.h"

namespace stoker {

/// Per field: where its output goes and how big a sample's part is.
struct FieldPlan {
  size_t out = 0;             ///< index into tensors
  size_t lengths = SIZE_MAX;  ///< index of "<name>_lengths", if variable
  size_t sample_bytes = 0;    ///< bytes per sample in the output tensor
  int64_t max_rows = 0;       ///< padded length of a variable field
  int img_h = 0, img_w = 0;   ///< output size of an image field (or of its group, a video's frames)
  size_t pts = SIZE_MAX;      ///< a video field's "<name>_pts" tensor
  int channels = 0;           ///< an audio field's rows per sample (max_rows: its samples)
  /// Where samples are written when that is not the tensor (the integer
  /// labels that batch_transforms turn into the soft labels of the tensor).
  size_t raw = SIZE_MAX;
};

/// A planned batch of records; run() is the sample writer (sample_writer.cpp).
class RecordBatch final : public BatchWork {
 public:
  RecordBatch(std::shared_ptr<const RecordSource> src, uint64_t sample_seed)
      : src_(std::move(src)), sample_seed_(sample_seed) {}

  void run(int u, uint8_t* base, WorkerContext& ctx) override;
  /// batch_transforms (MixUp, CutMix) on the written batch.
  void finish(uint8_t* base, WorkerContext& ctx) override;

  std::vector<int64_t> indices;  ///< dataset index of each sample
  std::vector<FieldPlan> plans;  ///< per schema field
  int64_t unit_samples = 1;
  // A mixture's batch: each sample's source (RecordSource::sets), the key its
  // random draws take in place of its index (NOTE [ Random draws ]: unique per
  // occurrence, so a source read twice in an epoch draws anew), and the
  // "source" tensor (index into tensors).
  std::vector<uint16_t> sources;
  std::vector<uint64_t> sample_keys;
  size_t source_tensor = SIZE_MAX;
  bool mixture = false;  ///< a mixture's: a "source" tensor even with no samples

  const Dataset& dataset_of(int64_t pos) const {
    return sources.empty() ? *src_->ds : src_->dataset(sources[static_cast<size_t>(pos)]);
  }
  /// The seed of the draws of transform group `g` for the sample `index` at
  /// `pos` (NOTE [ Random draws ]).
  uint64_t group_seed(size_t g, int64_t pos, int64_t index) const;
  /// The other samples group `g` reads for the sample `index` at `pos`
  /// (TransformGroup::partners: a Mosaic's three), indices into dataset_of(pos).
  void partners(size_t g, int64_t pos, int64_t index, int64_t* out) const;

 private:
  friend class SampleWriter;
  std::shared_ptr<const RecordSource> src_;
  uint64_t sample_seed_;  // hash of (seed, epoch): per-sample random draws
};

/// Fills `b.indices`, `b.plans`, `b.tensors`, `b.bytes`, `b.units` (with
/// `b.sources` set first: a mixture's, and its "source" tensor).
void plan_record_batch(const RecordSource& src, std::vector<int64_t> indices, int64_t unit_samples,
                       RecordBatch& b);

}  // namespace stoker
