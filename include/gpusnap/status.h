// Status and Result<T>: gpusnap's one error type.
//
// A function that can fail returns Status (or Result<T> when it also yields a
// value). OK carries nothing. A failure carries a Code from a closed set, the
// errno that caused it (0 if none) and a message that quotes the failing value
// ("opening snapshot `abc`: No such file or directory"). Callers add context on
// the way up with Wrap(): "restoring pid 4711: " + inner message.
//
// No exceptions cross module boundaries; code that calls throwing libraries
// (nlohmann-json, protobuf) converts at the call site.
//
// Thread-safety: values; safe to copy and move between threads.
#pragma once

#include <cerrno>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace gpusnap {

enum class Code {
  kOk = 0,
  kInvalidArgument,   // the caller asked for something malformed
  kNotFound,          // a pid, workload, snapshot or file that does not exist
  kAlreadyExists,     // a name or id already taken
  kCorruption,        // a snapshot that fails verification
  kFailedPrecondition,// the system is not in a state that allows the action
  kIoError,           // the filesystem refused (full disk, permissions, ...)
  kExternal,          // CRIU or the CUDA driver reported a failure
  kTimeout,           // a deadline passed
  kNotSupported,      // a feature this machine or build lacks
  kPermissionDenied,  // a rule of the administrator refuses it (a namespace's snapshots, registries)
  kInternal,          // a bug in gpusnap
};

const char* CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  static Status Ok() { return Status(); }
  template <typename... Args>
  static Status Error(Code code, fmt::format_string<Args...> f, Args&&... args) {
    return Status(code, 0, fmt::format(f, std::forward<Args>(args)...));
  }
  // Like Error, with errno's text appended ("...: No space left on device").
  template <typename... Args>
  static Status Errno(int err, fmt::format_string<Args...> f, Args&&... args) {
    return Status(CodeForErrno(err), err, fmt::format(f, std::forward<Args>(args)...) + ": " + ErrnoText(err));
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  int sys_errno() const { return errno_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Returns this status with `context: ` prepended; OK stays OK.
  Status Wrap(std::string_view context) const;
  // A failure and what its rollback then did: this status, with "; then
  // <what> failed: <its message>" appended when `rollback` failed too (a
  // rollback's failure is never dropped). OK stays OK.
  Status Then(std::string_view what, const Status& rollback) const;

  static Code CodeForErrno(int err);
  static std::string ErrnoText(int err);

 private:
  Status(Code code, int err, std::string message) : code_(code), errno_(err), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  int errno_ = 0;
  std::string message_;
};

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}          // NOLINT: REQUIRES: !status.ok()

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gpusnap

// Early return on failure. For Status-returning expressions.
#define GPUSNAP_RETURN_IF_ERROR(expr)            \
  do {                                           \
    ::gpusnap::Status _st = (expr);              \
    if (!_st.ok()) return _st;                   \
  } while (0)

#define GPUSNAP_CONCAT_INNER(a, b) a##b
#define GPUSNAP_CONCAT(a, b) GPUSNAP_CONCAT_INNER(a, b)
// `GPUSNAP_ASSIGN_OR_RETURN(auto x, Foo());` binds x to Foo()'s value or returns its status.
#define GPUSNAP_ASSIGN_OR_RETURN(lhs, expr) GPUSNAP_ASSIGN_OR_RETURN_IMPL(GPUSNAP_CONCAT(_res_, __LINE__), lhs, expr)
#define GPUSNAP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
