#include "decode/image_pipeline.h"

#include <variant>

#include "common/error.h"
#include "decode/canvas.h"
#include "decode/codecs.h"
#include "decode/crop_params.h"
#include "decode/detail/rng.h"
#include "decode/jpeg_decoder.h"
#include "decode/png_decoder.h"

namespace stoker {

namespace {

// Ops applied to a canvas; draws come from `rng` in op order.
struct Apply {
  CanvasOps& ops;
  Canvas& c;
  detail::SplitMix64& rng;
  const ops::Normalize*& norm;

  void operator()(const ops::RandomResizedCrop& o) const {
    CanvasOps::crop(c, random_resized_crop_rect(c.view.w, c.view.h, o.scale_lo, o.scale_hi,
                                                o.log_ratio_lo, o.log_ratio_hi, rng));
    ops.resize(c, o.w, o.h);
  }
  void operator()(const ops::Resize& o) const {
    int h = o.h, w = o.w;
    if (o.shorter) shorter_side_size(c.view.h, c.view.w, o.size, &h, &w);
    ops.resize(c, w, h);
  }
  void operator()(const ops::CenterCrop& o) const {
    CanvasOps::crop(c, center_crop_rect(c.view.w, c.view.h, o.w, o.h));
  }
  void operator()(const ops::HorizontalFlip& o) const {
    // Always draw, so later draws do not depend on this one's outcome.
    if (rng.uniform(0, 1) < o.p) c.flip = !c.flip;
  }
  void operator()(const ops::Normalize& o) const { norm = &o; }
};

}  // namespace

ImageInfo probe_image(const uint8_t* data, size_t n) {
  if (is_jpeg(data, n)) return jpeg_probe(data, n);
  if (is_png(data, n)) return png_probe(data, n);
  not_an_image(data, n);
}

ImagePipeline::ImagePipeline(const ImageFieldSpec& spec)
    : ops_(parse_image_ops(spec.ops)),
      layout_(spec.layout),
      max_pixels_(spec.max_pixels),
      out_dtype_(output_dtype(ops_)),
      fixed_(fixed_output_size(ops_)) {
  require_image_codecs();  // a build without codecs refuses image fields up front
  STOKER_CHECK(max_pixels_ > 0, UsageError, "max_pixels must be positive");
}

std::pair<int, int> ImagePipeline::output_size(const uint8_t* data, size_t n) const {
  const ImageInfo info = probe_image(data, n);
  check_declared(info, max_pixels_);
  std::pair<int, int> hw{info.height, info.width};
  for (const ImageOp& op : ops_) hw = size_after(op, hw);
  return hw;
}

void ImagePipeline::run(const uint8_t* data, size_t n, uint64_t seed, void* out, int out_h,
                        int out_w, int64_t* decode_ns) const {
  Scratch& s = thread_scratch();
  CanvasOps ops(s, data, n);
  struct Report {  // on every exit, errors included
    const CanvasOps& ops;
    int64_t* to;
    ~Report() {
      if (to) *to += ops.decode_ns;
    }
  } report{ops, decode_ns};
  Canvas c;
  ops.open(max_pixels_, c);
  detail::SplitMix64 rng(seed);
  const ops::Normalize* norm = nullptr;
  for (const ImageOp& op : ops_) std::visit(Apply{ops, c, rng, norm}, op);
  if (c.view.w != out_w || c.view.h != out_h)
    STOKER_THROW(DecodeError, "image comes out ", c.view.h, "x", c.view.w,
                 " but the batch expects ", out_h, "x", out_w);
  const bool u8_hwc = out_dtype_ == DType::kUInt8 && layout_ == ImageLayout::kHWC;
  if (u8_hwc && (ops.try_resize_into(c, static_cast<uint8_t*>(out)) ||
                 ops.try_decode_into(c, static_cast<uint8_t*>(out))))
    return;
  ops.ensure_pixels(c);
  write_pixels(c, out, out_h, out_w, layout_, out_dtype_, norm, s);
}

}  // namespace stoker
