#include "rootfs/exclusions.h"

#include <fnmatch.h>

#include <algorithm>

namespace gpusnap::rootfs {

namespace {

std::vector<std::string> Components(std::string_view path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash > start) out.emplace_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

// Whether pattern[pi..] matches path[si..k) for some k: the path itself or an
// ancestor of it.
bool MatchFrom(const std::vector<std::string>& pattern, size_t pi, const std::vector<std::string>& path, size_t si) {
  if (pi == pattern.size()) return true;
  if (pattern[pi] == "**") {
    for (size_t s = si; s <= path.size(); ++s)
      if (MatchFrom(pattern, pi + 1, path, s)) return true;
    return false;
  }
  if (si == path.size()) return false;
  if (::fnmatch(pattern[pi].c_str(), path[si].c_str(), 0) != 0) return false;
  return MatchFrom(pattern, pi + 1, path, si + 1);
}

}  // namespace

Result<PathMatcher> PathMatcher::Make(const std::vector<std::string>& patterns) {
  PathMatcher m;
  for (const auto& p : patterns) {
    auto refuse = [&](std::string_view why) {
      return Status::Error(Code::kInvalidArgument, "excluded path `{}` {}", p, why);
    };
    if (p.empty() || p[0] != '/') return refuse("is not an absolute path");
    std::vector<std::string> c = Components(p);
    if (c.empty()) return refuse("would exclude the whole root");
    for (const auto& part : c) {
      if (part == "." || part == "..") return refuse("holds a `.` or `..` component");
      if (part != "**" && part.find("**") != std::string::npos)
        return refuse("holds `**` inside a component (`**` stands alone, for any number of components)");
    }
    if (std::all_of(c.begin(), c.end(), [](const std::string& part) { return part == "**"; }))
      return refuse("would exclude the whole root");
    m.patterns_.push_back(p);
    m.components_.push_back(std::move(c));
  }
  return m;
}

std::optional<std::string> PathMatcher::Match(std::string_view path) const {
  std::vector<std::string> c = Components(path);
  for (size_t i = 0; i < components_.size(); ++i)
    if (MatchFrom(components_[i], 0, c, 0)) return patterns_[i];
  return std::nullopt;
}

const std::vector<std::string>& DefaultExclusions() {
  static const std::vector<std::string> kDefault = {
      "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/proc", "/sys", "/dev",
      "/run/secrets", "/var/run/secrets",
  };
  return kDefault;
}

bool IsAtOrUnder(std::string_view path, std::string_view dir) {
  if (dir == "/") return !path.empty() && path.front() == '/';
  return path == dir || (path.size() > dir.size() && path.substr(0, dir.size()) == dir && path[dir.size()] == '/');
}

}  // namespace gpusnap::rootfs
