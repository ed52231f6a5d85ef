// For unit tests: a fresh directory under /tmp, removed with all it holds when
// the test's fixture goes. Header-only; tests of any layer may use it.
#pragma once

#include <stdlib.h>

#include <string>

#include "util/files.h"

namespace gpusnap {

class TempDir {
 public:
  // /tmp/gpusnap-<prefix>-XXXXXX; path() is empty when it cannot be made.
  explicit TempDir(const std::string& prefix) {
    std::string name = "/tmp/gpusnap-" + prefix + "-XXXXXX";
    if (::mkdtemp(name.data()) != nullptr) path_ = name;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    if (!path_.empty()) (void)RemoveTree(path_);
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace gpusnap
