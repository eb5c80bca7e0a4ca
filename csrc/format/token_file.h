// Flat token files, as nanoGPT's prepare.py writes them (train.bin: the
// tokens as raw little-endian uint16, nothing else). Read in place through
// mmap; several files are one stream, in the order given.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/token_source.h"

namespace stoker {

/// Opens flat token files of element type `dtype` (an integer type).
/// @param eos without it each file is one document; with it a document ends
///            after every `eos` token (and at the end of each file). Finding
///            them reads every token once, at open.
/// Throws DataError naming the file for an empty file or a size that is not a
/// whole number of tokens, UsageError for a bad dtype or an eos outside it.
std::shared_ptr<TokenSource> open_token_files(const std::vector<std::string>& paths, DType dtype,
                                              std::optional<int64_t> eos = std::nullopt);

}  // namespace stoker
