#include "geometry/image_pipeline.h"

#include <variant>

#include "codecs/codecs.h"
#include "codecs/jpeg_decoder.h"
#include "codecs/png_decoder.h"
#include "codecs/raw_image.h"
#include "common/error.h"
#include "geometry/canvas.h"
#include "geometry/detail/rng.h"
#include "geometry/op_context.h"

namespace stoker {

ImageInfo probe_image(const uint8_t* data, size_t n) {
  if (is_jpeg(data, n)) return jpeg_probe(data, n);
  if (is_png(data, n)) return png_probe(data, n);
  if (is_raw(data, n)) return raw_probe(data, n);
  not_an_image(data, n);
}

ImagePipeline::ImagePipeline(const ImageFieldSpec& spec, std::vector<ImageOp> ops, bool raw_only)
    : ops_(std::move(ops)),
      layout_(spec.layout),
      max_pixels_(spec.max_pixels),
      out_dtype_(output_dtype(ops_)),
      fixed_(fixed_output_size(ops_)) {
  check_image_ops(ops_);
  if (!raw_only) require_image_codecs();  // a build without codecs refuses image fields up front
  STOKER_CHECK(max_pixels_ > 0, UsageError, "max_pixels must be positive");
}

std::pair<int, int> ImagePipeline::output_size(const uint8_t* data, size_t n) const {
  const ImageInfo info = probe_image(data, n);
  check_declared(info, max_pixels_);
  return output_size_for({info.height, info.width});
}

std::pair<int, int> ImagePipeline::output_size_for(std::pair<int, int> hw) const {
  for (const ImageOp& op : ops_) hw = size_after(op, hw);
  return hw;
}

void ImagePipeline::run(const uint8_t* data, size_t n, uint64_t seed, void* out, int out_h,
                        int out_w, int64_t* decode_ns, Geometry* geometry, CacheSlot cache) const {
  Scratch& s = thread_scratch();
  CanvasOps ops(s, data, n, cache);
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
  run_from(0, ops, c, rng, out, out_h, out_w, geometry);
}

void ImagePipeline::run_from(size_t first, CanvasOps& ops, Canvas& c, detail::SplitMix64& rng,
                             void* out, int out_h, int out_w, Geometry* geometry) const {
  OpContext ctx(ops, c, rng);
  for (size_t i = first; i < ops_.size(); ++i)
    std::visit([&](const auto& o) { o.apply(ctx); }, ops_[i]);
  ctx.flush();  // colour steps still pending
  if (geometry) *geometry = ctx.geometry();
  if (c.view.w != out_w || c.view.h != out_h)
    STOKER_THROW(DecodeError, "image comes out ", c.view.h, "x", c.view.w,
                 " but the batch expects ", out_h, "x", out_w);
  const bool u8_hwc = out_dtype_ == DType::kUInt8 && layout_ == ImageLayout::kHWC;
  if (!(u8_hwc && (ops.try_resize_into(c, static_cast<uint8_t*>(out)) ||
                   ops.try_decode_into(c, static_cast<uint8_t*>(out))))) {
    ops.ensure_pixels(c);
    write_pixels(c, out, out_h, out_w, layout_, out_dtype_, ctx.normalization(), thread_scratch());
  }
  for (int i = 0; i < ctx.num_output_ops(); ++i)
    ctx.output_ops()[i]->erase(out, out_dtype_, layout_ == ImageLayout::kCHW, out_h, out_w, rng);
}

}  // namespace stoker
