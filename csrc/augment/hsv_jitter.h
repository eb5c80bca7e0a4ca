// The HSV jitter of YOLO recipes (ultralytics' augment_hsv, hsv_h/hsv_s/hsv_v):
// random gains on hue, saturation and value applied as tables in OpenCV's
// 8-bit HSV space (H in [0, 180), S and V in [0, 255]):
//
//   r = uniform(-1, 1, 3) * (h_gain, s_gain, v_gain) + 1
//   H -> (H * r0) mod 180, S -> clip(S * r1), V -> clip(V * r2)
//
// The conversions are OpenCV's cvtColor RGB2HSV (integer, exact) and
// HSV2RGB (float32, rounded), so that results match cv2 to a level.
#pragma once

#include <cstdint>

#include "codecs/pixels.h"
#include "geometry/detail/rng.h"

namespace stoker {

/// The three gains drawn as ultralytics draws them (np.random.uniform(-1, 1, 3)).
struct HsvGains {
  double h = 1, s = 1, v = 1;
};
HsvGains draw_hsv_gains(double h_gain, double s_gain, double v_gain, detail::SplitMix64& rng);

/// Applies the gains to an RGB image in place. Thread-safe; no allocation.
void apply_hsv_gains(Pixels img, const HsvGains& g);

}  // namespace stoker
