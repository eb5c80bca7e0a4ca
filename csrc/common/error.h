// Errors cross every boundary as exceptions. STOKER_THROW records the source location
// beside the message, not in it: the message is for the user (the file, the record, what
// to do), the location for a bug report (Python: the exception's `source_location`;
// STOKER_DEBUG=1 adds it to the message).
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace stoker {

/// Base of every error the core raises; bound to a Python exception type.
class Error : public std::runtime_error {
 public:
  /// @param message what the user reads: names their file, record and the fix
  /// @param where   where in stoker's sources it was raised ("csrc/x/y.cpp:88"); an error
  ///                raised while handling another adds that one's: "a.cpp:1 <- b.cpp:2"
  explicit Error(const std::string& message, std::string where = {})
      : std::runtime_error(message), where_(std::move(where)) {}

  /// The source location(s) for a bug report; empty when thrown without STOKER_THROW.
  [[nodiscard]] const std::string& where() const noexcept { return where_; }

 private:
  std::string where_;
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

/// `file` from the source tree's root ("csrc/x/y.cpp"). CMake's -fmacro-prefix-map makes
/// __FILE__ relative to the tree, but a compiler cache that rewrites absolute paths (ccache's
/// base_dir, as CI's wheel builds use) hands the compiler "../../csrc/x/y.cpp" instead.
inline std::string_view in_tree(std::string_view file) {
  for (std::size_t at = file.find("csrc/"); at != std::string_view::npos;
       at = file.find("csrc/", at + 1)) {
    if (at == 0 || file[at - 1] == '/') return file.substr(at);
  }
  return file;
}

/// "file:line", followed by the location of the stoker::Error being handled, if any (an
/// error re-raised with more context keeps where it started).
inline std::string where(const char* file, int line) {
  std::string w = concat(in_tree(file), ":", line);
  if (std::exception_ptr inner = std::current_exception()) {
    try {
      std::rethrow_exception(inner);
    } catch (const Error& e) {
      if (!e.where().empty()) w += " <- " + e.where();
    } catch (...) {
    }
  }
  return w;
}
}  // namespace detail

}  // namespace stoker

// Throws `Type` with the message and, beside it, the source location, in every build type:
//   what():  "checksum mismatch in record 7 of shard ..."
//   where(): "csrc/format/shard_reader.cpp:88"
// CMake passes -fmacro-prefix-map, so __FILE__ is relative to the source tree.
#define STOKER_THROW(Type, ...) \
  throw Type(::stoker::detail::concat(__VA_ARGS__), ::stoker::detail::where(__FILE__, __LINE__))

#define STOKER_CHECK(cond, Type, ...)             \
  do {                                            \
    if (!(cond)) STOKER_THROW(Type, __VA_ARGS__); \
  } while (0)
