#include "format/megatron_index.h"

#include <cstring>

#include "common/error.h"

namespace stoker {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

class MegatronSource : public MappedTokenSource {
 public:
  explicit MegatronSource(const std::vector<std::string>& prefixes) {
    STOKER_CHECK(!prefixes.empty(), UsageError, "no Megatron dataset prefix given");
    for (size_t i = 0; i < prefixes.size(); ++i) {
      const std::string idx_path = prefixes[i] + ".idx";
      const std::string bin_path = prefixes[i] + ".bin";
      detail::MappedFile idx(idx_path);
      MegatronIndex index = parse_megatron_index(idx.data(), idx.size(), idx_path);
      if (i == 0)
        dtype_ = index.dtype;
      else if (index.dtype != dtype_)
        STOKER_THROW(DataError, idx_path, ": tokens are ", dtype_name(index.dtype), " but ",
                     prefixes[0], ".idx has ", dtype_name(dtype_), " (one stream needs one dtype)");
      detail::MappedFile bin(bin_path);
      const uint64_t want = static_cast<uint64_t>(index.total_tokens) * dtype_size(index.dtype);
      if (bin.size() != want)
        STOKER_THROW(DataError, bin_path, ": ", bin.size(), " bytes but ", idx_path, " describes ",
                     index.total_tokens, " ", dtype_name(index.dtype), " tokens (", want,
                     " bytes): the .idx does not match its .bin");
      add_file(std::move(bin), index.sequence_lengths);
    }
    description_ = prefixes.size() == 1
                       ? prefixes[0]
                       : prefixes[0] + " (+" + std::to_string(prefixes.size() - 1) + " more)";
    description_ += detail::concat(" (Megatron, ", dtype_name(dtype_), ")");
  }
};

}  // namespace

DType megatron_dtype(int code, const std::string& path) {
  switch (code) {
    case 1:
      return DType::kUInt8;
    case 2:
      return DType::kInt8;
    case 3:
      return DType::kInt16;
    case 4:
      return DType::kInt32;
    case 5:
      return DType::kInt64;
    case 8:
      return DType::kUInt16;
    case 6:
    case 7:
      STOKER_THROW(DataError, path, ": floating-point tokens (dtype code ", code,
                   ") are not token ids");
    default:
      STOKER_THROW(DataError, path, ": unknown dtype code ", code);
  }
}

MegatronIndex parse_megatron_index(const uint8_t* data, size_t size, const std::string& path) {
  if (size < kHeaderBytes)
    STOKER_THROW(DataError, path, ": ", size, " bytes is too short for a Megatron index header");
  if (std::memcmp(data, kMagic, sizeof kMagic) != 0)
    STOKER_THROW(DataError, path, ": not a Megatron index (bad magic; expected MMIDIDX)");
  const uint64_t version = load<uint64_t>(data + 9);
  if (version != 1)
    STOKER_THROW(DataError, path, ": Megatron index version ", version, " is not supported");
  MegatronIndex out;
  out.dtype = megatron_dtype(data[17], path);
  const uint64_t seqs = load<uint64_t>(data + 18);
  const uint64_t docs = load<uint64_t>(data + 26);
  const uint64_t body = size - kHeaderBytes;
  // 12 bytes per sequence (+1 with modes), 8 per document entry; bound before multiplying.
  if (seqs > body / 12 || docs > (body - 12 * seqs) / 8)
    STOKER_THROW(DataError, path, ": header counts ", seqs, " sequences and ", docs,
                 " document entries, more than the file holds (truncated index?)");
  const uint64_t exact = 12 * seqs + 8 * docs;
  if (body != exact && body != exact + seqs)
    STOKER_THROW(DataError, path, ": ", size, " bytes, but ", seqs, " sequences and ", docs,
                 " document entries need ", kHeaderBytes + exact, " (truncated or corrupt index)");
  const uint8_t* lengths = data + kHeaderBytes;
  const uint8_t* pointers = lengths + 4 * seqs;
  const uint8_t* doc_index = pointers + 8 * seqs;
  const int64_t item = static_cast<int64_t>(dtype_size(out.dtype));
  out.sequence_lengths.resize(seqs);
  int64_t offset = 0;
  for (uint64_t i = 0; i < seqs; ++i) {
    const int32_t n = load<int32_t>(lengths + 4 * i);
    const int64_t p = load<int64_t>(pointers + 8 * i);
    if (n < 0) STOKER_THROW(DataError, path, ": sequence ", i, " has negative length ", n);
    if (p != offset)
      STOKER_THROW(DataError, path, ": sequence ", i, " starts at byte ", p, ", expected ", offset,
                   " (sequences must be back to back)");
    out.sequence_lengths[i] = n;
    offset += static_cast<int64_t>(n) * item;
    out.total_tokens += n;
  }
  if (docs == 0) STOKER_THROW(DataError, path, ": empty document index");
  int64_t prev = 0;
  for (uint64_t j = 0; j < docs; ++j) {
    const int64_t v = load<int64_t>(doc_index + 8 * j);
    if ((j == 0 && v != 0) || v < prev || v > static_cast<int64_t>(seqs))
      STOKER_THROW(DataError, path, ": document index entry ", j, " = ", v,
                   " is out of order or out of range [0, ", seqs, "]");
    prev = v;
  }
  if (prev != static_cast<int64_t>(seqs))
    STOKER_THROW(DataError, path, ": document index ends at sequence ", prev, ", expected ", seqs);
  out.num_document_entries = static_cast<int64_t>(docs);
  return out;
}

std::shared_ptr<TokenSource> open_megatron(const std::vector<std::string>& prefixes) {
  return std::make_shared<MegatronSource>(prefixes);
}

}  // namespace stoker
