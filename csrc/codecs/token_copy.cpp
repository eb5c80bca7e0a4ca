#include "codecs/token_copy.h"

#include <cstring>
#include <limits>
#include <type_traits>

#include "common/error.h"

namespace stoker {

namespace {

// The hot loop: a plain widening copy that compilers vectorise, with the
// min/max reduction only when the source type can leave [0, limit). Loads go
// through memcpy: stored tokens may sit at any byte offset (records are back
// to back without padding), and a memcpy load compiles to a plain move.
template <typename S>
inline S load(const uint8_t* p, int64_t i) {
  S v;
  std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(S)), sizeof(S));
  return v;
}

template <typename S, typename D>
int64_t copy_typed(const uint8_t* __restrict src, int64_t n, D* __restrict dst, int64_t limit) {
  constexpr bool can_be_negative = std::is_signed_v<S>;
  const bool may_exceed =
      static_cast<uint64_t>(std::numeric_limits<S>::max()) >= static_cast<uint64_t>(limit);
  if (!can_be_negative && !may_exceed) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<D>(load<S>(src, i));
    return -1;
  }
  using Wide = std::conditional_t<std::is_signed_v<S>, int64_t, uint64_t>;
  auto bad = [limit](Wide v) {
    if constexpr (std::is_signed_v<S>)
      return v < 0 || v >= limit;
    else
      return v >= static_cast<uint64_t>(limit);
  };
  Wide lo = 0, hi = 0;
  if (n > 0) lo = hi = static_cast<Wide>(load<S>(src, 0));
  for (int64_t i = 0; i < n; ++i) {
    const S s = load<S>(src, i);
    const Wide v = static_cast<Wide>(s);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    dst[i] = static_cast<D>(s);
  }
  if (n == 0 || (!bad(lo) && !bad(hi))) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (bad(static_cast<Wide>(load<S>(src, i)))) return i;
  return -1;
}

template <typename D>
int64_t copy_to(const void* src, DType src_type, int64_t n, D* dst, int64_t limit) {
  switch (src_type) {
    case DType::kUInt8:
      return copy_typed<uint8_t>(static_cast<const uint8_t*>(src), n, dst, limit);
    case DType::kInt8:
      return copy_typed<int8_t>(static_cast<const uint8_t*>(src), n, dst, limit);
    case DType::kUInt16:
      return copy_typed<uint16_t>(static_cast<const uint8_t*>(src), n, dst, limit);
    case DType::kInt16:
      return copy_typed<int16_t>(static_cast<const uint8_t*>(src), n, dst, limit);
    case DType::kUInt32:
      return copy_typed<uint32_t>(static_cast<const uint8_t*>(src), n, dst, limit);
    case DType::kInt32:
      return copy_typed<int32_t>(static_cast<const uint8_t*>(src), n, dst, limit);
    case DType::kUInt64:
      return copy_typed<uint64_t>(static_cast<const uint8_t*>(src), n, dst, limit);
    case DType::kInt64:
      return copy_typed<int64_t>(static_cast<const uint8_t*>(src), n, dst, limit);
    default:
      STOKER_THROW(UsageError, "token dtype must be an integer type, got ", dtype_name(src_type));
  }
}

}  // namespace

int64_t token_limit(DType dst, int64_t vocab_size) {
  STOKER_CHECK(dst == DType::kInt32 || dst == DType::kInt64, UsageError,
               "token_dtype must be int64 or int32, got ", dtype_name(dst));
  int64_t limit = dst == DType::kInt32 ? (int64_t{1} << 31) : std::numeric_limits<int64_t>::max();
  if (vocab_size > 0 && vocab_size < limit) limit = vocab_size;
  return limit;
}

int64_t copy_tokens(const void* src, DType src_type, int64_t n, void* dst, DType dst_type,
                    int64_t limit) {
  if (dst_type == DType::kInt64)
    return copy_to(src, src_type, n, static_cast<int64_t*>(dst), limit);
  if (dst_type == DType::kInt32)
    return copy_to(src, src_type, n, static_cast<int32_t*>(dst), limit);
  STOKER_THROW(UsageError, "token_dtype must be int64 or int32, got ", dtype_name(dst_type));
}

int64_t token_at(const void* src, DType src_type, int64_t i) {
  const uint8_t* p =
      static_cast<const uint8_t*>(src) + static_cast<size_t>(i) * dtype_size(src_type);
  switch (src_type) {
#define STOKER_TOKEN_AT(code, T)    \
  case code: {                      \
    T v;                            \
    std::memcpy(&v, p, sizeof v);   \
    return static_cast<int64_t>(v); \
  }
    STOKER_TOKEN_AT(DType::kUInt8, uint8_t)
    STOKER_TOKEN_AT(DType::kInt8, int8_t)
    STOKER_TOKEN_AT(DType::kUInt16, uint16_t)
    STOKER_TOKEN_AT(DType::kInt16, int16_t)
    STOKER_TOKEN_AT(DType::kUInt32, uint32_t)
    STOKER_TOKEN_AT(DType::kInt32, int32_t)
    STOKER_TOKEN_AT(DType::kUInt64, uint64_t)
    STOKER_TOKEN_AT(DType::kInt64, int64_t)
#undef STOKER_TOKEN_AT
    default:
      STOKER_THROW(UsageError, "token dtype must be an integer type");
  }
}

}  // namespace stoker
