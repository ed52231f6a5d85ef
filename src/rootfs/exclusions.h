// The paths a rootfs capture leaves out (docs/CAPTURE-PATHS.md,
// "Exclusions"): a pure matcher over container paths.
//
// A pattern is an absolute path of components. A component may hold `*` (any
// run of characters but '/') and `?` (one character), and bracket expressions
// as fnmatch(3) reads them; a component that is exactly `**` matches any
// number of components, none included. A pattern matches a path when it
// matches the path itself or one of its ancestors: excluding a directory
// excludes everything under it.
//
//   /tmp                     /tmp, /tmp/a, /tmp/a/b
//   /root/.cache/*.lock      /root/.cache/x.lock (and under it), not /root/.cache/d/x.lock
//   /**/__pycache__          every __pycache__ directory and what it holds
//   /var/log/**/*.log        /var/log/a.log, /var/log/nginx/access.log
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::rootfs {

class PathMatcher {
 public:
  // kInvalidArgument naming the pattern: not absolute, empty, holding a `.`
  // or `..` component, or a `**` inside a component ("a**b").
  static Result<PathMatcher> Make(const std::vector<std::string>& patterns);

  // The first pattern (as given) that excludes `path`, an absolute container
  // path ("/etc/hosts"); nothing when none does.
  std::optional<std::string> Match(std::string_view path) const;
  bool Excludes(std::string_view path) const { return Match(path).has_value(); }

  const std::vector<std::string>& patterns() const { return patterns_; }

 private:
  std::vector<std::string> patterns_;
  std::vector<std::vector<std::string>> components_;
};

// Pure. Whether container path `path` is `dir` or lies beneath it, by whole
// components ("/a/b" is under "/a", "/ab" is not; every absolute path is
// under "/").
bool IsAtOrUnder(std::string_view path, std::string_view dir);

// What every rootfs capture leaves out, besides the container's own mount
// points: the paths a container runtime mounts or makes in each container
// (its /etc/hosts, /etc/hostname and /etc/resolv.conf, the kernel's
// filesystems, the service account's secrets), whose copy in the writable
// layer is an empty placeholder that must not cover the new container's own.
const std::vector<std::string>& DefaultExclusions();

}  // namespace gpusnap::rootfs
