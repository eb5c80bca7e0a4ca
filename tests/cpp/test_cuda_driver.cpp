// The CUDA driver loaded at run time. Without a driver or device (every CI
// machine), the errors must be clear CudaErrors; with one, a real round trip.
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "cuda/device_api.h"
#include "cuda/driver_probe.h"
#include "cuda/pinned_allocator.h"
#include "cuda/transfer_engine.h"

using namespace stoker;

namespace {

void without_gpu(const CudaStatus& st) {
  CHECK(st.device_count == 0);
  CHECK(!st.reason.empty());
  bool thrown = false;
  try {
    cuda_driver_api(0);
  } catch (const CudaError& e) {
    const std::string msg = e.what();
    thrown = msg.find("libcuda.so.1 not found") != std::string::npos ||
             msg.find("no CUDA device") != std::string::npos;
    if (!thrown) std::fprintf(stderr, "unclear message: %s\n", e.what());
  }
  CHECK(thrown);
  std::printf("no usable CUDA here (%s): checked the error path only\n", st.reason.c_str());
}

void with_gpu(const CudaStatus& st) {
  std::printf("CUDA available: %s, %d device(s)\n", st.reason.c_str(), st.device_count);
  auto api = cuda_driver_api(0);
  CHECK(api == cuda_driver_api(0));  // shared per device
  CHECK_THROWS(CudaError, cuda_driver_api(st.device_count));
  auto alloc = pinned_host_allocator(api);
  const size_t n = 8 << 20;
  int64_t k = 0;
  auto source = [&]() -> std::optional<HostBatch> {
    if (k == 10) return std::nullopt;
    HostBatch hb;
    hb.index = k++;
    auto* p = static_cast<uint8_t*>(alloc->allocate(n));
    std::memset(p, static_cast<int>(hb.index), n);
    hb.memory = std::shared_ptr<uint8_t>(p, [alloc, n](uint8_t* q) { alloc->deallocate(q, n); });
    hb.bytes = n;
    hb.pinned = true;
    hb.tensors.push_back(TensorDesc{"x", DType::kUInt8, {static_cast<int64_t>(n)}, 0, n});
    return hb;
  };
  const StreamHandle consumer = api->create_stream();
  {
    TransferEngine engine(api, source, 3);
    std::vector<DeviceBatch> kept;
    for (int64_t i = 0; i < 10; ++i) {
      auto b = engine.next(consumer);
      CHECK(b && b->index == i && b->device == 0);
      if (i % 2) kept.push_back(std::move(*b));
    }
    CHECK(!engine.next(consumer));
    api->synchronize_stream(consumer);
    const TransferStats s = engine.stats();
    std::printf("copies %lld, %.2f GB/s\n", static_cast<long long>(s.copies),
                s.copy_seconds > 0 ? static_cast<double>(s.bytes) / s.copy_seconds * 1e-9 : 0.0);
  }
  api->destroy_stream(consumer);
}

}  // namespace

TEST_MAIN({
  const CudaStatus st = cuda_status();
  if (st.available)
    with_gpu(st);
  else
    without_gpu(st);
})
