// The handful of CUDA driver API types and constants this layer uses, declared
// here so that nothing needs the CUDA toolkit's headers at build time. The
// values are part of the driver's stable C ABI (documented in the CUDA Driver
// API reference); only what we call or check is listed.
#pragma once

#include <cstdint>

namespace stoker::cu {

using Result = int;                    // CUresult
using Device = int;                    // CUdevice
using DevicePtr = unsigned long long;  // CUdeviceptr (64-bit on every supported platform)
struct ContextSt;                      // opaque driver objects, only ever held by pointer
struct StreamSt;
struct EventSt;
using Context = ContextSt*;
using Stream = StreamSt*;
using Event = EventSt*;

// Result codes we branch on; every other code is reported by name.
constexpr Result kSuccess = 0;
constexpr Result kErrorDeinitialized = 4;
constexpr Result kErrorNoDevice = 100;
constexpr Result kErrorNotReady = 600;

// Flags.
constexpr unsigned kStreamNonBlocking = 0x1;  // no implicit sync with the legacy stream
constexpr unsigned kEventDefault = 0x0;
constexpr unsigned kEventDisableTiming = 0x2;
constexpr unsigned kMemHostAllocPortable = 0x1;  // pinned for every context, not just ours

}  // namespace stoker::cu
