#include "cuda/driver_probe.h"

#include "cuda/detail/driver.h"

namespace stoker {

CudaStatus cuda_status() {
  CudaStatus s;
  try {
    cu::ensure_initialized();  // loads libcuda.so.1; throws a CudaError saying why not
    const cu::Driver& d = cu::driver();
    CHECK_CU(d.device_get_count(&s.device_count));
    if (s.device_count == 0) {
      s.reason = "no CUDA device: the driver sees none";
      return s;
    }
    int v = 0;
    CHECK_CU(d.driver_get_version(&v));
    s.available = true;
    s.reason = "CUDA driver " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  } catch (const std::exception& e) {
    s.available = false;
    s.device_count = 0;
    s.reason = e.what();
  }
  return s;
}

}  // namespace stoker
