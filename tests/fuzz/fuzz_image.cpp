// libFuzzer target: arbitrary bytes as an encoded image, through the decoders
// and the ops. Must decode or throw DecodeError, never crash or read out of bounds.
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "geometry/image_pipeline.h"

using namespace stoker;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ImagePipeline plain([] {
    ImageFieldSpec s;
    s.max_pixels = 4'000'000;  // keep single inputs fast
    return s;
  }());
  static const ImagePipeline crop(
      [] {
        ImageFieldSpec s;
        s.max_pixels = 4'000'000;
        s.layout = ImageLayout::kCHW;
        return s;
      }(),
      {ops::RandomResizedCrop{17, 13, 0.08, 1.0, 0.75, 4.0 / 3.0}, ops::RandomHorizontalFlip{0.5},
       ops::Normalize{{0.5, 0.5, 0.5}, {0.2, 0.2, 0.2}, DType::kFloat16}});
  std::vector<uint8_t> out;
  for (const ImagePipeline* p : {&plain, &crop}) {
    try {
      auto [h, w] = p->output_size(data, size);
      out.resize(static_cast<size_t>(h) * w * 3 * 4);
      p->run(data, size, size, out.data(), h, w);
    } catch (const DecodeError&) {
    }
  }
  return 0;
}
