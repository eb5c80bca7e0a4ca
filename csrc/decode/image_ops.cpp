#include "decode/image_ops.h"

#include <cmath>

#include "common/error.h"
#include "decode/crop_params.h"

namespace stoker {

namespace {

bool is_size(double v) { return v >= 1 && v <= 1 << 20 && v == std::floor(v); }

void check_count(const OpSpec& s, size_t n) {
  STOKER_CHECK(s.args.size() == n, UsageError, "op '", s.kind, "' takes ", n, " arguments, got ",
               s.args.size());
}

}  // namespace

ImageOp parse_image_op(const OpSpec& s) {
  const auto& a = s.args;
  if (s.kind == "random_resized_crop") {
    check_count(s, 6);
    STOKER_CHECK(is_size(a[0]) && is_size(a[1]), UsageError,
                 "random_resized_crop: size must be whole numbers >= 1");
    STOKER_CHECK(0 < a[2] && a[2] <= a[3], UsageError,
                 "random_resized_crop: scale must satisfy 0 < lo <= hi");
    STOKER_CHECK(a[4] <= a[5], UsageError, "random_resized_crop: ratio must satisfy lo <= hi");
    return ops::RandomResizedCrop{int(a[0]), int(a[1]), a[2], a[3], a[4], a[5]};
  }
  if (s.kind == "resize") {
    check_count(s, 2);
    if (a[1] == -1) {
      STOKER_CHECK(is_size(a[0]), UsageError, "resize: size must be a whole number >= 1");
      return ops::Resize{true, int(a[0]), 0, 0};
    }
    STOKER_CHECK(is_size(a[0]) && is_size(a[1]), UsageError,
                 "resize: size must be whole numbers >= 1");
    return ops::Resize{false, 0, int(a[0]), int(a[1])};
  }
  if (s.kind == "center_crop") {
    check_count(s, 2);
    STOKER_CHECK(is_size(a[0]) && is_size(a[1]), UsageError,
                 "center_crop: size must be whole numbers >= 1");
    return ops::CenterCrop{int(a[0]), int(a[1])};
  }
  if (s.kind == "random_horizontal_flip") {
    check_count(s, 1);
    STOKER_CHECK(a[0] >= 0 && a[0] <= 1, UsageError, "random_horizontal_flip: p must be in [0, 1]");
    return ops::HorizontalFlip{a[0]};
  }
  if (s.kind == "normalize") {
    check_count(s, 7);
    STOKER_CHECK(a[3] != 0 && a[4] != 0 && a[5] != 0, UsageError,
                 "normalize: std must be non-zero");
    STOKER_CHECK(a[6] == 0 || a[6] == 1, UsageError,
                 "normalize: dtype must be 0 (float32) or 1 (float16)");
    ops::Normalize n;
    for (int c = 0; c < 3; ++c) {
      n.mean[c] = a[c];
      n.stddev[c] = a[3 + c];
    }
    n.dtype = a[6] == 1 ? DType::kFloat16 : DType::kFloat32;
    return n;
  }
  STOKER_THROW(UsageError, "unknown image op '", s.kind, "'");
}

std::vector<ImageOp> parse_image_ops(const std::vector<OpSpec>& specs) {
  std::vector<ImageOp> out;
  out.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back(parse_image_op(specs[i]));
    STOKER_CHECK(!std::holds_alternative<ops::Normalize>(out.back()) || i + 1 == specs.size(),
                 UsageError, "Normalize must be the last op");
  }
  return out;
}

std::pair<int, int> size_after(const ImageOp& op, std::pair<int, int> hw) {
  if (const auto* r = std::get_if<ops::Resize>(&op)) {
    if (!r->shorter) return {r->h, r->w};
    int h, w;
    shorter_side_size(hw.first, hw.second, r->size, &h, &w);
    return {h, w};
  }
  if (const auto* c = std::get_if<ops::RandomResizedCrop>(&op)) return {c->h, c->w};
  if (const auto* c = std::get_if<ops::CenterCrop>(&op)) return {c->h, c->w};
  return hw;
}

std::optional<std::pair<int, int>> fixed_output_size(const std::vector<ImageOp>& list) {
  std::optional<std::pair<int, int>> fixed;
  for (const ImageOp& op : list) {
    if (const auto* r = std::get_if<ops::Resize>(&op)) {
      fixed = r->shorter ? std::nullopt : std::optional<std::pair<int, int>>({r->h, r->w});
    } else if (const auto* c = std::get_if<ops::RandomResizedCrop>(&op)) {
      fixed = std::make_pair(c->h, c->w);
    } else if (const auto* c = std::get_if<ops::CenterCrop>(&op)) {
      fixed = std::make_pair(c->h, c->w);
    }
  }
  return fixed;
}

DType output_dtype(const std::vector<ImageOp>& list) {
  for (const ImageOp& op : list)
    if (const auto* n = std::get_if<ops::Normalize>(&op)) return n->dtype;
  return DType::kUInt8;
}

}  // namespace stoker
