// One sample of a stoker dataset for the Python stage (NOTE [ Python stage ]
// in python/stoker/_python_stage.py), fetched as a loader worker fetches it:
// read and verified, images decoded and transformed by the loader's ops with
// the same random draws (NOTE [ Random draws ] in record_producer.h), so that
// `map=lambda s, rng: s` sees exactly the pixels the loader gives without map.
// The bindings call it in two steps with the GIL released (read, then decode
// into arrays they allocate in between).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "format/dataset.h"
#include "stage/python_handoff.h"
#include "producers/record_producer.h"

namespace stoker {

class SampleFetcher {
 public:
  /// The images and transforms of `opts` (its sampler's seed keys the draws), as
  /// the loader's RecordProducer would have them. UsageError as make_record_source.
  SampleFetcher(std::shared_ptr<const Dataset> ds, const RecordOptions& opts);

  const Dataset& dataset() const { return *source_->ds; }
  /// The image pipeline of field `f` (null for other fields).
  const ImagePipeline* pipeline(size_t f) const { return source_->pipelines[f].get(); }

  /// A sample read and verified: its fields' bytes, held by `pin`.
  struct Sample {
    int64_t index = -1;
    Dataset::ShardPin pin;
    std::vector<RecordView> views;
    std::vector<std::pair<int, int>> image_hw;  ///< output (h, w) of each image field
  };
  /// Reads sample `index` (waiting for a remote shard as a worker does) and
  /// sizes its images. Errors name the shard file, record and field.
  void read(int64_t index, Sample& out, PythonTimes& times) const;
  /// Decodes and transforms image field `f` of `s` into `dst` (h * w * 3
  /// elements of the pipeline's dtype, in its layout).
  void decode_image(const Sample& s, size_t f, uint64_t epoch, void* dst, PythonTimes& times) const;
  /// Checks that the bytes copied out of `s` were not cut short under the read
  /// (format/mapped_file.h); then releases its shard.
  void release(Sample& s) const;

 private:
  std::shared_ptr<const RecordSource> source_;
  uint64_t seed_;
};

}  // namespace stoker
