// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1").
//
// Why not link against libcuda or include cuda.h: the extension must build
// where no CUDA toolkit is installed and import where no driver is, so the
// entry points are looked up by name on first use. Where the driver exports a
// versioned symbol (`_v2`), that one is used: the unversioned names are the
// legacy 32-bit ABIs kept for old binaries.
#pragma once

#include <cstddef>
#include <string>

#include "common/error.h"
#include "cuda/detail/driver_types.h"

namespace stoker::cu {

/// Function pointers into libcuda, by their documented C signatures.
struct Driver {
  Result (*init)(unsigned flags);
  Result (*driver_get_version)(int* version);
  Result (*get_error_name)(Result, const char** name);
  Result (*get_error_string)(Result, const char** text);
  Result (*device_get_count)(int* count);
  Result (*device_get)(Device* dev, int ordinal);
  Result (*primary_ctx_retain)(Context* ctx, Device dev);
  Result (*primary_ctx_release)(Device dev);
  Result (*ctx_get_current)(Context* ctx);
  Result (*ctx_push_current)(Context ctx);
  Result (*ctx_pop_current)(Context* ctx);
  Result (*mem_alloc)(DevicePtr* p, size_t bytes);
  Result (*mem_free)(DevicePtr p);
  Result (*mem_host_alloc)(void** p, size_t bytes, unsigned flags);
  Result (*mem_free_host)(void* p);
  Result (*stream_create)(Stream* s, unsigned flags);
  Result (*stream_destroy)(Stream s);
  Result (*stream_synchronize)(Stream s);
  Result (*stream_wait_event)(Stream s, Event e, unsigned flags);
  Result (*memcpy_htod_async)(DevicePtr dst, const void* src, size_t bytes, Stream s);
  Result (*event_create)(Event* e, unsigned flags);
  Result (*event_destroy)(Event e);
  Result (*event_record)(Event e, Stream s);
  Result (*event_query)(Event e);
  Result (*event_synchronize)(Event e);
  Result (*event_elapsed_time)(float* ms, Event start, Event end);
};

/// The driver, loaded once per process (never unloaded: unloading a driver is
/// never worth the risk). Throws CudaError "CUDA driver library libcuda.so.1
/// not found: ..." when it cannot be loaded or lacks an entry point.
const Driver& driver();

/// cuInit(0), once per process. Throws CudaError "no CUDA device: cuInit
/// returned ..." when it fails.
void ensure_initialized();

/// "CUDA_ERROR_X (text)" for a result code; never throws.
std::string error_name(Result r);

[[noreturn]] void throw_cuda_error(Result r, const char* expr, const char* file, int line);

}  // namespace stoker::cu

/// Evaluates a driver call and throws stoker::CudaError naming the error and
/// the expression unless it returned CUDA_SUCCESS.
#define CHECK_CU(expr)                                                         \
  do {                                                                         \
    const ::stoker::cu::Result check_cu_rc_ = (expr);                          \
    if (check_cu_rc_ != ::stoker::cu::kSuccess)                                \
      ::stoker::cu::throw_cuda_error(check_cu_rc_, #expr, __FILE__, __LINE__); \
  } while (0)
