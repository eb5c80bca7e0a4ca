// MixUp and CutMix on an assembled batch, with soft labels from an integer
// label field: torchvision.transforms.v2.MixUp/CutMix (lambda ~ Beta(alpha,
// alpha), each row mixed with the row before it, torch.roll(1)), with timm's
// additions: a probability of mixing at all, label smoothing, and with both
// ops the choice of one per batch (CutMix with probability switch_prob).
#pragma once

#include <cstdint>
#include <optional>

#include "codecs/image_info.h"
#include "common/dtype.h"
#include "geometry/detail/rng.h"

namespace stoker {

struct MixParams {
  double alpha = 1.0;            ///< Beta(alpha, alpha)
  double p = 1.0;                ///< probability that a batch is mixed
  double label_smoothing = 0.0;  ///< timm: off = s / K, on = 1 - s + s / K
};

struct BatchMixSpec {
  std::optional<MixParams> mixup;
  std::optional<MixParams> cutmix;
  double switch_prob = 0.5;  ///< with both: the probability of CutMix for a batch
  int num_classes = 0;
};

/// UsageError naming the op for alpha <= 0, a probability or a label
/// smoothing outside [0, 1], or num_classes < 1.
void check_batch_mix(const BatchMixSpec& spec);

/// One batch's draw.
struct MixDraw {
  bool applied = false;  ///< false: images untouched, labels one-hot (smoothed)
  bool cutmix = false;
  double lam = 1.0;  ///< weight of the row itself (CutMix: the area it keeps)
  PixelRect box;     ///< CutMix: the pasted window
  double label_smoothing = 0.0;
};

/// Draws a batch's mix for images of (height x width): the switch (when both
/// ops are given), then p, then lambda, then CutMix's box as torchvision:
/// centre uniform over the pixels, half sizes int(0.5 sqrt(1 - lam) * size),
/// clipped; lambda is corrected to the area kept.
MixDraw draw_batch_mix(const BatchMixSpec& spec, int height, int width, detail::SplitMix64& rng);

/// Mixes `batch` images in place (uint8, float32, float16 or bfloat16; HWC, or
/// CHW when `chw`): row i with row i - 1 (row 0 with the last). MixUp on uint8
/// rounds half to even (timm's blend), floats are exact in float32.
void mix_images(void* data, DType dtype, bool chw, int64_t batch, int height, int width,
                int channels, const MixDraw& d);

/// Soft labels (batch x num_classes float32) from integer labels:
/// lam * onehot(y_i) + (1 - lam) * onehot(y_{i-1}), smoothed. DataError naming
/// the row for a label outside [0, num_classes).
void mix_labels(const int64_t* labels, int64_t batch, int num_classes, const MixDraw& d,
                float* out);

}  // namespace stoker
