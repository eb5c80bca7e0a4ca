// A read-only mmap of a whole file, unmapped on destruction. An empty file
// maps to (nullptr, 0): mmap refuses zero lengths, and callers decide whether
// an empty file is an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stoker::detail {

class MappedFile {
 public:
  MappedFile() = default;
  /// Maps `path`; DataError naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release() noexcept;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace stoker::detail
