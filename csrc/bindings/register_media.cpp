// Bindings of video and audio fields: their records (made when a sample is
// written), their per-field specs for RecordOptions, and one sample's clip or
// crop decoded as a loader worker decodes it (Dataset.sample, tests).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string_view>

#include "augment/audio_pipeline.h"
#include "codecs/audio_decoder.h"
#include "codecs/media.h"
#include "codecs/media_record.h"
#include "codecs/video_decoder.h"
#include "common/error.h"
#include "geometry/video_pipeline.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

std::string_view view_of(const py::bytes& data) { return data; }
const uint8_t* ptr(std::string_view v) { return reinterpret_cast<const uint8_t*>(v.data()); }

py::bytes to_bytes(const std::vector<uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

}  // namespace

void register_media(py::module_& m) {
  py::class_<VideoFieldSpec>(m, "VideoFieldSpec",
                             "How one video field's clips are chosen and transformed.")
      .def(py::init([](bool random, int num_frames, int step, double fps, std::vector<ImageOp> ops,
                       const std::string& layout, int64_t max_pixels) {
             VideoFieldSpec s;
             s.clip = {random, num_frames, step, fps};
             s.ops = std::move(ops);
             s.layout = image_layout_from_name(layout);
             s.max_pixels = max_pixels;
             VideoPipeline check(s);  // UsageError now, not at the first batch
             return s;
           }),
           py::kw_only(), py::arg("random"), py::arg("num_frames"), py::arg("step") = 1,
           py::arg("fps") = 0.0, py::arg("ops") = std::vector<ImageOp>{}, py::arg("layout") = "CHW",
           py::arg("max_pixels") = VideoFieldSpec{}.max_pixels);
  py::class_<AudioFieldSpec>(m, "AudioFieldSpec", "How one audio field is decoded and cropped.")
      .def(py::init([](int sample_rate, int channels, int crop, double seconds) {
             AudioFieldSpec s{sample_rate, channels, crop, seconds};
             AudioPipeline check(s);
             return s;
           }),
           py::kw_only(), py::arg("sample_rate") = 0, py::arg("channels") = 0, py::arg("crop") = 0,
           py::arg("seconds") = 0.0, "crop: 0 none, 1 random, 2 centre, of `seconds`.");

  m.def(
      "video_record",
      [](const py::bytes& data) {
        const std::string_view b = view_of(data);
        std::vector<uint8_t> out;
        {
          py::gil_scoped_release nogil;
          out = make_video_record(ptr(b), b.size());
        }
        return to_bytes(out);
      },
      py::arg("data"),
      "The record of a stoker.video() field for a video file's bytes: its frame index, then "
      "the file (csrc/codecs/media_record.h). DecodeError naming the reason.");
  m.def(
      "audio_record",
      [](const py::bytes& data) {
        const std::string_view b = view_of(data);
        std::vector<uint8_t> out;
        {
          py::gil_scoped_release nogil;
          out = make_audio_record(ptr(b), b.size());
        }
        return to_bytes(out);
      },
      py::arg("data"),
      "The record of a stoker.audio() field for an audio file's bytes (the file decoded once "
      "to count its samples). DecodeError naming the reason.");
  m.def(
      "video_info",
      [](const py::bytes& record) {
        const std::string_view b = view_of(record);
        const VideoRecord r = parse_video_record(ptr(b), b.size());
        py::array_t<double> pts(r.num_frames);
        py::array_t<bool> key(r.num_frames);
        for (int32_t i = 0; i < r.num_frames; ++i) {
          pts.mutable_at(i) = r.seconds(i);
          key.mutable_at(i) = i == 0 || r.frame(i).key != r.frame(i - 1).key;
        }
        py::dict d;
        d["width"] = r.width;
        d["height"] = r.height;
        d["frames"] = r.num_frames;
        d["key_frames"] = r.num_keys;
        d["pts"] = pts;
        d["time_base"] = py::make_tuple(r.tb_num, r.tb_den);
        d["file_offset"] = static_cast<size_t>(r.file - ptr(b));
        d["reorder_delay"] =
            r.flags & kVideoStoredProbe ? py::object(py::int_(r.reorder_delay)) : py::none();
        return d;
      },
      py::arg("record"),
      "A video record's index: width, height, frames, key_frames, pts (seconds, presentation "
      "order), time_base, file_offset (where the file's bytes start), reorder_delay (the "
      "frames the decoder holds back, as the stream probe found at write time; None where "
      "the container's header needed no probe, or a record of an older stoker, which a "
      "clip's decode probes again).");
  m.def(
      "audio_info",
      [](const py::bytes& record) {
        const std::string_view b = view_of(record);
        const AudioRecord r = parse_audio_record(ptr(b), b.size());
        py::dict d;
        d["sample_rate"] = r.sample_rate;
        d["channels"] = r.channels;
        d["samples"] = r.samples;
        d["file_offset"] = static_cast<size_t>(r.file - ptr(b));
        return d;
      },
      py::arg("record"), "An audio record's sample_rate, channels, samples and file_offset.");
  m.def(
      "decode_clip",
      [](const py::bytes& record, const VideoFieldSpec& spec, uint64_t seed) {
        const VideoPipeline pipe(spec);
        const std::string_view b = view_of(record);
        std::pair<int, int> hw;
        {
          py::gil_scoped_release nogil;
          hw = pipe.fixed_size() ? *pipe.fixed_size() : pipe.output_size(ptr(b), b.size());
        }
        const auto [h, w] = hw;
        const py::ssize_t t = pipe.num_frames();
        const std::vector<py::ssize_t> shape = pipe.layout() == ImageLayout::kCHW
                                                   ? std::vector<py::ssize_t>{t, 3, h, w}
                                                   : std::vector<py::ssize_t>{t, h, w, 3};
        py::array frames =
            pipe.out_dtype() == DType::kUInt8     ? py::array(py::array_t<uint8_t>(shape))
            : pipe.out_dtype() == DType::kFloat32 ? py::array(py::array_t<float>(shape))
                                                  : py::array(py::dtype("float16"), shape);
        py::array_t<double> pts(t);
        void* dst = frames.mutable_data();
        double* p = pts.mutable_data();
        {
          py::gil_scoped_release nogil;
          pipe.run(ptr(b), b.size(), seed, dst, p, h, w);
        }
        return py::make_tuple(frames, pts);
      },
      py::arg("record"), py::arg("spec"), py::arg("seed") = 0,
      "One clip of a video record as a loader worker decodes it for `seed`: (frames (T, 3, H, "
      "W) or (T, H, W, 3), pts seconds (T,)).");
  m.def(
      "clip_frames",
      [](const py::bytes& record, const VideoFieldSpec& spec, uint64_t seed) {
        const std::string_view b = view_of(record);
        return choose_clip(spec.clip, parse_video_record(ptr(b), b.size()), seed);
      },
      py::arg("record"), py::arg("spec"), py::arg("seed") = 0,
      "The frame numbers of the clip `seed` draws (presentation order).");
  m.def(
      "decode_audio_record",
      [](const py::bytes& record, const AudioFieldSpec& spec, uint64_t seed) {
        const AudioPipeline pipe(spec);
        const std::string_view b = view_of(record);
        AudioPipeline::Shape s;
        {
          py::gil_scoped_release nogil;
          s = pipe.output_shape(ptr(b), b.size());
        }
        py::array_t<float> out(
            {static_cast<py::ssize_t>(s.channels), static_cast<py::ssize_t>(s.samples)});
        float* dst = out.mutable_data();
        int64_t got;
        {
          py::gil_scoped_release nogil;
          got = pipe.run(ptr(b), b.size(), seed, dst, s.channels, s.samples);
        }
        return py::make_tuple(out, got, s.rate);
      },
      py::arg("record"), py::arg("spec"), py::arg("seed") = 0,
      "An audio record's crop for `seed` as a loader worker decodes it: (float32 (C, N), "
      "samples written, sample rate).");
  m.def(
      "media_codecs", [] { return media_decoders(); },
      "The video and audio decoders this build's FFmpeg has, comma-separated ('' without "
      "FFmpeg).");
}

}  // namespace stoker::bindings
