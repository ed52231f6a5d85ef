#include "gpusnap/status.h"

#include <cstring>

namespace gpusnap {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kNotFound: return "NotFound";
    case Code::kAlreadyExists: return "AlreadyExists";
    case Code::kCorruption: return "Corruption";
    case Code::kFailedPrecondition: return "FailedPrecondition";
    case Code::kIoError: return "IoError";
    case Code::kExternal: return "External";
    case Code::kTimeout: return "Timeout";
    case Code::kNotSupported: return "NotSupported";
    case Code::kPermissionDenied: return "PermissionDenied";
    case Code::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return message_;
}

Status Status::Wrap(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, errno_, fmt::format("{}: {}", context, message_));
}

Status Status::Then(std::string_view what, const Status& rollback) const {
  if (ok() || rollback.ok()) return *this;
  return Status(code_, errno_, fmt::format("{}; then {} failed: {}", message_, what, rollback.message_));
}

Code Status::CodeForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ESRCH: return Code::kNotFound;
    case EEXIST: return Code::kAlreadyExists;
    case EINVAL: return Code::kInvalidArgument;
    case ETIMEDOUT: return Code::kTimeout;
    case ENOTSUP: return Code::kNotSupported;
    default: return Code::kIoError;
  }
}

std::string Status::ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (maybe not buf).
  return strerror_r(err, buf, sizeof buf);
}

}  // namespace gpusnap
