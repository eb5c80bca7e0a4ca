// Image field specs from Python: (layout, [(op kind, [args...]), ...], max_pixels).
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

#include "decode/image_pipeline.h"

namespace stoker::bindings {

namespace py = pybind11;

using OpList = std::vector<std::pair<std::string, std::vector<double>>>;

/// Validates the layout name; the ops are validated by ImagePipeline.
ImageFieldSpec make_image_spec(const OpList& ops, const std::string& layout, int64_t max_pixels);

/// From the tuple the Python layer passes per image field.
ImageFieldSpec image_spec_from_py(const py::handle& spec);

}  // namespace stoker::bindings
