#include "rootfs/beneath.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>

#include "util/fd.h"

namespace gpusnap::rootfs {

namespace {

int OpenAt2(int dir_fd, const std::string& rel, int flags, uint64_t resolve) {
  struct open_how how = {};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = resolve;
  return static_cast<int>(::syscall(SYS_openat2, dir_fd, rel.empty() ? "." : rel.c_str(), &how, sizeof how));
}

constexpr uint64_t kNoLinks = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

}  // namespace

int OpenBeneath(int dir_fd, const std::string& rel, int flags) {
  return OpenAt2(dir_fd, rel, flags, kNoLinks | RESOLVE_NO_XDEV);
}

int OpenBeneathAcrossMounts(int dir_fd, const std::string& rel, int flags) {
  return OpenAt2(dir_fd, rel, flags, kNoLinks);
}

Result<std::optional<EntryStat>> StatEntry(int dir_fd, const std::string& name, const std::string& what) {
  struct statx stx;
  if (::statx(dir_fd, name.c_str(), AT_SYMLINK_NOFOLLOW, STATX_TYPE | STATX_MODE | STATX_SIZE, &stx) != 0) {
    if (errno == ENOENT) return std::optional<EntryStat>();
    return Status::Errno(errno, "reading `{}`", what);
  }
  EntryStat st;
  st.kind = FileKindOfMode(stx.stx_mode);
  st.size = st.kind == FileKind::kRegular ? stx.stx_size : 0;
  st.rdev_major = stx.stx_rdev_major;
  st.rdev_minor = stx.stx_rdev_minor;
  // statx crosses a mount at the last name even without following links, so
  // what it describes there is the mounted root: the kernel flags it.
  st.mount_point = (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) != 0 &&
                   (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
  return std::optional<EntryStat>(st);
}

Result<std::vector<std::string>> DirectoryNames(int dir_fd, const std::string& what) {
  // A descriptor of its own, so the caller's (maybe O_PATH) keeps its offset.
  int copy = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (copy < 0) return Status::Errno(errno, "reading directory `{}`", what);
  DIR* d = ::fdopendir(copy);
  if (d == nullptr) {
    int err = errno;
    ::close(copy);
    return Status::Errno(err, "reading directory `{}`", what);
  }
  std::vector<std::string> out;
  errno = 0;
  while (struct dirent* de = ::readdir(d)) {
    std::string_view name = de->d_name;
    if (name != "." && name != "..") out.emplace_back(name);
    errno = 0;
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return Status::Errno(err, "reading directory `{}`", what);
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::map<std::string, std::string>> EntryXattrs(int dir_fd, const std::string& name, const std::string& what) {
  std::map<std::string, std::string> out;
  // The directory through its descriptor, the entry by its name in it: the
  // l*xattr calls do not follow the entry if it is a link.
  std::string path = "/proc/self/fd/" + std::to_string(dir_fd) + "/" + name;
  std::string list(1024, '\0');
  for (;;) {
    ssize_t n = ::llistxattr(path.c_str(), list.data(), list.size());
    if (n >= 0) {
      list.resize(static_cast<size_t>(n));
      break;
    }
    if (errno == ENOTSUP) return out;
    if (errno != ERANGE) return Status::Errno(errno, "listing the xattrs of `{}`", what);
    list.assign(list.size() * 4, '\0');
  }
  for (size_t at = 0; at < list.size();) {
    std::string key(list.c_str() + at);
    at += key.size() + 1;
    if (key.empty()) continue;
    std::string value(256, '\0');
    bool present = true;
    for (;;) {
      ssize_t n = ::lgetxattr(path.c_str(), key.c_str(), value.data(), value.size());
      if (n >= 0) {
        value.resize(static_cast<size_t>(n));
        break;
      }
      if (errno == ENODATA) {  // removed meanwhile
        present = false;
        break;
      }
      if (errno != ERANGE) return Status::Errno(errno, "reading xattr `{}` of `{}`", key, what);
      value.assign(value.size() * 4, '\0');
    }
    if (present) out.emplace(std::move(key), std::move(value));
  }
  return out;
}

Status RemoveBeneath(int dir_fd, const std::string& name, const std::string& what) {
  GPUSNAP_ASSIGN_OR_RETURN(std::optional<EntryStat> st, StatEntry(dir_fd, name, what));
  if (!st) return Status::Ok();
  auto mount_point = [&] {
    return Status::Error(Code::kFailedPrecondition,
                         "`{}` is a mount point: nothing in another mount is removed or written", what);
  };
  if (st->mount_point) return mount_point();
  if (st->kind != FileKind::kDirectory) {
    if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT)
      return Status::Errno(errno, "removing `{}`", what);
    return Status::Ok();
  }
  UniqueFd sub(OpenBeneath(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
  if (!sub.valid()) {
    if (errno == ENOENT) return Status::Ok();
    if (errno == EXDEV) return mount_point();
    return Status::Errno(errno, "opening directory `{}` to remove it", what);
  }
  GPUSNAP_ASSIGN_OR_RETURN(std::vector<std::string> names, DirectoryNames(sub.get(), what));
  for (const std::string& child : names) GPUSNAP_RETURN_IF_ERROR(RemoveBeneath(sub.get(), child, what + "/" + child));
  if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
    return Status::Errno(errno, "removing directory `{}`", what);
  return Status::Ok();
}

}  // namespace gpusnap::rootfs
