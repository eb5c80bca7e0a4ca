#include "augment/batch_mix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/detail/half.h"
#include "common/detail/rounding.h"
#include "common/error.h"
#include "geometry/detail/random_draws.h"

namespace stoker {

void check_batch_mix(const BatchMixSpec& spec) {
  STOKER_CHECK(spec.mixup || spec.cutmix, UsageError, "a batch mix needs MixUp or CutMix");
  for (const auto* m : {&spec.mixup, &spec.cutmix}) {
    if (!*m) continue;
    const char* name = m == &spec.mixup ? "MixUp" : "CutMix";
    const MixParams& q = **m;
    STOKER_CHECK(std::isfinite(q.alpha) && q.alpha > 0, UsageError, name,
                 ": alpha must be > 0, got ", q.alpha);
    STOKER_CHECK(q.p >= 0 && q.p <= 1, UsageError, name, ": p must be in [0, 1], got ", q.p);
    STOKER_CHECK(q.label_smoothing >= 0 && q.label_smoothing < 1, UsageError, name,
                 ": label_smoothing must be in [0, 1), got ", q.label_smoothing);
  }
  STOKER_CHECK(spec.switch_prob >= 0 && spec.switch_prob <= 1, UsageError,
               "MixUp/CutMix: switch_prob must be in [0, 1], got ", spec.switch_prob);
  STOKER_CHECK(spec.num_classes >= 1, UsageError, "MixUp/CutMix: num_classes must be >= 1, got ",
               spec.num_classes);
}

MixDraw draw_batch_mix(const BatchMixSpec& spec, int height, int width, detail::SplitMix64& rng) {
  STOKER_CHECK(spec.mixup || spec.cutmix, UsageError, "a batch mix needs MixUp or CutMix");
  MixDraw d;
  bool cutmix = !spec.mixup.has_value();
  if (spec.mixup && spec.cutmix) cutmix = rng.uniform(0, 1) < spec.switch_prob;
  const MixParams& m = cutmix ? *spec.cutmix : *spec.mixup;
  d.cutmix = cutmix;
  d.label_smoothing = m.label_smoothing;
  if (!(rng.uniform(0, 1) < m.p)) return d;
  d.applied = true;
  d.lam = detail::beta(rng, m.alpha, m.alpha);
  if (!cutmix) return d;
  const int rx = static_cast<int>(rng.randint(0, width - 1));
  const int ry = static_cast<int>(rng.randint(0, height - 1));
  const double r = 0.5 * std::sqrt(1.0 - d.lam);
  const int half_w = static_cast<int>(r * width), half_h = static_cast<int>(r * height);
  const int x1 = std::max(rx - half_w, 0), y1 = std::max(ry - half_h, 0);
  const int x2 = std::min(rx + half_w, width), y2 = std::min(ry + half_h, height);
  d.box = {x1, y1, x2 - x1, y2 - y1};
  d.lam = 1.0 - static_cast<double>(x2 - x1) * (y2 - y1) / (static_cast<double>(width) * height);
  return d;
}

namespace {

struct Mixer {
  const MixDraw& d;
  bool chw;
  int height, width, channels;

  // Mixes image `a` with `b` (element type T), writing into `a`.
  template <typename T, typename Load, typename Store>
  void apply(T* a, const T* b, Load load, Store store) const {
    const size_t n = static_cast<size_t>(height) * width * channels;
    if (!d.cutmix) {
      const float lam = static_cast<float>(d.lam), rest = static_cast<float>(1.0 - d.lam);
      for (size_t i = 0; i < n; ++i) a[i] = store(load(a[i]) * lam + load(b[i]) * rest);
      return;
    }
    const PixelRect& r = d.box;
    if (r.w <= 0 || r.h <= 0) return;
    if (chw) {
      const size_t plane = static_cast<size_t>(height) * width;
      for (int c = 0; c < channels; ++c)
        for (int y = r.y; y < r.y + r.h; ++y) {
          const size_t off = c * plane + static_cast<size_t>(y) * width + r.x;
          std::memcpy(a + off, b + off, static_cast<size_t>(r.w) * sizeof(T));
        }
    } else {
      for (int y = r.y; y < r.y + r.h; ++y) {
        const size_t off = (static_cast<size_t>(y) * width + r.x) * channels;
        std::memcpy(a + off, b + off, static_cast<size_t>(r.w) * channels * sizeof(T));
      }
    }
  }

  // Every row with the row before it (row 0 with the original last row), in place.
  template <typename T, typename Load, typename Store>
  void batch(T* data, int64_t rows, Load load, Store store) const {
    const size_t n = static_cast<size_t>(height) * width * channels;
    thread_local std::vector<uint8_t> last_bytes;
    last_bytes.resize(n * sizeof(T));
    T* last = reinterpret_cast<T*>(last_bytes.data());
    std::memcpy(last, data + (rows - 1) * n, n * sizeof(T));
    for (int64_t i = rows - 1; i >= 1; --i) apply(data + i * n, data + (i - 1) * n, load, store);
    apply(data, last, load, store);
  }
};

}  // namespace

void mix_images(void* data, DType dtype, bool chw, int64_t batch, int height, int width,
                int channels, const MixDraw& d) {
  if (!d.applied || batch < 2) return;
  const Mixer m{d, chw, height, width, channels};
  switch (dtype) {
    case DType::kUInt8:
      m.batch(
          static_cast<uint8_t*>(data), batch, [](uint8_t v) { return static_cast<float>(v); },
          detail::round_u8);
      return;
    case DType::kFloat32:
      m.batch(
          static_cast<float*>(data), batch, [](float v) { return v; }, [](float v) { return v; });
      return;
    case DType::kFloat16:
      m.batch(static_cast<uint16_t*>(data), batch, detail::half_to_float, detail::float_to_half);
      return;
    case DType::kBFloat16:
      m.batch(static_cast<uint16_t*>(data), batch, detail::bfloat16_to_float,
              detail::float_to_bfloat16);
      return;
    default:
      STOKER_THROW(UsageError, "MixUp/CutMix: unsupported image dtype ", dtype_name(dtype));
  }
}

void mix_labels(const int64_t* labels, int64_t batch, int num_classes, const MixDraw& d,
                float* out) {
  const double s = d.label_smoothing;
  const double off = s / num_classes, on = 1.0 - s + off;
  const double lam = d.applied ? d.lam : 1.0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t y = labels[i];
    STOKER_CHECK(y >= 0 && y < num_classes, DataError, "label ", y, " of row ", i,
                 " is outside [0, num_classes=", num_classes, ")");
  }
  for (int64_t i = 0; i < batch; ++i) {
    float* row = out + i * num_classes;
    const int64_t y = labels[i];
    const int64_t prev = labels[i == 0 ? batch - 1 : i - 1];
    for (int k = 0; k < num_classes; ++k) {
      const double a = k == y ? on : off, b = k == prev ? on : off;
      row[k] = static_cast<float>(lam * a + (1.0 - lam) * b);
    }
  }
}

}  // namespace stoker
