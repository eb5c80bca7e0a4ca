#include "geometry/image_ops.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/error.h"
#include "geometry/crop_params.h"
#include "geometry/op_context.h"

namespace stoker {

namespace {

// Sizes up to 2^20 pixels a side: an image's dimensions fit in an int with room to spare.
constexpr int kMaxSide = 1 << 20;

void check_side(const char* op, const char* name, int v, bool zero_ok) {
  STOKER_CHECK((v >= 1 || (zero_ok && v == 0)) && v <= kMaxSide, UsageError, op, ": ", name,
               " must be ", zero_ok ? ops::kWholeOrZero : ops::kPositiveWhole, " up to ", kMaxSide,
               ", got ", v);
}

}  // namespace

namespace ops {

// ---- RandomResizedCrop ------------------------------------------------------

void RandomResizedCrop::check() const {
  check_side(kName, "h", h, false);
  check_side(kName, "w", w, false);
  STOKER_CHECK(
      std::isfinite(scale_lo) && std::isfinite(scale_hi) && 0 < scale_lo && scale_lo <= scale_hi,
      UsageError, kName, ": scale must satisfy 0 < lo <= hi, got (", scale_lo, ", ", scale_hi, ")");
  STOKER_CHECK(
      std::isfinite(ratio_lo) && std::isfinite(ratio_hi) && 0 < ratio_lo && ratio_lo <= ratio_hi,
      UsageError, kName, ": ratio must satisfy 0 < lo <= hi, got (", ratio_lo, ", ", ratio_hi, ")");
}

void RandomResizedCrop::apply(OpContext& ctx) const {
  // The log-ratio is drawn uniformly, as torchvision does.
  ctx.crop(random_resized_crop_rect(ctx.width(), ctx.height(), scale_lo, scale_hi,
                                    std::log(ratio_lo), std::log(ratio_hi), ctx.rng()));
  ctx.resize(w, h);
}

// ---- Resize -------------------------------------------------------------------

void Resize::check() const {
  const bool sized = h > 0 && w > 0 && shorter == 0 && max_size == 0;
  const bool by_side = h == 0 && w == 0 && (shorter > 0 || max_size > 0);
  STOKER_CHECK(sized || by_side, UsageError, kName,
               ": give either a positive size for the shorter side (with or without max_size), a "
               "positive (h, w), or max_size alone, got h=",
               h, ", w=", w, ", shorter=", shorter, ", max_size=", max_size);
  check_side(kName, "h", h, true);
  check_side(kName, "w", w, true);
  check_side(kName, "shorter", shorter, true);
  check_side(kName, "max_size", max_size, true);
  STOKER_CHECK(
      max_size == 0 || shorter == 0 || max_size > shorter, UsageError, kName,
      ": max_size = ", max_size,
      " must be strictly greater than the requested size for the smaller edge = ", shorter);
}

std::pair<int, int> Resize::size_after(std::pair<int, int> hw) const {
  if (shorter == 0 && max_size == 0) return {h, w};
  // torchvision's _compute_resized_output_size, in integers (int() of the
  // exact quotient, as its float division gives for sizes this small)
  const int64_t ih = hw.first, iw = hw.second;
  const int64_t short_side = std::min(ih, iw), long_side = std::max(ih, iw);
  int64_t new_short, new_long;
  if (shorter == 0) {
    new_short = max_size * short_side / long_side;
    new_long = max_size;
  } else {
    new_short = shorter;
    new_long = shorter * long_side / short_side;
    if (max_size > 0 && new_long > max_size) {
      new_short = max_size * new_short / new_long;
      new_long = max_size;
    }
  }
  new_short = std::max<int64_t>(new_short, 1);
  return iw <= ih ? std::pair<int, int>(static_cast<int>(new_long), static_cast<int>(new_short))
                  : std::pair<int, int>(static_cast<int>(new_short), static_cast<int>(new_long));
}

void Resize::apply(OpContext& ctx) const {
  const auto [oh, ow] = size_after({ctx.height(), ctx.width()});
  ctx.resize(ow, oh);
}

// ---- CenterCrop ---------------------------------------------------------------

void CenterCrop::check() const {
  check_side(kName, "h", h, false);
  check_side(kName, "w", w, false);
}

void CenterCrop::apply(OpContext& ctx) const {
  ctx.crop(center_crop_rect(ctx.width(), ctx.height(), w, h));
}

// ---- RandomHorizontalFlip -------------------------------------------------------

void RandomHorizontalFlip::check() const {
  STOKER_CHECK(p >= 0 && p <= 1, UsageError, kName, ": p must be ", kInUnit, ", got ", p);
  STOKER_CHECK(flip_pairs.size() % 2 == 0, UsageError, kName,
               ": flip_pairs must be pairs of keypoint indices");
  for (int i : flip_pairs)
    STOKER_CHECK(i >= 0, UsageError, kName, ": flip_pairs names keypoint ", i,
                 ": indices start at 0");
}

void RandomHorizontalFlip::apply(OpContext& ctx) const {
  // Always draw, so later draws do not depend on this one's outcome.
  if (ctx.rng().uniform(0, 1) < p) ctx.flip();
}

// ---- RandomVerticalFlip ---------------------------------------------------------

void RandomVerticalFlip::check() const {
  STOKER_CHECK(p >= 0 && p <= 1, UsageError, kName, ": p must be ", kInUnit, ", got ", p);
}

void RandomVerticalFlip::apply(OpContext& ctx) const {
  if (ctx.rng().uniform(0, 1) < p) ctx.vflip();
}

// ---- Normalize ------------------------------------------------------------------

void Normalize::check() const {
  for (int c = 0; c < 3; ++c) {
    STOKER_CHECK(std::isfinite(mean[c]) && std::isfinite(stddev[c]), UsageError, kName,
                 ": mean and std must be finite");
    STOKER_CHECK(stddev[c] != 0, UsageError, kName, ": std must be non-zero");
  }
  STOKER_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16,
               UsageError, kName, ": dtype must be ", kFloatType, ", got '", dtype_name(dtype),
               "'");
}

void Normalize::apply(OpContext& ctx) const { ctx.normalize(*this); }

}  // namespace ops

// ---- over any op ------------------------------------------------------------------

namespace {
template <typename Op>
constexpr bool on_output() {
  if constexpr (requires { Op::kOutput; })
    return Op::kOutput;
  else
    return false;
}
}  // namespace

const char* op_name(const ImageOp& op) {
  return std::visit([](const auto& o) { return std::remove_cvref_t<decltype(o)>::kName; }, op);
}

ops::TargetRule op_target_rule(const ImageOp& op) {
  return std::visit(
      [](const auto& o) { return ops::target_rule<std::remove_cvref_t<decltype(o)>>(); }, op);
}

namespace {
template <typename Op>
bool random_size(const Op& op) {
  if constexpr (requires { op.random_size(); })
    return op.random_size();
  else
    return false;
}
template <typename Op>
bool fixes_size(const Op& op) {
  if constexpr (requires { op.fixes_size(); })
    return op.fixes_size();
  else
    return false;
}
}  // namespace

void check_image_ops(const std::vector<ImageOp>& list) {
  // Ops on the output (RandomErasing) may follow one that must be last.
  size_t last = list.size();
  while (last > 0 &&
         std::visit([](const auto& o) { return on_output<std::remove_cvref_t<decltype(o)>>(); },
                    list[last - 1]))
    --last;
  const char* open_size = nullptr;  // an op giving each image its own size, not yet fixed
  for (size_t i = 0; i < list.size(); ++i)
    std::visit(
        [&](const auto& op) {
          using Op = std::remove_cvref_t<decltype(op)>;
          op.check();
          if constexpr (requires { Op::kLast; })
            STOKER_CHECK(i + 1 == last, UsageError, Op::kName,
                         " must be the last op (RandomErasing may follow it)");
          if constexpr (on_output<Op>())
            STOKER_CHECK(i >= last, UsageError, Op::kName,
                         " acts on the written output: it must come after every other op");
          if constexpr (requires { Op::kSamples; })
            STOKER_CHECK(i == 0, UsageError, Op::kName,
                         " must be the first op of its list: it reads more samples and makes "
                         "the canvas the ops after it work on");
          if (fixes_size(op)) open_size = nullptr;
          if (random_size(op)) open_size = Op::kName;
        },
        list[i]);
  STOKER_CHECK(open_size == nullptr, UsageError, open_size,
               "(expand=True) gives every image a size of its own: follow it with an op that "
               "fixes the size (Resize((h, w)), CenterCrop, RandomResizedCrop, RandomCrop or "
               "Letterbox) so that images can be batched");
}

std::pair<int, int> size_after(const ImageOp& op, std::pair<int, int> hw) {
  return std::visit(
      [&](const auto& o) {
        if constexpr (requires { o.size_after(hw); })
          return o.size_after(hw);
        else
          return hw;
      },
      op);
}

std::optional<std::pair<int, int>> fixed_output_size(const std::vector<ImageOp>& list) {
  std::optional<std::pair<int, int>> fixed;
  for (const ImageOp& op : list)
    std::visit(
        [&](const auto& o) {
          // An op that fixes the size sets it; one that changes it (Pad, Resize(int))
          // keeps it fixed when its input size is.
          if constexpr (requires { o.size_after(std::pair<int, int>{}); })
            fixed = o.fixes_size()   ? std::optional(o.size_after({0, 0}))
                    : random_size(o) ? std::nullopt
                    : fixed          ? std::optional(o.size_after(*fixed))
                                     : std::nullopt;
        },
        op);
  return fixed;
}

int samples_read(const std::vector<ImageOp>& list) {
  if (list.empty()) return 1;
  return std::visit(
      [](const auto& o) {
        using Op = std::remove_cvref_t<decltype(o)>;
        if constexpr (requires { Op::kSamples; }) {
          static_assert(Op::kSamples <= kMaxSamples, "kMaxSamples bounds the callers' arrays");
          return Op::kSamples;
        } else {
          return 1;
        }
      },
      list[0]);
}

DType output_dtype(const std::vector<ImageOp>& list) {
  DType out = DType::kUInt8;
  for (const ImageOp& op : list)
    std::visit(
        [&](const auto& o) {
          if constexpr (requires { o.out_dtype(); }) out = o.out_dtype();
        },
        op);
  return out;
}

}  // namespace stoker
