#include "common/dtype.h"

#include "common/error.h"

namespace stoker {

namespace {
struct Entry {
  DType type;
  const char* name;
  size_t size;
  DLTypeCode dl;
};
constexpr Entry kTable[] = {
    {DType::kBool, "bool", 1, {6, 8}},          {DType::kUInt8, "uint8", 1, {1, 8}},
    {DType::kInt8, "int8", 1, {0, 8}},          {DType::kUInt16, "uint16", 2, {1, 16}},
    {DType::kInt16, "int16", 2, {0, 16}},       {DType::kUInt32, "uint32", 4, {1, 32}},
    {DType::kInt32, "int32", 4, {0, 32}},       {DType::kUInt64, "uint64", 8, {1, 64}},
    {DType::kInt64, "int64", 8, {0, 64}},       {DType::kFloat16, "float16", 2, {2, 16}},
    {DType::kBFloat16, "bfloat16", 2, {4, 16}}, {DType::kFloat32, "float32", 4, {2, 32}},
    {DType::kFloat64, "float64", 8, {2, 64}},
};
const Entry& entry(DType t) {
  for (const auto& e : kTable)
    if (e.type == t) return e;
  STOKER_THROW(UsageError, "unknown dtype code ", static_cast<int>(t));
}
}  // namespace

size_t dtype_size(DType t) { return entry(t).size; }
const char* dtype_name(DType t) { return entry(t).name; }
DLTypeCode dtype_dlpack(DType t) { return entry(t).dl; }

DType dtype_from_name(const std::string& name) {
  for (const auto& e : kTable)
    if (name == e.name) return e.type;
  STOKER_THROW(UsageError, "unsupported dtype '", name, "'");
}

}  // namespace stoker
