#include "cuda/driver_probe.h"

#include <dlfcn.h>

namespace stoker {

namespace {
// The three driver entry points needed, by their documented C signatures.
using CuInit = int (*)(unsigned int);
using CuDeviceGetCount = int (*)(int*);
using CuDriverGetVersion = int (*)(int*);
using CuGetErrorName = int (*)(int, const char**);
}  // namespace

CudaStatus cuda_status() {
  CudaStatus s;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    s.reason = std::string("the CUDA driver library libcuda.so.1 cannot be loaded (") +
               (err ? err : "not found") + "); is an NVIDIA driver installed?";
    return s;
  }
  auto init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CuDeviceGetCount>(dlsym(lib, "cuDeviceGetCount"));
  auto version = reinterpret_cast<CuDriverGetVersion>(dlsym(lib, "cuDriverGetVersion"));
  auto name = reinterpret_cast<CuGetErrorName>(dlsym(lib, "cuGetErrorName"));
  if (!init || !count || !version) {
    s.reason = "libcuda.so.1 lacks cuInit/cuDeviceGetCount (driver too old?)";
    return s;  // the library stays loaded: unloading a driver is never worth it
  }
  int rc = init(0);
  if (rc != 0) {
    const char* n = nullptr;
    if (name) name(rc, &n);
    s.reason = std::string("cuInit failed: ") + (n ? n : "error " + std::to_string(rc));
    return s;
  }
  rc = count(&s.device_count);
  if (rc != 0 || s.device_count == 0) {
    s.reason = "no CUDA device";
    s.device_count = 0;
    return s;
  }
  int v = 0;
  version(&v);
  s.available = true;
  s.reason = "CUDA driver " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  return s;
}

}  // namespace stoker
