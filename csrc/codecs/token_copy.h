// Token ids from a source's stored type (uint16, uint32, ...) to the batch's
// (int64 or int32), widening while copying, with the range check folded in:
// an id below 0 or at/above `limit` (the vocabulary size, or what the output
// type holds) is reported, never wrapped into another valid-looking id.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace stoker {

/// Exclusive upper bound of ids that `dst` can hold, lowered to `vocab_size` when that is > 0.
int64_t token_limit(DType dst, int64_t vocab_size);

/// Copies `n` tokens of type `src_type` from `src` to `dst` as `dst_type`
/// (kInt32 or kInt64). @return -1, or the index of the first token outside
/// [0, limit) (the output is then incomplete). The check costs nothing when
/// the source type cannot exceed the limit (uint16 into int32/int64 without a
/// smaller vocabulary).
int64_t copy_tokens(const void* src, DType src_type, int64_t n, void* dst, DType dst_type,
                    int64_t limit);

/// The value of token `i` of a stored run (for error messages and references).
int64_t token_at(const void* src, DType src_type, int64_t i);

}  // namespace stoker
