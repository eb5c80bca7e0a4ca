// Errors cross every boundary as exceptions. STOKER_THROW adds the source
// location so a report from a worker thread says where it came from.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace stoker {

/// Base of every error the core raises; bound to a Python exception type.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad or corrupt data on disk (shards, index, records). Maps to stoker.DataError.
class DataError : public Error {
 public:
  using Error::Error;
};

/// Undecodable or refused image/array payload. Maps to stoker.DecodeError.
class DecodeError : public DataError {
 public:
  using DataError::DataError;
};

/// Wrong argument or wrong use of the API. Maps to ValueError.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// A shard of a remote dataset could not be fetched (the message names its URL
/// and the reason). Maps to stoker.remote.RemoteError.
class FetchError : public Error {
 public:
  using Error::Error;
};

/// Failure of the CUDA driver or of the device layer. Maps to stoker.CudaError.
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace stoker

// Throws `Type` with the message and the source location, in every build type:
//   "checksum mismatch in record 7 of shard ... [csrc/format/shard_reader.cpp:88]"
// CMake passes -fmacro-prefix-map, so __FILE__ is relative to the source tree.
#define STOKER_THROW(Type, ...) \
  throw Type(::stoker::detail::concat(__VA_ARGS__, " [", __FILE__, ":", __LINE__, "]"))

#define STOKER_CHECK(cond, Type, ...)             \
  do {                                            \
    if (!(cond)) STOKER_THROW(Type, __VA_ARGS__); \
  } while (0)
