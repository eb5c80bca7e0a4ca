#include "bindings/image_spec.h"

#include <pybind11/stl.h>

#include "common/error.h"

namespace stoker::bindings {

ImageFieldSpec make_image_spec(const OpList& ops, const std::string& layout, int64_t max_pixels) {
  ImageFieldSpec spec;
  STOKER_CHECK(layout == "HWC" || layout == "CHW", UsageError,
               "image layout must be 'HWC' or 'CHW', got '", layout, "'");
  spec.layout = layout == "CHW" ? ImageLayout::kCHW : ImageLayout::kHWC;
  for (const auto& [kind, args] : ops) spec.ops.push_back({kind, args});
  spec.max_pixels = max_pixels;
  return spec;
}

ImageFieldSpec image_spec_from_py(const py::handle& spec) {
  auto t = spec.cast<py::tuple>();
  STOKER_CHECK(t.size() == 3, UsageError, "image spec must be (layout, ops, max_pixels)");
  return make_image_spec(t[1].cast<OpList>(), t[0].cast<std::string>(), t[2].cast<int64_t>());
}

}  // namespace stoker::bindings
