// stoker._testing: the augmentation kernels one at a time, on NumPy arrays: what
// the reference tests (tests/test_augment_kernels.py, test_augment_groups.py)
// hold to definitions written in NumPy, and bench/bench_augment.py times. The
// loader runs the same kernels from its workers; none of this ships in the wheel.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "augment/auto_augment.h"
#include "augment/batch_mix.h"
#include "augment/color_ops.h"
#include "augment/erasing.h"
#include "augment/gaussian_blur.h"
#include "augment/hsv_jitter.h"
#include "common/error.h"
#include "geometry/padding.h"
#include "geometry/target_geometry.h"
#include "geometry/transform_group.h"
#include "geometry/warp.h"

namespace py = pybind11;

namespace stoker::testing {

namespace {

using U8Array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

// A writable copy of an (h, w) or (h, w, c) uint8 image and its Pixels view.
struct Image {
  py::array_t<uint8_t> arr;
  Pixels px;
};

Image image_copy(const U8Array& in) {
  STOKER_CHECK(in.ndim() == 2 || (in.ndim() == 3 && (in.shape(2) == 1 || in.shape(2) == 3)),
               UsageError, "an image must be (h, w) or (h, w, 1 or 3) uint8");
  std::vector<py::ssize_t> shape(in.shape(), in.shape() + in.ndim());
  py::array_t<uint8_t> out(shape);
  std::memcpy(out.mutable_data(), in.data(), static_cast<size_t>(in.size()));
  const int ch = in.ndim() == 2 ? 1 : static_cast<int>(in.shape(2));
  return {out, packed_pixels(out.mutable_data(), static_cast<int>(in.shape(1)),
                             static_cast<int>(in.shape(0)), ch)};
}

Image image_alloc(int h, int w, int ch, bool flat) {
  std::vector<py::ssize_t> shape =
      flat ? std::vector<py::ssize_t>{h, w} : std::vector<py::ssize_t>{h, w, ch};
  py::array_t<uint8_t> out(shape);
  return {out, packed_pixels(out.mutable_data(), w, h, ch)};
}

ColorKind color_kind(const std::string& name) {
  for (int k = 0; k <= static_cast<int>(ColorKind::kSharpness); ++k)
    if (name == color_kind_name(static_cast<ColorKind>(k))) return static_cast<ColorKind>(k);
  STOKER_THROW(UsageError, "unknown colour step '", name, "'");
}

Interpolation interpolation(const std::string& name) {
  if (name == "nearest") return Interpolation::kNearest;
  if (name == "bilinear") return Interpolation::kBilinear;
  STOKER_THROW(UsageError, "interpolation must be 'nearest' or 'bilinear', got '", name, "'");
}

std::optional<Fill> fill_of(const std::optional<std::vector<int>>& v) {
  if (!v) return std::nullopt;
  STOKER_CHECK(v->size() == 1 || v->size() == 3, UsageError, "fill: 1 or 3 values");
  Fill f;
  for (int c = 0; c < 3; ++c) f.v[c] = static_cast<uint8_t>((*v)[v->size() == 1 ? 0 : c]);
  return f;
}

Transform2D matrix_of(const std::vector<double>& m) {
  STOKER_CHECK(m.size() == 9, UsageError, "a transform is 9 numbers (3x3, row-major)");
  std::array<double, 9> a{};
  std::copy(m.begin(), m.end(), a.begin());
  return Transform2D(a);
}

// Geometry from a list of ("crop", x, y, w, h), ("resize", w, h), ("hflip",),
// ("vflip",), ("pad", l, t, r, b), ("warp", m0..m8, w, h).
Geometry geometry_of(int in_w, int in_h, const std::vector<py::tuple>& ops) {
  Geometry g(in_w, in_h);
  for (const py::tuple& op : ops) {
    const std::string kind = op[0].cast<std::string>();
    auto i = [&](size_t k) { return op[k].cast<int>(); };
    if (kind == "crop") {
      g.crop(i(1), i(2), i(3), i(4));
    } else if (kind == "resize") {
      g.resize(i(1), i(2));
    } else if (kind == "hflip") {
      g.hflip();
    } else if (kind == "vflip") {
      g.vflip();
    } else if (kind == "pad") {
      g.crop(-i(1), -i(2), g.width() + i(1) + i(3), g.height() + i(2) + i(4));
    } else if (kind == "warp") {
      std::vector<double> m;
      for (size_t k = 1; k <= 9; ++k) m.push_back(op[k].cast<double>());
      g.warp(matrix_of(m), i(10), i(11));
    } else {
      STOKER_THROW(UsageError, "unknown geometry op '", kind, "'");
    }
  }
  return g;
}

}  // namespace

void register_augment_kernels(py::module_& m) {
  m.def(
      "augment_color",
      [](const U8Array& img, const std::vector<std::pair<std::string, double>>& steps) {
        Image out = image_copy(img);
        std::vector<ColorStep> s;
        for (const auto& [name, value] : steps) s.push_back({color_kind(name), value});
        py::gil_scoped_release nogil;
        apply_color_steps(out.px, s.data(), s.size());
        return out.arr;
      },
      py::arg("image"), py::arg("steps"),
      "Colour steps [(name, value), ...] applied fused to a copy of a uint8 image.");
  m.def(
      "augment_hsv",
      [](const U8Array& img, double h, double s, double v) {
        Image out = image_copy(img);
        py::gil_scoped_release nogil;
        apply_hsv_gains(out.px, HsvGains{h, s, v});
        return out.arr;
      },
      py::arg("image"), py::arg("h"), py::arg("s"), py::arg("v"),
      "ultralytics' HSV tables with the gains (h, s, v) on a copy of an RGB image.");
  m.def(
      "augment_blur",
      [](const U8Array& img, int kx, int ky, float sx, float sy) {
        Image out = image_copy(img);
        py::gil_scoped_release nogil;
        gaussian_blur(out.px, kx, ky, sx, sy);
        return out.arr;
      },
      py::arg("image"), py::arg("kx"), py::arg("ky"), py::arg("sigma_x"), py::arg("sigma_y"));
  m.def(
      "augment_warp",
      [](const U8Array& img, const std::vector<double>& inverse, const std::string& interp,
         const std::optional<std::vector<int>>& fill, int out_h, int out_w) {
        Image in = image_copy(img);
        Image out = image_alloc(out_h, out_w, in.px.channels, img.ndim() == 2);
        const std::optional<Fill> f = fill_of(fill);
        const Transform2D t = matrix_of(inverse);
        const Interpolation it = interpolation(interp);
        py::gil_scoped_release nogil;
        warp_pixels(in.px, out.px, t, it, f ? &*f : nullptr);
        return out.arr;
      },
      py::arg("image"), py::arg("inverse"), py::arg("interpolation"), py::arg("fill"),
      py::arg("out_h"), py::arg("out_w"),
      "Samples a uint8 image through `inverse` (output -> input, 3x3 row-major).");
  m.def(
      "augment_affine",
      [](double angle, double tx, double ty, double scale, double shx, double shy, double cx,
         double cy) {
        const Transform2D t = Transform2D::affine(angle, tx, ty, scale, shx, shy, {cx, cy});
        return std::vector<double>(t.m().begin(), t.m().end());
      },
      "The forward map of torchvision's affine, 3x3 row-major.");
  m.def("augment_perspective_coeffs", [](const std::vector<std::pair<double, double>>& start,
                                         const std::vector<std::pair<double, double>>& end) {
    STOKER_CHECK(start.size() == 4 && end.size() == 4, UsageError, "4 points each");
    std::array<Point2, 4> s, e;
    for (int i = 0; i < 4; ++i) {
      s[i] = {start[i].first, start[i].second};
      e[i] = {end[i].first, end[i].second};
    }
    const auto c = perspective_coeffs(s, e);
    return std::vector<double>(c.begin(), c.end());
  });
  m.def("augment_rotated_canvas_size", [](double angle, int w, int h) {
    int ow, oh;
    rotated_canvas_size(angle, w, h, &ow, &oh);
    return std::make_pair(ow, oh);
  });
  m.def(
      "augment_window",
      [](const U8Array& img, int x0, int y0, int out_w, int out_h, const std::string& mode,
         const std::vector<int>& fill) {
        Image in = image_copy(img);
        Image out = image_alloc(out_h, out_w, in.px.channels, img.ndim() == 2);
        const PadMode pm = pad_mode_from_name(mode.c_str());
        const Fill f = *fill_of(fill);
        py::gil_scoped_release nogil;
        copy_window(in.px, x0, y0, out.px, pm, f);
        return out.arr;
      },
      py::arg("image"), py::arg("x0"), py::arg("y0"), py::arg("out_w"), py::arg("out_h"),
      py::arg("mode"), py::arg("fill") = std::vector<int>{0});
  m.def(
      "augment_erase",
      [](py::array out, bool chw, std::tuple<int, int, int, int> rect,
         const std::optional<std::vector<float>>& value, uint64_t seed) {
        STOKER_CHECK(out.ndim() == 3 && (out.flags() & py::array::c_style) && out.writeable(),
                     UsageError, "erase: a writable C-contiguous 3-d array");
        const py::dtype dt = out.dtype();
        DType d;
        if (dt.is(py::dtype::of<uint8_t>()))
          d = DType::kUInt8;
        else if (dt.is(py::dtype::of<float>()))
          d = DType::kFloat32;
        else if (dt.is(py::dtype("float16")))
          d = DType::kFloat16;
        else
          STOKER_THROW(UsageError, "erase: uint8, float16 or float32");
        const int c = static_cast<int>(chw ? out.shape(0) : out.shape(2));
        const int h = static_cast<int>(chw ? out.shape(1) : out.shape(0));
        const int w = static_cast<int>(chw ? out.shape(2) : out.shape(1));
        const auto [x, y, rw, rh] = rect;
        detail::SplitMix64 noise(seed);
        erase_rect(out.mutable_data(), d, chw, h, w, c, PixelRect{x, y, rw, rh},
                   value ? value->data() : nullptr, &noise);
      },
      py::arg("out"), py::arg("chw"), py::arg("rect"), py::arg("value"), py::arg("seed") = 0);
  m.def("augment_draw_erasing",
        [](double p, std::pair<double, double> scale, std::pair<double, double> log_ratio, int w,
           int h, uint64_t seed) -> std::optional<std::tuple<int, int, int, int>> {
          ErasingParams e{p, scale.first, scale.second, log_ratio.first, log_ratio.second};
          detail::SplitMix64 rng(seed);
          const auto r = draw_erasing(e, w, h, rng);
          if (!r) return std::nullopt;
          return std::make_tuple(r->x, r->y, r->w, r->h);
        });
  m.def(
      "augment_boxes",
      [](const F32Array& boxes, const std::string& fmt, bool normalized, int in_w, int in_h,
         const std::vector<py::tuple>& ops, double min_area, double min_visibility,
         double min_size) {
        STOKER_CHECK(boxes.ndim() == 2 && boxes.shape(1) == 4, UsageError, "boxes are (n, 4)");
        const int64_t n = boxes.shape(0);
        py::array_t<float> out({static_cast<py::ssize_t>(n), py::ssize_t{4}});
        std::memcpy(out.mutable_data(), boxes.data(), static_cast<size_t>(n) * 16);
        py::array_t<bool> keep(n);
        const Geometry g = geometry_of(in_w, in_h, ops);
        const BoxFilter f{min_area, min_visibility, min_size};
        std::vector<uint8_t> k(n);
        transform_boxes(out.mutable_data(), n, box_format_from_name(fmt), normalized, g, f,
                        k.data());
        for (int64_t i = 0; i < n; ++i) keep.mutable_data()[i] = k[i] != 0;
        return std::make_tuple(out, keep, g.width(), g.height());
      },
      py::arg("boxes"), py::arg("format"), py::arg("normalized"), py::arg("in_w"), py::arg("in_h"),
      py::arg("ops"), py::arg("min_area") = 1.0, py::arg("min_visibility") = 0.0,
      py::arg("min_size") = 1.0,
      "Boxes through a geometry: (moved boxes, keep mask, out_w, out_h); dropped rows are "
      "left in place, unspecified.");
  m.def(
      "augment_keypoints",
      [](const F32Array& points, bool normalized, int in_w, int in_h,
         const std::vector<py::tuple>& ops, const std::optional<std::vector<int32_t>>& perm) {
        STOKER_CHECK(points.ndim() == 3 && points.shape(2) == 3, UsageError,
                     "keypoints are (n, k, 3)");
        const int k = static_cast<int>(points.shape(1));
        STOKER_CHECK(!perm || static_cast<int>(perm->size()) == k, UsageError,
                     "flip_pairs permutation of the wrong length");
        py::array_t<float> out({points.shape(0), points.shape(1), points.shape(2)});
        std::memcpy(out.mutable_data(), points.data(), static_cast<size_t>(points.size()) * 4);
        const Geometry g = geometry_of(in_w, in_h, ops);
        transform_keypoints(out.mutable_data(), points.shape(0), k, normalized, g,
                            perm ? perm->data() : nullptr);
        return out;
      },
      py::arg("points"), py::arg("normalized"), py::arg("in_w"), py::arg("in_h"), py::arg("ops"),
      py::arg("flip_perm") = py::none());
  m.def(
      "augment_auto",
      [](const U8Array& img, const std::string& policy, int num_ops, int magnitude, int bins,
         const std::string& interp, const std::optional<std::vector<int>>& fill, uint64_t seed) {
        AutoAugmentParams p;
        if (policy == "rand")
          p.policy = AutoAugmentPolicy::kRandAugment;
        else if (policy == "trivial")
          p.policy = AutoAugmentPolicy::kTrivialAugmentWide;
        else if (policy == "imagenet")
          p.policy = AutoAugmentPolicy::kImageNet;
        else
          STOKER_THROW(UsageError, "policy: rand, trivial or imagenet");
        p.num_ops = num_ops;
        p.magnitude = magnitude;
        p.num_magnitude_bins = bins;
        p.interpolation = interpolation(interp);
        if (const auto f = fill_of(fill)) {
          p.has_fill = true;
          p.fill = *f;
        }
        Image out = image_copy(img);
        detail::SplitMix64 rng(seed);
        AugOp ops[kMaxAugOps];
        const int n = draw_auto_augment(p, out.px.width, out.px.height, rng, ops);
        {
          py::gil_scoped_release nogil;
          apply_aug_ops(out.px, ops, n, p);
        }
        std::vector<std::pair<std::string, double>> drawn;
        for (int i = 0; i < n; ++i)
          drawn.emplace_back(aug_kind_name(ops[i].kind), ops[i].magnitude);
        return std::make_pair(out.arr, drawn);
      },
      py::arg("image"), py::arg("policy"), py::arg("num_ops") = 2, py::arg("magnitude") = 9,
      py::arg("bins") = 31, py::arg("interpolation") = "nearest", py::arg("fill") = py::none(),
      py::arg("seed") = 0, "(augmented copy, [(op name, signed magnitude), ...]).");
  m.def(
      "augment_mix",
      [](py::array images,
         const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& labels,
         int num_classes, const std::optional<std::tuple<double, double, double>>& mixup,
         const std::optional<std::tuple<double, double, double>>& cutmix, double switch_prob,
         bool chw, uint64_t seed) {
        STOKER_CHECK(
            images.ndim() == 4 && (images.flags() & py::array::c_style) && images.writeable(),
            UsageError, "images: a writable C-contiguous (b, ...) array");
        BatchMixSpec spec;
        auto params = [](const std::tuple<double, double, double>& t) {
          return MixParams{std::get<0>(t), std::get<1>(t), std::get<2>(t)};
        };
        if (mixup) spec.mixup = params(*mixup);
        if (cutmix) spec.cutmix = params(*cutmix);
        spec.switch_prob = switch_prob;
        spec.num_classes = num_classes;
        const py::dtype dt = images.dtype();
        DType d = DType::kUInt8;
        if (dt.is(py::dtype::of<float>()))
          d = DType::kFloat32;
        else if (dt.is(py::dtype("float16")))
          d = DType::kFloat16;
        else
          STOKER_CHECK(dt.is(py::dtype::of<uint8_t>()), UsageError, "uint8, float16 or float32");
        const int64_t b = images.shape(0);
        const int c = static_cast<int>(chw ? images.shape(1) : images.shape(3));
        const int h = static_cast<int>(chw ? images.shape(2) : images.shape(1));
        const int w = static_cast<int>(chw ? images.shape(3) : images.shape(2));
        STOKER_CHECK(labels.ndim() == 1 && labels.shape(0) == b, UsageError, "labels: (b,)");
        detail::SplitMix64 rng(seed);
        const MixDraw draw = draw_batch_mix(spec, h, w, rng);
        mix_images(images.mutable_data(), d, chw, b, h, w, c, draw);
        py::array_t<float> soft(
            {static_cast<py::ssize_t>(b), static_cast<py::ssize_t>(num_classes)});
        mix_labels(labels.data(), b, num_classes, draw, soft.mutable_data());
        py::dict info;
        info["applied"] = draw.applied;
        info["cutmix"] = draw.cutmix;
        info["lam"] = draw.lam;
        info["box"] = py::make_tuple(draw.box.x, draw.box.y, draw.box.w, draw.box.h);
        return std::make_pair(soft, info);
      },
      py::arg("images"), py::arg("labels"), py::arg("num_classes"), py::arg("mixup"),
      py::arg("cutmix"), py::arg("switch_prob") = 0.5, py::arg("chw") = false, py::arg("seed") = 0,
      "Mixes `images` in place; (soft labels, draw). mixup/cutmix: (alpha, p, label_smoothing).");
  m.def(
      "augment_group",
      [](const std::optional<py::bytes>& image, const std::optional<py::object>& mask,
         const std::optional<F32Array>& boxes, const std::string& fmt, bool normalized,
         const std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>&
             classes,
         const std::optional<F32Array>& keypoints, bool keypoints_normalized,
         const std::vector<ImageOp>& ops, uint64_t seed, const std::string& layout,
         const std::vector<py::dict>& others) {
        // Members in a fixed order: image, mask, boxes, classes, keypoints.
        GroupSpec spec;
        spec.ops = ops;
        spec.image.layout = image_layout_from_name(layout);
        std::vector<MemberIO> io;
        std::vector<std::string> holds;  // bytes the members read
        py::array mask_array;
        auto add = [&](GroupMember::Kind k, const char* name) -> GroupMember& {
          GroupMember g;
          g.kind = k;
          g.name = name;
          spec.members.push_back(g);
          io.emplace_back();
          return spec.members.back();
        };
        holds.reserve(2);
        if (image) {
          add(GroupMember::Kind::kImage, "image");
          holds.push_back(*image);
          io.back() = {reinterpret_cast<const uint8_t*>(holds.back().data()), holds.back().size()};
        }
        if (mask) {
          GroupMember& g = add(GroupMember::Kind::kMask, "mask");
          if (py::isinstance<py::bytes>(*mask)) {
            holds.push_back(mask->cast<std::string>());
            io.back() = {reinterpret_cast<const uint8_t*>(holds.back().data()),
                         holds.back().size()};
          } else {
            mask_array = py::array::ensure(*mask, py::array::c_style);
            STOKER_CHECK(mask_array && mask_array.ndim() == 2, UsageError,
                         "mask: bytes of a PNG, or an (h, w) integer array");
            g.encoded = false;
            g.elem_bytes = static_cast<int>(mask_array.itemsize());
            g.array_h = static_cast<int>(mask_array.shape(0));
            g.array_w = static_cast<int>(mask_array.shape(1));
            io.back() = {static_cast<const uint8_t*>(mask_array.data()),
                         static_cast<size_t>(mask_array.nbytes())};
          }
        }
        if (boxes) {
          GroupMember& g = add(GroupMember::Kind::kBoxes, "boxes");
          g.format = box_format_from_name(fmt);
          g.normalized = normalized;
          io.back() = {reinterpret_cast<const uint8_t*>(boxes->data()),
                       static_cast<size_t>(boxes->size()) * 4};
        }
        if (classes) {
          add(GroupMember::Kind::kRows, "classes").row_bytes = 8;
          io.back() = {reinterpret_cast<const uint8_t*>(classes->data()),
                       static_cast<size_t>(classes->size()) * 8};
        }
        if (keypoints) {
          STOKER_CHECK(keypoints->ndim() == 3 && keypoints->shape(2) == 3, UsageError,
                       "keypoints are (n, k, 3)");
          GroupMember& g = add(GroupMember::Kind::kKeypoints, "keypoints");
          g.num_keypoints = static_cast<int>(keypoints->shape(1));
          g.normalized = keypoints_normalized;
          io.back() = {reinterpret_cast<const uint8_t*>(keypoints->data()),
                       static_cast<size_t>(keypoints->size()) * 4};
        }
        const TransformGroup group(spec);
        // The other samples a Mosaic reads: dicts of the same members (PNG bytes for
        // the image and mask, arrays for the rest), in the members' order.
        STOKER_CHECK(static_cast<int>(others.size()) == group.samples() - 1, UsageError,
                     "the ops read ", group.samples(), " samples: give ", group.samples() - 1,
                     " others, got ", others.size());
        std::vector<std::vector<MemberIO>> other_io(others.size());
        std::vector<py::object> other_holds;
        std::vector<const MemberIO*> other_ptrs;
        for (size_t o = 0; o < others.size(); ++o) {
          for (const GroupMember& gm : spec.members) {
            const char* key = gm.kind == GroupMember::Kind::kImage   ? "image"
                              : gm.kind == GroupMember::Kind::kMask  ? "mask"
                              : gm.kind == GroupMember::Kind::kBoxes ? "boxes"
                              : gm.kind == GroupMember::Kind::kRows  ? "classes"
                                                                     : "keypoints";
            STOKER_CHECK(others[o].contains(key), UsageError, "others[", o, "] has no '", key, "'");
            py::object v = others[o][key];
            if (py::isinstance<py::bytes>(v)) {
              other_holds.push_back(v);
              char* data = nullptr;
              py::ssize_t n = 0;
              PYBIND11_BYTES_AS_STRING_AND_SIZE(v.ptr(), &data, &n);
              other_io[o].push_back(
                  {reinterpret_cast<const uint8_t*>(data), static_cast<size_t>(n)});
            } else {
              py::array a =
                  gm.kind == GroupMember::Kind::kRows
                      ? py::array(
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast>(v))
                      : py::array(F32Array(v));
              other_holds.push_back(a);
              other_io[o].push_back(
                  {static_cast<const uint8_t*>(a.data()), static_cast<size_t>(a.nbytes())});
            }
          }
          other_ptrs.push_back(other_io[o].data());
        }
        std::pair<int, int> hw;
        {
          py::gil_scoped_release nogil;
          hw = group.output_size(io.data());
        }
        const auto [h, w] = hw;
        const bool chw = spec.image.layout == ImageLayout::kCHW;
        py::dict r;
        py::array out_img, out_mask;
        std::vector<py::array> rows;
        size_t k = 0;
        if (image) {
          const std::vector<py::ssize_t> shape =
              chw ? std::vector<py::ssize_t>{3, h, w} : std::vector<py::ssize_t>{h, w, 3};
          switch (group.image_dtype()) {
            case DType::kUInt8:
              out_img = py::array_t<uint8_t>(shape);
              break;
            case DType::kFloat32:
              out_img = py::array_t<float>(shape);
              break;
            case DType::kFloat16:
              out_img = py::array(py::dtype("float16"), shape);
              break;
            default:
              out_img = py::array(py::dtype("uint16"), shape);  // bfloat16's bits
              break;
          }
          io[k++].out = out_img.mutable_data();
        }
        if (mask) {
          // A default py::array is an empty float64 array, not a null handle: the
          // member's own flag says whether the mask came as an array.
          const bool from_array = !spec.members[k].encoded;
          out_mask = from_array ? py::array(mask_array.dtype(), std::vector<py::ssize_t>{h, w})
                                : py::array(py::array_t<uint8_t>({h, w}));
          io[k++].out = out_mask.mutable_data();
        }
        std::vector<std::vector<uint8_t>> bufs;
        bufs.reserve(3);
        for (size_t i = k; i < io.size(); ++i) {
          size_t room = io[i].size;  // the rows of every sample
          for (const auto& o : other_io) room += o[i].size;
          bufs.emplace_back(room);
          io[i].out = bufs.back().data();
        }
        {
          py::gil_scoped_release nogil;
          group.run(io.data(), seed, h, w, nullptr,
                    other_ptrs.empty() ? nullptr : other_ptrs.data());
        }
        if (image) r["image"] = out_img;
        if (mask) r["mask"] = out_mask;
        size_t b = 0;
        for (size_t i = k; i < io.size(); ++i, ++b) {
          const GroupMember& g = spec.members[i];
          const int64_t n = io[i].out_rows;
          if (g.kind == GroupMember::Kind::kBoxes) {
            py::array_t<float> a({static_cast<py::ssize_t>(n), py::ssize_t{4}});
            std::memcpy(a.mutable_data(), bufs[b].data(), static_cast<size_t>(n) * 16);
            r["boxes"] = a;
          } else if (g.kind == GroupMember::Kind::kRows) {
            r["classes"] = py::array_t<int64_t>(n, reinterpret_cast<int64_t*>(bufs[b].data()));
          } else {
            py::array_t<float> a({static_cast<py::ssize_t>(n),
                                  static_cast<py::ssize_t>(g.num_keypoints), py::ssize_t{3}});
            std::memcpy(a.mutable_data(), bufs[b].data(),
                        static_cast<size_t>(n) * g.num_keypoints * 12);
            r["keypoints"] = a;
          }
        }
        return r;
      },
      py::arg("image") = py::none(), py::arg("mask") = py::none(), py::arg("boxes") = py::none(),
      py::arg("format") = "xyxy", py::arg("normalized") = false, py::arg("classes") = py::none(),
      py::arg("keypoints") = py::none(), py::arg("keypoints_normalized") = false,
      py::arg("ops") = std::vector<ImageOp>{}, py::arg("seed") = 0, py::arg("layout") = "HWC",
      py::arg("others") = std::vector<py::dict>{},
      "One sample through a transform group (ops: stoker.ops._specs(...)); a dict of the "
      "members given: image, mask, boxes, classes, keypoints.");
}

}  // namespace stoker::testing
