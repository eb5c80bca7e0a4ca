// Element types shared by the format, the decoders and the DLPack export.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stoker {

enum class DType : uint8_t {
  kBool,
  kUInt8,
  kInt8,
  kUInt16,
  kInt16,
  kUInt32,
  kInt32,
  kUInt64,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

/// Size of one element in bytes.
size_t dtype_size(DType t);
/// Whether the type holds integers (signed or not; not bool).
inline bool dtype_is_integer(DType t) { return t >= DType::kUInt8 && t <= DType::kInt64; }
/// NumPy-style name ("uint8", "float32", ...).
const char* dtype_name(DType t);
/// Parses a NumPy-style name; throws UsageError on an unknown one.
DType dtype_from_name(const std::string& name);

/// DLPack type code (kDLInt=0, kDLUInt=1, kDLFloat=2, kDLBfloat=4, kDLBool=6) and bit width.
struct DLTypeCode {
  uint8_t code;
  uint8_t bits;
};
DLTypeCode dtype_dlpack(DType t);

}  // namespace stoker
