// A read-only mmap of a whole file (flat token files, Megatron .bin/.idx),
// unmapped on destruction, guarded like a shard's (NOTE [ Shards changed under
// a reader ] in format/mapped_file.h): a file cut short under it reads as
// zeros instead of killing the process with SIGBUS, and faulted() says so. An
// empty file maps to (nullptr, 0): mmap refuses zero lengths, and callers
// decide whether an empty file is an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "format/mapped_file.h"

namespace stoker::detail {

class MappedFile {
 public:
  MappedFile() = default;
  /// Maps `path`; DataError naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& o) noexcept = default;
  MappedFile& operator=(MappedFile&& o) noexcept = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return map_ ? map_->data() : nullptr; }
  size_t size() const { return map_ ? map_->size() : 0; }
  /// A page of the file vanished under a read (it was cut short): those read as zeros.
  bool faulted() const { return map_ && map_->faulted(); }

 private:
  std::string path_;
  std::unique_ptr<stoker::MappedFile> map_;  // null for an empty file
};

}  // namespace stoker::detail
