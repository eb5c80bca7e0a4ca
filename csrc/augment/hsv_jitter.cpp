#include "augment/hsv_jitter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/detail/multiversion.h"

namespace stoker {

namespace {

constexpr int kShift = 12;  // OpenCV's hsv_shift

// OpenCV's division tables: round((255 << 12) / v) and round((180 << 12) / (6 d)).
struct DivTables {
  int32_t sdiv[256];
  int32_t hdiv[256];
  DivTables() {
    sdiv[0] = hdiv[0] = 0;
    for (int i = 1; i < 256; ++i) {
      sdiv[i] = static_cast<int32_t>(std::nearbyint((255 << kShift) / (1.0 * i)));
      hdiv[i] = static_cast<int32_t>(std::nearbyint((180 << kShift) / (6.0 * i)));
    }
  }
};

const DivTables& div_tables() {
  static const DivTables t;
  return t;
}

// The three tables of a draw, as ultralytics builds them (float64, truncated to
// uint8), held as the floats the HSV -> RGB step reads: 32-bit entries, so that
// the lookups vectorise (8-bit tables made the loop below scalar, 3x slower).
struct Luts {
  float h[256], s[256], v[256];
  explicit Luts(const HsvGains& g) {
    for (int x = 0; x < 256; ++x) {
      h[x] = static_cast<uint8_t>(std::fmod(x * g.h, 180.0));  // x * r >= 0: % is fmod
      s[x] = static_cast<uint8_t>(std::clamp(x * g.s, 0.0, 255.0));
      v[x] = static_cast<uint8_t>(std::clamp(x * g.v, 0.0, 255.0));
    }
  }
};

// RGB -> OpenCV 8-bit HSV (exact integer arithmetic), then the tables.
STOKER_MULTIVERSION
void to_hsv(const uint8_t* __restrict row, int w, const Luts& l, const DivTables& t,
            float* __restrict hf, float* __restrict sf, float* __restrict vf) {
  for (int x = 0; x < w; ++x) {
    const int r = row[3 * x], g = row[3 * x + 1], b = row[3 * x + 2];
    const int v = std::max(std::max(r, g), b);
    const int vmin = std::min(std::min(r, g), b);
    const int diff = v - vmin;
    const int vr = v == r ? -1 : 0, vg = v == g ? -1 : 0;
    const int s = (diff * t.sdiv[v] + (1 << (kShift - 1))) >> kShift;
    int h = (vr & (g - b)) + (~vr & ((vg & (b - r + 2 * diff)) + (~vg & (r - g + 4 * diff))));
    h = (h * t.hdiv[diff] + (1 << (kShift - 1))) >> kShift;
    h += h < 0 ? 180 : 0;
    hf[x] = l.h[h];
    sf[x] = l.s[s];
    vf[x] = l.v[v];
  }
}

// OpenCV's HSV2RGB_b (its vector path): float32, sector by truncation,
// results truncated after * 255. Branch-free so that it vectorises.
STOKER_MULTIVERSION
void to_rgb(float* hf, float* sf, float* vf, int w) {
  constexpr float kHScale = 6.0f / 180.0f, kInv255 = 1.0f / 255.0f;
  for (int x = 0; x < w; ++x) {
    const float hh = hf[x] * kHScale;
    const float s = sf[x] * kInv255, v = vf[x] * kInv255;
    const float pre = static_cast<float>(static_cast<int32_t>(hh));
    const float f = hh - pre;
    const float t0 = v;
    const float t1 = v * (1.0f - s);
    const float t2 = v * (1.0f - s * f);
    const float t3 = v * (1.0f - s * (1.0f - f));
    const float sector = pre - static_cast<float>(static_cast<int32_t>(pre * (1.0f / 6.0f))) * 6.0f;
    float b = t2;  // sector > 4
    b = sector == 4.0f ? t0 : b;
    b = sector == 3.0f ? t0 : b;
    b = sector == 2.0f ? t3 : b;
    b = sector < 2.0f ? t1 : b;
    float g = t1;  // sector > 3
    g = sector == 3.0f ? t2 : g;
    g = sector == 2.0f ? t0 : g;
    g = sector == 1.0f ? t0 : g;
    g = sector < 1.0f ? t3 : g;
    float r = t0;  // sector > 4
    r = sector == 4.0f ? t3 : r;
    r = sector == 3.0f ? t1 : r;
    r = sector == 2.0f ? t1 : r;
    r = sector == 1.0f ? t2 : r;
    r = sector < 1.0f ? t0 : r;
    hf[x] = r * 255.0f;
    sf[x] = g * 255.0f;
    vf[x] = b * 255.0f;
  }
}

STOKER_MULTIVERSION
void store(const float* r, const float* g, const float* b, int w, uint8_t* row) {
  for (int x = 0; x < w; ++x) {
    // v_trunc then v_pack_u: saturating
    const int32_t ri = static_cast<int32_t>(r[x]), gi = static_cast<int32_t>(g[x]),
                  bi = static_cast<int32_t>(b[x]);
    row[3 * x] = static_cast<uint8_t>(std::clamp(ri, 0, 255));
    row[3 * x + 1] = static_cast<uint8_t>(std::clamp(gi, 0, 255));
    row[3 * x + 2] = static_cast<uint8_t>(std::clamp(bi, 0, 255));
  }
}

struct HsvScratch {
  std::vector<float> f[3];
};

}  // namespace

HsvGains draw_hsv_gains(double h_gain, double s_gain, double v_gain, detail::SplitMix64& rng) {
  HsvGains g;
  g.h = rng.uniform(-1, 1) * h_gain + 1;
  g.s = rng.uniform(-1, 1) * s_gain + 1;
  g.v = rng.uniform(-1, 1) * v_gain + 1;
  return g;
}

void apply_hsv_gains(Pixels img, const HsvGains& g) {
  if (img.empty() || img.channels != 3) return;
  thread_local HsvScratch s;
  for (auto& f : s.f)
    if (f.size() < static_cast<size_t>(img.width)) f.resize(img.width);
  const Luts l(g);
  const DivTables& t = div_tables();
  for (int y = 0; y < img.height; ++y) {
    uint8_t* row = img.row(y);
    to_hsv(row, img.width, l, t, s.f[0].data(), s.f[1].data(), s.f[2].data());
    to_rgb(s.f[0].data(), s.f[1].data(), s.f[2].data(), img.width);
    store(s.f[0].data(), s.f[1].data(), s.f[2].data(), img.width, row);
  }
}

}  // namespace stoker
