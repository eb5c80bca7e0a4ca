// Writing samples of a planned record batch into its slot, and the skip
// policy: under on_error="skip" a sample that cannot be read or decoded is
// replaced by the next valid sample in dataset order that fits the batch's
// plan, so the replacement is the same whatever thread finds it.
#pragma once

#include <cstdint>
#include <string>

#include "format/dataset.h"

namespace stoker {

/// Rethrows the exception in flight with "<file>: record <r> (sample <i>, field
/// '<f>')" in front, as the type it was (DecodeError, DataError); other
/// exceptions become DataError. Errors that already name the file pass through.
[[noreturn]] void rethrow_with_context(const Dataset& ds, int64_t index, const std::string& field);

}  // namespace stoker
