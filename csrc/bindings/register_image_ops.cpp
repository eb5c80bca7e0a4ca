// Bindings of the image ops (geometry/image_ops.h) as types: every alternative of
// ImageOp becomes a class of _core, built from its params() (positional in their
// order, or by name) and checked by its check() at construction, and listed by
// kind in _core.IMAGE_OPS; and
// the per-field image options and transform groups of the record producer.
// Python (stoker.ops) only builds these; a new op needs nothing here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "augment/batch_mix.h"
#include "common/error.h"
#include "geometry/image_ops.h"
#include "geometry/image_pipeline.h"
#include "producers/record_producer.h"

namespace py = pybind11;

namespace stoker::bindings {

namespace {

template <typename Op>
[[noreturn]] void bad_value(const char* param, const char* what, py::handle value) {
  STOKER_THROW(UsageError, Op::kName, ": ", param, " must be ", what, ", got ",
               py::repr(value).cast<std::string>());
}

// One parameter's value from Python: conversion only (check() validates).
template <typename Op>
double number(py::handle v, const char* param, const char* what) {
  if (py::isinstance<py::bool_>(v) ||
      !(py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v)))
    bad_value<Op>(param, what, v);
  return v.cast<double>();
}

template <typename Op>
void convert(py::handle v, double& out, const char* param, const char* what) {
  out = number<Op>(v, param, what);
}

template <typename Op>
void convert(py::handle v, int& out, const char* param, const char* what) {
  const double d = number<Op>(v, param, what);  // args() may give 224.0
  if (!(std::floor(d) == d && std::abs(d) <= 1 << 30)) bad_value<Op>(param, what, v);
  out = static_cast<int>(d);
}

template <typename Op, size_t N>
void convert(py::handle v, std::array<double, N>& out, const char* param, const char* what) {
  if (py::isinstance<py::str>(v) || !py::isinstance<py::sequence>(v) || py::len(v) != N)
    bad_value<Op>(param, what, v);
  auto seq = v.cast<py::sequence>();
  for (size_t i = 0; i < N; ++i) out[i] = number<Op>(seq[i], param, what);
}

template <typename Op>
void convert(py::handle v, std::vector<int>& out, const char* param, const char* what) {
  if (py::isinstance<py::str>(v) || !py::isinstance<py::sequence>(v)) bad_value<Op>(param, what, v);
  out.clear();
  for (py::handle x : v.cast<py::sequence>()) {
    int i = 0;
    convert<Op>(x, i, param, what);
    out.push_back(i);
  }
}

template <typename Op>
void convert(py::handle v, DType& out, const char* param, const char* what) {
  if (!py::isinstance<py::str>(v)) bad_value<Op>(param, what, v);
  try {
    out = dtype_from_name(v.cast<std::string>());
  } catch (const UsageError&) {
    bad_value<Op>(param, what, v);
  }
}

py::object to_python(double v) { return py::float_(v); }
py::object to_python(int v) { return py::int_(v); }
py::object to_python(DType v) { return py::str(dtype_name(v)); }
py::object to_python(const std::vector<int>& v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = py::int_(v[i]);
  return t;
}
template <size_t N>
py::object to_python(const std::array<double, N>& v) {
  py::tuple t(N);
  for (size_t i = 0; i < N; ++i) t[i] = py::float_(v[i]);
  return t;
}

template <typename Op>
Op build(const py::args& args, const py::kwargs& kwargs) {
  constexpr auto params = Op::params();
  constexpr size_t n = std::tuple_size_v<decltype(params)>;
  STOKER_CHECK(args.size() <= n, UsageError, Op::kName, " takes ", n, " parameters, got ",
               args.size());
  Op op;
  size_t i = 0, named = 0;
  std::apply(
      [&](const auto&... p) {
        [[maybe_unused]] auto set = [&](const auto& param) {
          const size_t at = i++;
          if (at < args.size()) {
            STOKER_CHECK(!kwargs.contains(param.name), UsageError, Op::kName, ": ", param.name,
                         " given twice");
            convert<Op>(args[at], op.*(param.member), param.name, param.what);
          } else if (kwargs.contains(param.name)) {
            convert<Op>(kwargs[param.name], op.*(param.member), param.name, param.what);
            ++named;
          }
        };
        (set(p), ...);
      },
      params);
  if (named != kwargs.size()) {
    std::string names;
    std::apply([&](const auto&... p) { ((names += std::string(" ") + p.name), ...); }, params);
    STOKER_THROW(UsageError, Op::kName, ": unknown parameter among ",
                 py::repr(kwargs).cast<std::string>(), " (it takes:", names, ")");
  }
  op.check();
  return op;
}

template <typename Op>
void bind_op(py::module_& m, py::dict& kinds) {
  py::class_<Op> cls(m, Op::kName);
  cls.def(py::init(&build<Op>), "Checked at construction (ValueError naming the parameter).");
  cls.attr("kind") = Op::kKind;
  std::apply(
      [&](const auto&... p) {
        (cls.def_property_readonly(
             p.name, [member = p.member](const Op& op) { return to_python(op.*member); }),
         ...);
      },
      Op::params());
  cls.def("__repr__", [](const Op& op) {
    std::string out = std::string(Op::kName) + "(";
    bool first = true;
    const Op defaults{};
    std::apply(
        [&](const auto&... p) {
          [[maybe_unused]] auto one = [&](const auto& param) {
            if (param.quiet && op.*(param.member) == defaults.*(param.member)) return;
            out += (first ? "" : ", ") + std::string(param.name) + "=" +
                   py::repr(to_python(op.*(param.member))).template cast<std::string>();
            first = false;
          };
          (one(p), ...);
        },
        Op::params());
    return out + ")";
  });
  cls.def("__eq__", [](const Op& a, const Op& b) {
    bool same = true;
    std::apply([&](const auto&... p) { ((same = same && a.*(p.member) == b.*(p.member)), ...); },
               Op::params());
    return same;
  });
  cls.attr("__hash__") = py::none();
  kinds[Op::kKind] = cls;
}

template <size_t... I>
void bind_ops(py::module_& m, py::dict& kinds, std::index_sequence<I...>) {
  (bind_op<std::variant_alternative_t<I, ImageOp>>(m, kinds), ...);
}

}  // namespace

void register_image_ops(py::module_& m) {
  py::dict kinds;
  bind_ops(m, kinds, std::make_index_sequence<std::variant_size_v<ImageOp>>());
  m.attr("IMAGE_OPS") = kinds;  // kind -> type: what an Op subclass's `kind` names
  m.def("check_image_ops", &check_image_ops, py::arg("ops"),
        "Checks a list of ops as a pipeline does (an op that must be last is last).");

  py::class_<ImageFieldSpec>(m, "ImageFieldSpec", "How one image field is decoded and written.")
      .def(py::init([](const std::string& layout, int64_t max_pixels) {
             ImageFieldSpec s;
             s.layout = image_layout_from_name(layout);
             s.max_pixels = max_pixels;
             return s;
           }),
           py::arg("layout") = "HWC", py::arg("max_pixels") = ImageFieldSpec{}.max_pixels)
      .def_property_readonly("layout",
                             [](const ImageFieldSpec& s) { return image_layout_name(s.layout); })
      .def_readonly("max_pixels", &ImageFieldSpec::max_pixels);

  py::class_<TargetSpec>(m, "TargetSpec", "What one field of a transform group is.")
      .def(py::init([](const std::string& kind, const std::string& format, bool normalized) {
             TargetSpec t;
             if (kind == "image")
               t.kind = GroupMember::Kind::kImage;
             else if (kind == "mask")
               t.kind = GroupMember::Kind::kMask;
             else if (kind == "boxes")
               t.kind = GroupMember::Kind::kBoxes;
             else if (kind == "keypoints")
               t.kind = GroupMember::Kind::kKeypoints;
             else if (kind == "rows")
               t.kind = GroupMember::Kind::kRows;
             else
               STOKER_THROW(UsageError,
                            "target kind must be image, mask, boxes, keypoints or "
                            "rows, got '",
                            kind, "'");
             t.format = box_format_from_name(format);
             t.normalized = normalized;
             return t;
           }),
           py::arg("kind"), py::arg("format") = "xyxy", py::arg("normalized") = false);

  py::class_<TransformSpec>(m, "TransformSpec",
                            "Ops applied to a group of fields, with one set of random draws per "
                            "sample.")
      .def(py::init([](std::vector<std::string> fields, std::vector<ImageOp> ops,
                       std::vector<TargetSpec> targets) {
             check_image_ops(ops);
             return TransformSpec{std::move(fields), std::move(ops), std::move(targets)};
           }),
           py::arg("fields"), py::arg("ops"), py::arg("targets") = std::vector<TargetSpec>{})
      .def_readonly("fields", &TransformSpec::fields)
      .def_readonly("ops", &TransformSpec::ops);

  py::class_<BatchMixOptions>(m, "BatchMixOptions",
                              "MixUp and/or CutMix on each batch (batch_transforms).")
      .def(py::init([](const std::string& image, const std::string& labels, int num_classes,
                       std::optional<std::tuple<double, double, double>> mixup,
                       std::optional<std::tuple<double, double, double>> cutmix,
                       double switch_prob) {
             BatchMixOptions o;
             auto params = [](const std::tuple<double, double, double>& t) {
               return MixParams{std::get<0>(t), std::get<1>(t), std::get<2>(t)};
             };
             if (mixup) o.spec.mixup = params(*mixup);
             if (cutmix) o.spec.cutmix = params(*cutmix);
             o.spec.switch_prob = switch_prob;
             o.spec.num_classes = num_classes;
             o.image = image;
             o.labels = labels;
             check_batch_mix(o.spec);
             return o;
           }),
           py::kw_only(), py::arg("image"), py::arg("labels"), py::arg("num_classes"),
           py::arg("mixup") = py::none(), py::arg("cutmix") = py::none(),
           py::arg("switch_prob") = 0.5,
           "mixup/cutmix: (alpha, p, label_smoothing); with both, CutMix with probability "
           "switch_prob per batch.");
}

}  // namespace stoker::bindings
