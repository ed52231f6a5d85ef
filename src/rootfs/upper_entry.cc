#include "rootfs/upper_entry.h"

#include <sys/stat.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

namespace gpusnap::rootfs {

const char* FileKindName(FileKind kind) {
  switch (kind) {
    case FileKind::kRegular: return "regular file";
    case FileKind::kDirectory: return "directory";
    case FileKind::kSymlink: return "symbolic link";
    case FileKind::kCharDevice: return "character device";
    case FileKind::kBlockDevice: return "block device";
    case FileKind::kFifo: return "FIFO";
    case FileKind::kSocket: return "socket";
    case FileKind::kUnknown: break;
  }
  return "file of unknown type";
}

FileKind FileKindOfMode(uint32_t st_mode) {
  switch (st_mode & S_IFMT) {
    case S_IFREG: return FileKind::kRegular;
    case S_IFDIR: return FileKind::kDirectory;
    case S_IFLNK: return FileKind::kSymlink;
    case S_IFCHR: return FileKind::kCharDevice;
    case S_IFBLK: return FileKind::kBlockDevice;
    case S_IFIFO: return FileKind::kFifo;
    case S_IFSOCK: return FileKind::kSocket;
    default: return FileKind::kUnknown;
  }
}

const char* DispositionName(Disposition d) {
  switch (d) {
    case Disposition::kKeep: return "keep";
    case Disposition::kWhiteout: return "whiteout";
    case Disposition::kOpaqueDir: return "opaque";
    case Disposition::kSkip: return "skip";
    case Disposition::kRefuse: return "refuse";
  }
  return "?";
}

std::string ContainerPath(std::string_view upper_relative_path) {
  return "/" + std::string(upper_relative_path);
}

std::string ContainerPathIn(std::string_view container_root, std::string_view relative_path) {
  while (container_root.size() > 1 && container_root.back() == '/') container_root.remove_suffix(1);
  if (relative_path.empty()) return std::string(container_root);
  if (container_root.empty() || container_root == "/") return ContainerPath(relative_path);
  return fmt::format("{}/{}", container_root, relative_path);
}

EntryDecision DecideUpperEntry(const UpperEntry& entry, std::string_view overlay_prefix) {
  auto has = [&](std::string_view name) { return entry.xattrs.count(std::string(overlay_prefix) + std::string(name)); };
  auto value = [&](std::string_view name) {
    auto it = entry.xattrs.find(std::string(overlay_prefix) + std::string(name));
    return it == entry.xattrs.end() ? std::string() : it->second;
  };
  const std::string path = ContainerPath(entry.path);
  auto skip = [&](std::string why) { return EntryDecision{Disposition::kSkip, std::move(why)}; };
  auto refuse = [&](std::string why) { return EntryDecision{Disposition::kRefuse, std::move(why)}; };
  switch (entry.kind) {
    case FileKind::kCharDevice:
      if (entry.rdev_major == 0 && entry.rdev_minor == 0) return {Disposition::kWhiteout, {}};
      return refuse(fmt::format("`{}` is a character device ({}:{}): a rootfs capture carries no device nodes into "
                                "another container",
                                path, entry.rdev_major, entry.rdev_minor));
    case FileKind::kRegular:
      if (has("whiteout") && entry.size == 0) return {Disposition::kWhiteout, {}};
      if (has("metacopy"))
        return refuse(fmt::format("`{}` holds only metadata (overlay metacopy): its data is in a lower layer, which "
                                  "a capture of the writable layer does not read",
                                  path));
      return {Disposition::kKeep, {}};
    case FileKind::kDirectory:
      if (has("redirect"))
        return refuse(fmt::format("`{}` is a renamed directory (overlay redirect to `{}`): its content is in a lower "
                                  "layer under another name, which a capture of the writable layer does not read",
                                  path, value("redirect")));
      // "y": opaque. ("x", from 6.7, marks a directory holding xattr
      // whiteouts, which is not opaque.)
      if (value("opaque") == "y") return {Disposition::kOpaqueDir, {}};
      return {Disposition::kKeep, {}};
    case FileKind::kSymlink:
      return {Disposition::kKeep, {}};
    case FileKind::kSocket:
      return skip(fmt::format("`{}` is a socket: it is no state, the workload binds it again", path));
    case FileKind::kFifo:
      return skip(fmt::format("`{}` is a FIFO: it holds no data, the workload makes it again", path));
    case FileKind::kBlockDevice:
      return refuse(fmt::format("`{}` is a block device ({}:{}): a rootfs capture carries no device nodes into "
                                "another container",
                                path, entry.rdev_major, entry.rdev_minor));
    case FileKind::kUnknown:
      break;
  }
  return refuse(fmt::format("`{}` is a file of unknown type", path));
}

EntryDecision DecideCacheEntry(const UpperEntry& entry, std::string_view container_root) {
  const std::string path = ContainerPathIn(container_root, entry.path);
  switch (entry.kind) {
    case FileKind::kRegular:
    case FileKind::kDirectory:
    case FileKind::kSymlink:
      return {Disposition::kKeep, {}};
    case FileKind::kSocket:
      return {Disposition::kSkip, fmt::format("`{}` is a socket: it is no state, the workload binds it again", path)};
    case FileKind::kFifo:
      return {Disposition::kSkip, fmt::format("`{}` is a FIFO: it holds no data, the workload makes it again", path)};
    case FileKind::kCharDevice:
    case FileKind::kBlockDevice:
      return {Disposition::kRefuse,
              fmt::format("`{}` is a {} ({}:{}): a cache archive carries no device nodes into another container", path,
                          FileKindName(entry.kind), entry.rdev_major, entry.rdev_minor)};
    case FileKind::kUnknown:
      break;
  }
  return {Disposition::kRefuse, fmt::format("`{}` is a file of unknown type", path)};
}

std::map<std::string, std::string> ArchivedXattrs(const std::map<std::string, std::string>& xattrs,
                                                  std::string_view overlay_prefix) {
  std::map<std::string, std::string> out;
  for (const auto& [name, v] : xattrs) {
    std::string_view n = name;
    if (n.starts_with(overlay_prefix) || n.starts_with(kTrustedOverlayPrefix) || n.starts_with(kUserOverlayPrefix))
      continue;
    if (n.starts_with("user.") || n == "security.capability" || n == "system.posix_acl_access" ||
        n == "system.posix_acl_default")
      out.emplace(name, v);
  }
  return out;
}

std::vector<std::string> OpaqueDeletions(std::string_view dir, const std::vector<std::string>& upper_names,
                                         const std::vector<std::string>& lower_names) {
  std::set<std::string> upper(upper_names.begin(), upper_names.end());
  std::set<std::string> out;
  for (const auto& name : lower_names) {
    if (name.empty() || name == "." || name == ".." || upper.count(name)) continue;
    out.insert(ContainerPath(dir) + "/" + name);
  }
  return {out.begin(), out.end()};
}

}  // namespace gpusnap::rootfs
