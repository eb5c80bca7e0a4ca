// Bindings of csrc/codecs: one-image decode for tests and tools, the JPEG encoder
// (example data, stoker.image(storage="smart")), and the decode-only throughput that
// the image benchmark uses as its ceiling.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string_view>

#include "codecs/decode_benchmark.h"
#include "codecs/jpeg_encoder.h"
#include "common/error.h"
#include "geometry/image_pipeline.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

using Ops = std::vector<ImageOp>;

ImagePipeline make_pipeline(const Ops& ops, const std::string& layout, int64_t max_pixels) {
  ImageFieldSpec spec;
  spec.layout = image_layout_from_name(layout);
  spec.max_pixels = max_pixels;
  return ImagePipeline(spec, ops);
}

std::string_view view_of(const py::bytes& data) { return data; }

const uint8_t* bytes_ptr(std::string_view v) { return reinterpret_cast<const uint8_t*>(v.data()); }

}  // namespace

void register_decode(py::module_& m) {
  m.def(
      "decode_image",
      [](const py::bytes& data, const Ops& ops, const std::string& layout, uint64_t seed,
         int64_t max_pixels) {
        const ImagePipeline pipe = make_pipeline(ops, layout, max_pixels);
        const std::string_view bytes = view_of(data);  // `data` is held by the caller: stays valid
        std::pair<int, int> hw;
        {
          py::gil_scoped_release nogil;
          hw = pipe.output_size(bytes_ptr(bytes), bytes.size());
        }
        const auto [h, w] = hw;
        const std::vector<py::ssize_t> shape = pipe.layout() == ImageLayout::kCHW
                                                   ? std::vector<py::ssize_t>{3, h, w}
                                                   : std::vector<py::ssize_t>{h, w, 3};
        py::array out;
        switch (pipe.out_dtype()) {
          case DType::kUInt8:
            out = py::array_t<uint8_t>(shape);
            break;
          case DType::kFloat32:
            out = py::array_t<float>(shape);
            break;
          default:
            out = py::array(py::dtype("float16"), shape);
            break;
        }
        void* dst = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          pipe.run(bytes_ptr(bytes), bytes.size(), seed, dst, h, w);
        }
        return out;
      },
      py::arg("data"), py::arg("ops") = Ops{}, py::arg("layout") = "HWC", py::arg("seed") = 0,
      py::arg("max_pixels") = 100'000'000,
      "Decodes one JPEG/PNG through a list of ops (stoker.ops._specs builds them), as a "
      "loader worker does; returns (h, w, 3) or (3, h, w) uint8, or float after Normalize.");
  m.def(
      "image_output_size",
      [](const py::bytes& data, const Ops& ops, int64_t max_pixels) {
        const ImagePipeline pipe = make_pipeline(ops, "HWC", max_pixels);
        const std::string_view bytes = view_of(data);
        py::gil_scoped_release nogil;
        return pipe.output_size(bytes_ptr(bytes), bytes.size());
      },
      py::arg("data"), py::arg("ops") = Ops{}, py::arg("max_pixels") = 100'000'000,
      "(h, w) that decode_image would return for these ops, from the header only.");
  m.def(
      "image_size",
      [](const py::bytes& data) {
        const std::string_view b = view_of(data);
        ImageInfo i;
        {
          py::gil_scoped_release nogil;
          i = probe_image(bytes_ptr(b), b.size());
        }
        return py::make_tuple(i.height, i.width);
      },
      py::arg("data"), "(height, width) from the header.");
  m.def(
      "encode_jpeg",
      [](const py::array_t<uint8_t, py::array::c_style>& pixels, int quality) {
        const py::ssize_t nd = pixels.ndim();
        STOKER_CHECK(nd == 2 || (nd == 3 && (pixels.shape(2) == 3 || pixels.shape(2) == 1)),
                     UsageError, "encode_jpeg takes (h, w, 3) RGB or (h, w) grayscale pixels, got ",
                     nd, " dimensions");
        const int channels = nd == 3 ? static_cast<int>(pixels.shape(2)) : 1;
        const py::ssize_t h = pixels.shape(0), w = pixels.shape(1);
        STOKER_CHECK(h <= INT32_MAX && w <= INT32_MAX, UsageError, "image of ", h, "x", w,
                     " pixels is too large for a JPEG");
        std::vector<uint8_t> out;
        {
          py::gil_scoped_release nogil;
          out = jpeg_encode(pixels.data(), static_cast<int>(w), static_cast<int>(h), channels,
                            static_cast<size_t>(w) * channels, quality);
        }
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      },
      py::arg("pixels"), py::arg("quality") = 90,
      "JPEG bytes (libjpeg-turbo, baseline, 4:2:0) of (h, w, 3) RGB or (h, w) grayscale uint8 "
      "pixels at quality 1-100; refuses in a build without image support.");
  m.def(
      "decode_only_throughput",
      [](const std::vector<py::bytes>& images, int threads, int rounds) {
        std::vector<std::pair<const uint8_t*, size_t>> spans;
        spans.reserve(images.size());
        for (const py::bytes& b : images) {
          const std::string_view v = view_of(b);
          spans.emplace_back(bytes_ptr(v), v.size());
        }
        STOKER_CHECK(!spans.empty(), UsageError, "decode_only_throughput needs images");
        py::gil_scoped_release nogil;
        return decode_throughput(spans, threads, rounds);
      },
      py::arg("images"), py::arg("threads"), py::arg("rounds") = 1,
      "Images/s of plain full decodes (libjpeg-turbo/libpng) on `threads` threads: the ceiling "
      "the image benchmark compares against.");
}

}  // namespace stoker::bindings
