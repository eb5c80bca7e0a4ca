// Bindings of csrc/decode: one-image decode for tests and tools.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/error.h"
#include "decode/image_pipeline.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

ImageFieldSpec make_spec(const std::vector<std::pair<std::string, std::vector<double>>>& ops,
                         const std::string& layout, int64_t max_pixels) {
  ImageFieldSpec spec;
  STOKER_CHECK(layout == "HWC" || layout == "CHW", UsageError, "layout must be HWC or CHW");
  spec.layout = layout == "CHW" ? ImageLayout::kCHW : ImageLayout::kHWC;
  for (const auto& [kind, args] : ops) spec.ops.push_back({kind, args});
  spec.max_pixels = max_pixels;
  return spec;
}

}  // namespace

void register_decode(py::module_& m) {
  using Ops = std::vector<std::pair<std::string, std::vector<double>>>;
  m.def(
      "decode_image",
      [](const py::bytes& data, const Ops& ops, const std::string& layout, uint64_t seed,
         int64_t max_pixels) {
        ImagePipeline pipe(make_spec(ops, layout, max_pixels));
        std::string_view bytes = data;
        const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
        std::pair<int, int> hw;
        {
          py::gil_scoped_release nogil;
          hw = pipe.output_size(p, bytes.size());
        }
        std::vector<py::ssize_t> shape =
            layout == "CHW" ? std::vector<py::ssize_t>{3, hw.first, hw.second}
                            : std::vector<py::ssize_t>{hw.first, hw.second, 3};
        py::array out;
        switch (pipe.out_dtype()) {
          case DType::kUInt8: out = py::array_t<uint8_t>(shape); break;
          case DType::kFloat32: out = py::array_t<float>(shape); break;
          default: out = py::array(py::dtype("float16"), shape); break;
        }
        void* dst = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          pipe.run(p, bytes.size(), seed, dst, hw.first, hw.second);
        }
        return out;
      },
      py::arg("data"), py::arg("ops") = Ops{}, py::arg("layout") = "HWC", py::arg("seed") = 0,
      py::arg("max_pixels") = 100'000'000,
      "Decodes one JPEG/PNG through an op list, as a loader worker would.");
  m.def(
      "image_size",
      [](const py::bytes& data) {
        std::string_view b = data;
        ImageInfo i = probe_image(reinterpret_cast<const uint8_t*>(b.data()), b.size());
        return py::make_tuple(i.height, i.width);
      },
      py::arg("data"), "(height, width) from the header.");
}

}  // namespace stoker::bindings
