#include "decode/resize.h"

#include <algorithm>
#include <cmath>

namespace stoker {

namespace {

// Filter taps of one axis: for each output index, first input index and weights.
struct Taps {
  std::vector<int> start;
  std::vector<int> count;
  std::vector<float> weights;  // count[i] weights at i * max_taps
  int max_taps = 0;
};

Taps make_taps(int in, int out) {
  Taps t;
  const double scale = static_cast<double>(in) / out;
  const double fscale = std::max(scale, 1.0);
  const double support = fscale;  // triangle filter has support 1
  t.max_taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.start.resize(out);
  t.count.resize(out);
  t.weights.assign(static_cast<size_t>(out) * t.max_taps, 0.f);
  for (int i = 0; i < out; ++i) {
    const double center = (i + 0.5) * scale;
    int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    int hi = std::min(static_cast<int>(center + support + 0.5), in);
    hi = std::min(hi, lo + t.max_taps);
    double sum = 0;
    float* w = &t.weights[static_cast<size_t>(i) * t.max_taps];
    for (int x = lo; x < hi; ++x) {
      double d = std::abs((x - center + 0.5) / fscale);
      double v = d < 1.0 ? 1.0 - d : 0.0;
      w[x - lo] = static_cast<float>(v);
      sum += v;
    }
    if (sum > 0)
      for (int x = lo; x < hi; ++x) w[x - lo] = static_cast<float>(w[x - lo] / sum);
    t.start[i] = lo;
    t.count[i] = hi - lo;
  }
  return t;
}

inline uint8_t clamp8(float v) {
  return static_cast<uint8_t>(std::min(255.f, std::max(0.f, v + 0.5f)));
}

}  // namespace

void resize_rgb(const uint8_t* src, int stride, int x0, int y0, int w, int h, uint8_t* dst,
                int out_w, int out_h, std::vector<float>& scratch) {
  const Taps tx = make_taps(w, out_w);
  const Taps ty = make_taps(h, out_h);
  // Horizontal pass over the rows the vertical pass needs, into floats.
  scratch.resize(static_cast<size_t>(h) * out_w * 3);
  for (int y = 0; y < h; ++y) {
    const uint8_t* row = src + static_cast<size_t>(y0 + y) * stride + static_cast<size_t>(x0) * 3;
    float* out = &scratch[static_cast<size_t>(y) * out_w * 3];
    for (int i = 0; i < out_w; ++i) {
      const float* wt = &tx.weights[static_cast<size_t>(i) * tx.max_taps];
      const uint8_t* p = row + static_cast<size_t>(tx.start[i]) * 3;
      float r = 0, g = 0, b = 0;
      for (int k = 0; k < tx.count[i]; ++k) {
        r += wt[k] * p[3 * k];
        g += wt[k] * p[3 * k + 1];
        b += wt[k] * p[3 * k + 2];
      }
      // Round to 8 bits between passes, as PIL does.
      out[3 * i] = clamp8(r);
      out[3 * i + 1] = clamp8(g);
      out[3 * i + 2] = clamp8(b);
    }
  }
  for (int j = 0; j < out_h; ++j) {
    const float* wt = &ty.weights[static_cast<size_t>(j) * ty.max_taps];
    uint8_t* out = dst + static_cast<size_t>(j) * out_w * 3;
    for (int i = 0; i < out_w * 3; ++i) {
      float v = 0;
      for (int k = 0; k < ty.count[j]; ++k)
        v += wt[k] * scratch[static_cast<size_t>(ty.start[j] + k) * out_w * 3 + i];
      out[i] = clamp8(v);
    }
  }
}

}  // namespace stoker
