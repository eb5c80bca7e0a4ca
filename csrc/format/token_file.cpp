#include "format/token_file.h"

#include <cstring>
#include <limits>

#include "common/error.h"

namespace stoker {

namespace {

template <typename T>
void split_after(const uint8_t* data, int64_t n, T eos, std::vector<int64_t>& lengths) {
  int64_t begin = 0;
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    if (v == eos) {
      lengths.push_back(i + 1 - begin);
      begin = i + 1;
    }
  }
  if (begin < n) lengths.push_back(n - begin);
}

template <typename T>
bool fits(int64_t v) {
  if constexpr (std::is_unsigned_v<T> && sizeof(T) == 8)
    return v >= 0;
  else
    return v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
           v <= static_cast<int64_t>(std::numeric_limits<T>::max());
}

class FlatTokenSource : public MappedTokenSource {
 public:
  FlatTokenSource(const std::vector<std::string>& paths, DType dtype, std::optional<int64_t> eos) {
    STOKER_CHECK(!paths.empty(), UsageError, "no token files given");
    STOKER_CHECK(is_token_dtype(dtype), UsageError, "token dtype must be an integer type, got ",
                 dtype_name(dtype));
    dtype_ = dtype;
    const size_t item = dtype_size(dtype);
    for (const auto& path : paths) {
      detail::MappedFile f(path);
      if (f.size() == 0) STOKER_THROW(DataError, path, ": empty token file");
      if (f.size() % item != 0)
        STOKER_THROW(DataError, path, ": ", f.size(), " bytes is not a whole number of ",
                     dtype_name(dtype), " tokens (truncated file, or the wrong dtype?)");
      const int64_t n = static_cast<int64_t>(f.size() / item);
      std::vector<int64_t> lengths;
      if (eos) {
        check_eos(*eos);
        switch (dtype) {
          case DType::kUInt8:
            split_after<uint8_t>(f.data(), n, static_cast<uint8_t>(*eos), lengths);
            break;
          case DType::kInt8:
            split_after<int8_t>(f.data(), n, static_cast<int8_t>(*eos), lengths);
            break;
          case DType::kUInt16:
            split_after<uint16_t>(f.data(), n, static_cast<uint16_t>(*eos), lengths);
            break;
          case DType::kInt16:
            split_after<int16_t>(f.data(), n, static_cast<int16_t>(*eos), lengths);
            break;
          case DType::kUInt32:
            split_after<uint32_t>(f.data(), n, static_cast<uint32_t>(*eos), lengths);
            break;
          case DType::kInt32:
            split_after<int32_t>(f.data(), n, static_cast<int32_t>(*eos), lengths);
            break;
          case DType::kUInt64:
            split_after<uint64_t>(f.data(), n, static_cast<uint64_t>(*eos), lengths);
            break;
          default:
            split_after<int64_t>(f.data(), n, *eos, lengths);
            break;
        }
      } else {
        lengths.push_back(n);
      }
      add_file(std::move(f), lengths);
    }
    description_ = detail::concat(
        paths.size() == 1 ? paths[0]
                          : paths[0] + " (+" + std::to_string(paths.size() - 1) + " files)",
        " (", dtype_name(dtype), ")");
  }

 private:
  void check_eos(int64_t eos) const {
    bool ok = false;
    switch (dtype_) {
      case DType::kUInt8:
        ok = fits<uint8_t>(eos);
        break;
      case DType::kInt8:
        ok = fits<int8_t>(eos);
        break;
      case DType::kUInt16:
        ok = fits<uint16_t>(eos);
        break;
      case DType::kInt16:
        ok = fits<int16_t>(eos);
        break;
      case DType::kUInt32:
        ok = fits<uint32_t>(eos);
        break;
      case DType::kInt32:
        ok = fits<int32_t>(eos);
        break;
      case DType::kUInt64:
        ok = fits<uint64_t>(eos);
        break;
      default:
        ok = true;
        break;
    }
    STOKER_CHECK(ok, UsageError, "eos_id ", eos, " does not fit the token dtype ",
                 dtype_name(dtype_));
  }
};

}  // namespace

std::shared_ptr<TokenSource> open_token_files(const std::vector<std::string>& paths, DType dtype,
                                              std::optional<int64_t> eos) {
  return std::make_shared<FlatTokenSource>(paths, dtype, eos);
}

}  // namespace stoker
