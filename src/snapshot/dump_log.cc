#include "snapshot/dump_log.h"

#include <filesystem>

#include "util/files.h"

namespace gpusnap {

Status KeepDumpLog(const std::string& store_root, const std::string& id, const std::string& log_path,
                   const Status& failure) {
  std::string kept = store_root + "/logs/" + id + ".dump.log";
  if (!MakeDirs(store_root + "/logs").ok()) return failure;
  std::error_code ec;
  std::filesystem::copy_file(log_path, kept, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return failure;
  std::string message = failure.message();
  if (auto pos = message.find(log_path); pos != std::string::npos) message.replace(pos, log_path.size(), kept);
  return Status::Error(failure.code(), "{}", message);
}

}  // namespace gpusnap
