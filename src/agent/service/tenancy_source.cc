#include "agent/service/tenancy_source.h"

#include <fmt/format.h>

#include <memory>

#include "util/files.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::agent {

namespace {

class TenancyFile {
 public:
  TenancyFile(std::string path, std::function<void(const std::string&)> log)
      : path_(std::move(path)), log_(std::move(log)) {}

  Result<tenancy::TenancyConfig> Read() EXCLUDES(mu_) {
    auto config = Parse();
    MutexLock lock(mu_);
    std::string now = config.ok() ? "" : config.status().ToString();
    if (now != last_error_) {
      log_(now.empty() ? fmt::format("tenancy: `{}` is valid again", path_)
                       : fmt::format("tenancy: {}; what needs it is refused until it is fixed", now));
      last_error_ = now;
    }
    return config;
  }

 private:
  Result<tenancy::TenancyConfig> Parse() const {
    auto text = ReadFile(path_);
    if (!text.ok()) return text.status().Wrap("tenancy configuration");
    return tenancy::ParseTenancyConfig(*text, path_);
  }

  std::string path_;
  std::function<void(const std::string&)> log_;
  Mutex mu_;
  std::string last_error_ GUARDED_BY(mu_);
};

}  // namespace

std::function<Result<tenancy::TenancyConfig>()> MakeTenancySource(const std::string& path,
                                                                  std::function<void(const std::string&)> log) {
  if (path.empty()) return [] { return Result<tenancy::TenancyConfig>(tenancy::TenancyConfig{}); };
  auto file = std::make_shared<TenancyFile>(path, std::move(log));
  return [file] { return file->Read(); };
}

}  // namespace gpusnap::agent
