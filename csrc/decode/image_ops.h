// The image ops, typed. Python passes each op as (kind, [numbers]) (the
// stoker.ops.Op contract); parse_image_op() turns that into one of these
// structs once, when a pipeline is built, and checks it. Sizes are named
// (h, w) everywhere, so no call site has to remember an argument order.
//
//   kind                     args
//   "random_resized_crop"    h, w, scale_lo, scale_hi, log_ratio_lo, log_ratio_hi
//   "resize"                 size, -1 (shorter side to size)  or  h, w (exact)
//   "center_crop"            h, w
//   "random_horizontal_flip" p
//   "normalize"              mean0..2, std0..2, dtype (0 = float32, 1 = float16); must be last
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/dtype.h"

namespace stoker {

/// One op as it crosses the boundary from Python: a kind and its numbers.
struct OpSpec {
  std::string kind;
  std::vector<double> args;
};

namespace ops {

struct RandomResizedCrop {
  int h = 0, w = 0;
  double scale_lo = 0.08, scale_hi = 1.0;
  double log_ratio_lo = 0, log_ratio_hi = 0;
};
/// Shorter side to `size` (keeping the aspect ratio) when `shorter`, else exactly (h, w).
struct Resize {
  bool shorter = false;
  int size = 0;
  int h = 0, w = 0;
};
struct CenterCrop {
  int h = 0, w = 0;
};
struct HorizontalFlip {
  double p = 0.5;
};
struct Normalize {
  double mean[3] = {0, 0, 0};
  double stddev[3] = {1, 1, 1};
  DType dtype = DType::kFloat32;
};

}  // namespace ops

using ImageOp = std::variant<ops::RandomResizedCrop, ops::Resize, ops::CenterCrop,
                             ops::HorizontalFlip, ops::Normalize>;

/// Checks and converts one op: UsageError naming the op for an unknown kind, a
/// wrong number of arguments or a value out of range.
ImageOp parse_image_op(const OpSpec& spec);

/// Parses a whole list; also checks that Normalize, if present, is last.
std::vector<ImageOp> parse_image_ops(const std::vector<OpSpec>& specs);

/// The (h, w) an image of size (h, w) has after `op` (sizes only, no pixels).
std::pair<int, int> size_after(const ImageOp& op, std::pair<int, int> hw);

/// The output (h, w) when the ops fix it whatever the input size, else nullopt.
std::optional<std::pair<int, int>> fixed_output_size(const std::vector<ImageOp>& ops);

/// kUInt8, or Normalize's dtype.
DType output_dtype(const std::vector<ImageOp>& ops);

}  // namespace stoker
