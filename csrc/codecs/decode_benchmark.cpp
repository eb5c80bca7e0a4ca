#include "codecs/decode_benchmark.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include "codecs/codecs.h"
#include "codecs/jpeg_decoder.h"
#include "codecs/png_decoder.h"
#include "common/error.h"

namespace stoker {

double decode_throughput(const std::vector<std::pair<const uint8_t*, size_t>>& images, int threads,
                         int rounds) {
  STOKER_CHECK(threads >= 1 && rounds >= 1, UsageError, "threads and rounds must be >= 1");
  require_image_codecs();
  const size_t total = images.size() * static_cast<size_t>(rounds);
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    JpegDecoder jpeg;
    std::vector<uint8_t> buf;
    try {
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < total;) {
        const auto& [data, n] = images[i % images.size()];
        if (is_jpeg(data, n)) {
          const ImageInfo info = jpeg.open(data, n, INT64_MAX);
          buf.resize(static_cast<size_t>(info.width) * info.height * 3);
          jpeg.decode_full(buf.data(), static_cast<size_t>(info.width) * 3);
        } else {
          png_decode(data, n, INT64_MAX, buf);
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(total, std::memory_order_relaxed);
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (error) std::rethrow_exception(error);
  return static_cast<double>(total) / s;
}

}  // namespace stoker
