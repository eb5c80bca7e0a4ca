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
#include "pipeline/block_pool.h"
#include "test_threads.h"

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
  // Host slots from a pinned pool, as the loader's workers fill them.
  auto host = BlockPool::create(pinned_host_allocator(api), nullptr, 4);
  const size_t n = 8 << 20;
  int64_t k = 0;
  auto source = [&](HostBatch& out, TransferEngine::Clock::time_point) {
    if (k == 10) return TransferEngine::SourceStatus::kEnd;
    out = HostBatch{};
    out.index = k++;
    out.memory = BlockPool::Lease::bytes(host->lease(n));
    std::memset(out.memory.get(), static_cast<int>(out.index), n);
    out.bytes = n;
    out.pinned = true;
    out.tensors.push_back(TensorDesc{"x", DType::kUInt8, {static_cast<int64_t>(n)}, 0, n});
    return TransferEngine::SourceStatus::kBatch;
  };
  const StreamHandle consumer = api->create_stream();
  auto pool = device_buffer_pool(api, 5);
  {
    TransferEngine engine(api, source, 3, pool);
    std::vector<DeviceBatch> kept;
    for (int64_t i = 0; i < 10; ++i) {
      auto b = engine.next(consumer);
      CHECK(b && b->index == i && b->device == 0);
      if (i % 2) kept.push_back(std::move(*b));
    }
    CHECK(!engine.next(consumer));
    api->synchronize_stream(consumer);
    CHECK_EQ(kept.size(), 5u);  // kept batches hold their buffers past the engine
    CHECK(test::eventually([&] { return engine.stats().copies == 10; }));
    const TransferStats s = engine.stats();
    std::printf("copies %lld, %.2f GB/s\n", static_cast<long long>(s.copies),
                s.copy_seconds > 0 ? static_cast<double>(s.bytes) / s.copy_seconds * 1e-9 : 0.0);
  }
  CHECK(pool->blocks() >= 1);
  pool.reset();
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
