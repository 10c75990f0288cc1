/// @file error.h
/// @brief hack::Error, the one exception type library code throws, plus HACK_CHECK and Status.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace hack {

/// Error with a message that says what failed and where (file, tensor, field, request).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws hack::Error with a fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

/// Result of an operation at an API boundary that must not throw (daemons, C callbacks).
class Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message)); }
  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
};

}  // namespace hack

/// Throws hack::Error("<message>") when cond is false. The message is fmt-formatted.
#define HACK_CHECK(cond, ...)        \
  do {                               \
    if (!(cond)) ::hack::fail(__VA_ARGS__); \
  } while (0)
