#include "cuda/detail/driver.h"

#include <dlfcn.h>

#include <mutex>

namespace stoker::cu {

namespace {

struct Loaded {
  Driver fns{};
  std::string error;  // why loading failed; empty on success
};

template <typename Fn>
bool bind(void* lib, Fn& fn, const char* name, std::string& error) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!fn && error.empty())
    error = std::string("CUDA driver library libcuda.so.1 lacks ") + name + " (driver too old?)";
  return fn != nullptr;
}

Loaded load() {
  Loaded l;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    l.error = std::string("CUDA driver library libcuda.so.1 not found: ") +
              (why ? why : "dlopen failed") + " (is an NVIDIA driver installed?)";
    return l;
  }
  Driver& d = l.fns;
  std::string& e = l.error;
  bind(lib, d.init, "cuInit", e);
  bind(lib, d.driver_get_version, "cuDriverGetVersion", e);
  bind(lib, d.get_error_name, "cuGetErrorName", e);
  bind(lib, d.get_error_string, "cuGetErrorString", e);
  bind(lib, d.device_get_count, "cuDeviceGetCount", e);
  bind(lib, d.device_get, "cuDeviceGet", e);
  bind(lib, d.primary_ctx_retain, "cuDevicePrimaryCtxRetain", e);
  bind(lib, d.primary_ctx_release, "cuDevicePrimaryCtxRelease_v2", e);
  bind(lib, d.ctx_get_current, "cuCtxGetCurrent", e);
  bind(lib, d.ctx_push_current, "cuCtxPushCurrent_v2", e);
  bind(lib, d.ctx_pop_current, "cuCtxPopCurrent_v2", e);
  bind(lib, d.mem_alloc, "cuMemAlloc_v2", e);
  bind(lib, d.mem_free, "cuMemFree_v2", e);
  bind(lib, d.mem_host_alloc, "cuMemHostAlloc", e);
  bind(lib, d.mem_free_host, "cuMemFreeHost", e);
  bind(lib, d.stream_create, "cuStreamCreate", e);
  bind(lib, d.stream_destroy, "cuStreamDestroy_v2", e);
  bind(lib, d.stream_synchronize, "cuStreamSynchronize", e);
  bind(lib, d.stream_wait_event, "cuStreamWaitEvent", e);
  bind(lib, d.memcpy_htod_async, "cuMemcpyHtoDAsync_v2", e);
  bind(lib, d.event_create, "cuEventCreate", e);
  bind(lib, d.event_destroy, "cuEventDestroy_v2", e);
  bind(lib, d.event_record, "cuEventRecord", e);
  bind(lib, d.event_query, "cuEventQuery", e);
  bind(lib, d.event_synchronize, "cuEventSynchronize", e);
  bind(lib, d.event_elapsed_time, "cuEventElapsedTime", e);
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();  // thread-safe static init
  return l;
}

}  // namespace

const Driver& driver() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw CudaError(l.error);
  return l.fns;
}

void ensure_initialized() {
  static std::once_flag once;
  static Result rc = kSuccess;
  const Driver& d = driver();
  std::call_once(once, [&] { rc = d.init(0); });
  if (rc != kSuccess) throw CudaError("no CUDA device: cuInit returned " + error_name(rc));
}

std::string error_name(Result r) {
  const Loaded& l = loaded();
  const char* name = nullptr;
  const char* text = nullptr;
  if (l.error.empty()) {
    if (l.fns.get_error_name(r, &name) != kSuccess) name = nullptr;
    if (l.fns.get_error_string(r, &text) != kSuccess) text = nullptr;
  }
  std::string s = name ? name : "CUDA error " + std::to_string(r);
  if (text) s += std::string(" (") + text + ")";
  return s;
}

void throw_cuda_error(Result r, const char* expr, const char* file, int line) {
  throw CudaError(error_name(r) + " from " + expr, ::stoker::detail::where(file, line));
}

}  // namespace stoker::cu
