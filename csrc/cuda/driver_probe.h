// Is a CUDA driver and device usable here? Asked at run time through
// dlopen("libcuda.so.1"), so the build needs no CUDA toolkit and the
// extension imports where there is no GPU.
#pragma once

#include <string>

namespace stoker {

struct CudaStatus {
  bool available = false;
  int device_count = 0;
  std::string reason;  ///< why not available, or the driver version
};

/// Never throws.
CudaStatus cuda_status();

}  // namespace stoker
