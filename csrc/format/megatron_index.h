// Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py):
// PREFIX.bin holds the tokens of every sequence back to back, PREFIX.idx
// describes them. .idx layout, little-endian:
//
//   9 bytes  "MMIDIDX\0\0"        u64 version (1)      u8 dtype code
//   u64 S (sequences)             u64 D (document index entries)
//   i32[S] sequence lengths (tokens)   i64[S] byte offsets into .bin
//   i64[D] document index: sequence numbers where documents start, 0 .. S
//   [i8[S] sequence modes, multimodal datasets only]
//
// A sequence is what GPTDataset samples from (preprocess_data.py writes one
// per document), so each sequence is one document here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "format/token_source.h"

namespace stoker {

struct MegatronIndex {
  DType dtype = DType::kUInt16;
  std::vector<int64_t> sequence_lengths;  ///< tokens per sequence
  int64_t num_document_entries = 0;
  int64_t total_tokens = 0;
};

/// Parses and checks an .idx image: header, sizes, offsets that are exactly
/// back to back, a monotone document index ending at S. DataError names `path`.
MegatronIndex parse_megatron_index(const uint8_t* data, size_t size, const std::string& path);

/// Megatron dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8
/// uint16. Throws DataError for floats and unknown codes.
DType megatron_dtype(int code, const std::string& path);

/// Opens PREFIX.idx + PREFIX.bin for each prefix (one stream, in order); the
/// .bin must hold exactly the tokens the .idx describes, and every prefix must
/// have the same dtype.
std::shared_ptr<TokenSource> open_megatron(const std::vector<std::string>& prefixes);

}  // namespace stoker
