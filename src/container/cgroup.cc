#include "container/cgroup.h"

#include <algorithm>
#include <vector>

#include "util/split.h"

namespace gpusnap::container {

namespace {

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool IsFullId(std::string_view s) { return s.size() == 64 && IsLowerHex(s); }

bool StripPrefix(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

bool StripSuffix(std::string_view& s, std::string_view suffix) {
  if (s.size() < suffix.size() || s.substr(s.size() - suffix.size()) != suffix) return false;
  s.remove_suffix(suffix.size());
  return true;
}

// 8-4-4-4-12 hex digits with `sep` between the groups.
bool IsUid(std::string_view s, char sep) {
  static constexpr size_t kGroups[] = {8, 4, 4, 4, 12};
  size_t pos = 0;
  for (size_t i = 0; i < 5; ++i) {
    if (i > 0) {
      if (pos >= s.size() || s[pos] != sep) return false;
      ++pos;
    }
    std::string_view group = s.substr(pos, kGroups[i]);
    if (group.size() != kGroups[i] || !IsLowerHex(group)) return false;
    pos += kGroups[i];
  }
  return pos == s.size();
}

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start < path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash > start) out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

}  // namespace

std::optional<std::string> ContainerIdFromComponent(std::string_view c) {
  if (IsFullId(c)) return std::string(c);
  if (!StripSuffix(c, ".scope")) return std::nullopt;
  for (std::string_view prefix : {"cri-containerd-", "crio-", "docker-", "containerd-"}) {
    std::string_view rest = c;
    if (StripPrefix(rest, prefix) && IsFullId(rest)) return std::string(rest);
  }
  return std::nullopt;
}

std::optional<std::string> PodUidFromComponent(std::string_view c) {
  if (StripPrefix(c, "pod") && IsUid(c, '-')) return std::string(c);
  // systemd driver: kubepods[-<qos>]-pod<uid with '_'>.slice
  if (!StripSuffix(c, ".slice")) return std::nullopt;
  auto pos = c.rfind("-pod");
  if (pos == std::string_view::npos || c.substr(0, 8) != "kubepods") return std::nullopt;
  std::string_view uid = c.substr(pos + 4);
  if (!IsUid(uid, '_')) return std::nullopt;
  std::string out(uid);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

CgroupIdentity ParseProcCgroup(std::string_view text) {
  CgroupIdentity best;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    std::string_view line = text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    start = nl == std::string_view::npos ? text.size() : nl + 1;
    // "hierarchy-id:controllers:path"; the path may itself hold ':'.
    size_t c1 = line.find(':');
    size_t c2 = c1 == std::string_view::npos ? std::string_view::npos : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    CgroupIdentity here;
    for (std::string_view component : SplitPath(line.substr(c2 + 1))) {
      if (auto id = ContainerIdFromComponent(component)) here.container_id = *id;
      if (here.container_id.empty())
        if (auto uid = PodUidFromComponent(component)) here.pod_uid = *uid;
    }
    if (here.container_id.empty()) continue;
    if (best.container_id.empty() || (best.pod_uid.empty() && !here.pod_uid.empty())) best = here;
  }
  return best;
}

std::optional<KubeletLogName> ParseKubeletLogName(std::string_view name) {
  if (!StripSuffix(name, ".log") || name.size() < 66 || name[name.size() - 65] != '-') return std::nullopt;
  KubeletLogName out;
  out.container_id = std::string(name.substr(name.size() - 64));
  if (!IsFullId(out.container_id)) return std::nullopt;
  name.remove_suffix(65);
  // Pod names and namespaces hold no '_'; container names neither.
  size_t u1 = name.find('_');
  size_t u2 = u1 == std::string_view::npos ? std::string_view::npos : name.find('_', u1 + 1);
  if (u2 == std::string_view::npos || name.find('_', u2 + 1) != std::string_view::npos) return std::nullopt;
  out.pod = std::string(name.substr(0, u1));
  out.namespace_name = std::string(name.substr(u1 + 1, u2 - u1 - 1));
  out.container = std::string(name.substr(u2 + 1));
  // Kubernetes names: lowercase letters, digits, '-' and '.'.
  auto k8s_name = [](const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
    });
  };
  if (!k8s_name(out.pod) || !k8s_name(out.namespace_name) || !k8s_name(out.container)) return std::nullopt;
  return out;
}

namespace {

struct CgroupMount {
  std::string_view root;         // the hierarchy's path mounted there
  std::string_view mount_point;
  bool v2 = false;
  std::vector<std::string_view> options;  // v1: the controllers (and name=...)
};

std::vector<CgroupMount> CgroupMounts(std::string_view mountinfo) {
  std::vector<CgroupMount> out;
  for (std::string_view line : Split(mountinfo, '\n')) {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    std::vector<std::string_view> f = Split(line, ' ');
    auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    std::string_view fstype = dash[1];
    if (fstype != "cgroup" && fstype != "cgroup2") continue;
    out.push_back({f[3], f[4], fstype == "cgroup2", Split(dash[3], ',')});
  }
  return out;
}

}  // namespace

std::vector<std::string> CgroupProcsFiles(std::string_view proc_cgroup, std::string_view mountinfo) {
  std::vector<CgroupMount> mounts = CgroupMounts(mountinfo);
  std::vector<std::string> out;
  for (std::string_view line : Split(proc_cgroup, '\n')) {
    size_t c1 = line.find(':'), c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1), path = line.substr(c2 + 1);
    bool v2 = line.substr(0, c1) == "0" && controllers.empty();
    std::vector<std::string_view> wanted = Split(controllers, ',');
    for (const CgroupMount& m : mounts) {
      if (m.v2 != v2) continue;
      if (!v2 && !std::all_of(wanted.begin(), wanted.end(), [&](std::string_view c) {
            return std::find(m.options.begin(), m.options.end(), c) != m.options.end();
          }))
        continue;
      std::string_view rest = path;
      if (m.root != "/" && !(StripPrefix(rest, m.root) && (rest.empty() || rest[0] == '/'))) continue;
      std::string file(m.mount_point);
      file += rest == "/" ? std::string_view() : rest;
      file += "/cgroup.procs";
      if (std::find(out.begin(), out.end(), file) == out.end()) out.push_back(std::move(file));
      break;
    }
  }
  return out;
}

}  // namespace gpusnap::container
