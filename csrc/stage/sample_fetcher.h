// One sample of a stoker dataset for the Python stage (NOTE [ Python stage ]
// in python/stoker/_stage/__init__.py), fetched as a loader worker fetches it:
// read and verified, images decoded and transformed by the loader's ops with
// the same random draws (NOTE [ Random draws ] in producers/record_producer.h), so that
// `map=lambda s, rng: s` sees exactly the pixels the loader gives without map.
// It decides what each field becomes (outputs(): an image array, the stored
// bytes, or a flat array of the field's dtype); the bindings only make those
// objects, between the two steps they call with the GIL released (read(),
// then write() into the arrays they made). The fields of a transform group
// (transform_group.h) come as the loader's: the image (h, w, 3), a mask
// (h, w, 1) (an array mask: its shape at the output size), and boxes,
// keypoints and per-box rows with the dropped rows gone (write() says how
// many elements are left).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "format/dataset.h"
#include "producers/record_producer.h"
#include "stage/python_handoff.h"

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
    /// Output (h, w) of each image field, and of each field of a transform group
    /// (a video's frames; an audio field's (channels, samples)).
    std::vector<std::pair<int, int>> image_hw;
  };
  /// Reads sample `index` (waiting for a remote shard as a worker does) and
  /// sizes its images. Errors name the shard file, record and field.
  void read(int64_t index, Sample& out, PythonTimes& times) const;

  /// What one field of a sample becomes for Python.
  struct FieldOut {
    enum class Kind : uint8_t {
      kImage,  ///< decoded and transformed: (h, w, 3) or (3, h, w) of the pipeline's
               ///< dtype; a group's mask (h, w, 1) or (1, h, w), an array mask's shape
      kBytes,  ///< the stored bytes as they are (a blob): `data`, `size`
      kArray,  ///< a writable copy of the stored bytes, flat: (size / item size,) of
               ///< `dtype`; in a group with boxes, only the first elements write() says
    };
    Kind kind = Kind::kBytes;
    DType dtype = DType::kUInt8;    ///< of the array to make (kImage, kArray)
    std::vector<int64_t> shape;     ///< of the array to make (kImage, kArray)
    const uint8_t* data = nullptr;  ///< the stored bytes, valid until write()
    size_t size = 0;
  };
  /// What each field of `s` (read()) becomes, in schema order, then each video
  /// field's frame times (float64, one per frame), in schema order.
  std::vector<FieldOut> outputs(const Sample& s) const;
  /// Fills the arrays made as outputs(s) says, `dst[f]` for field f (ignored for
  /// kBytes): the kArray fields' bytes copied, then each image decoded and
  /// transformed with the loader's draws for `epoch`, and each transform group
  /// run; then checks that nothing copied out of `s` was cut short under the
  /// read (format/mapped_file.h) and releases its shard. Errors name the shard
  /// file, record and field.
  /// @return per field, the elements of its array left (a group's boxes,
  ///   keypoints and rows, once dropped boxes took theirs), or -1: all of it
  std::vector<int64_t> write(Sample& s, const std::vector<void*>& dst, uint64_t epoch,
                             PythonTimes& times) const;

 private:
  /// Runs transform group `g` of `s`, its fields written to `dst`; their
  /// elements left go to `left`.
  void run_group(const Sample& s, size_t g, uint64_t epoch, const std::vector<void*>& dst,
                 std::vector<int64_t>& left, PythonTimes& times) const;
  /// Decodes and transforms image field `f` of `s` into `dst` (h * w * 3
  /// elements of the pipeline's dtype, in its layout).
  void decode_image(const Sample& s, size_t f, uint64_t epoch, void* dst, PythonTimes& times) const;
  /// Decodes video or audio field `f` of `s` into `dst` (a video's frame times
  /// into `pts`), with the loader's draws for `epoch`.
  void decode_media(const Sample& s, size_t f, uint64_t epoch, void* dst, void* pts,
                    PythonTimes& times) const;
  /// Checks that the bytes copied out of `s` were not cut short under the read
  /// (format/mapped_file.h); then releases its shard.
  void release(Sample& s) const;

  std::shared_ptr<const RecordSource> source_;
  uint64_t seed_;
};

}  // namespace stoker
