#include "rootfs/diff_writer.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::rootfs {

namespace {

// `rel` beneath `root`, no symbolic link (nor /proc magic link) followed on
// the way, and no other mount entered.
int OpenBeneath(int root, const std::string& rel, int flags) {
  struct open_how how = {};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  return static_cast<int>(::syscall(SYS_openat2, root, rel.empty() ? "." : rel.c_str(), &how, sizeof how));
}

// The names in a directory, sorted (its descriptor stays open and unmoved).
Result<std::vector<std::string>> Names(int dirfd, const std::string& what) {
  int copy = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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

// The xattrs of `name` in `dirfd`, the entry itself (not what a link names).
Result<std::map<std::string, std::string>> Xattrs(int dirfd, const std::string& name, const std::string& what) {
  std::map<std::string, std::string> out;
  std::string path = "/proc/self/fd/" + std::to_string(dirfd) + "/" + name;
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

Status ScanDir(int dirfd, const std::string& rel, const PathMatcher& exclusions, UpperTree& tree) {
  GPUSNAP_ASSIGN_OR_RETURN(std::vector<std::string> names, Names(dirfd, ContainerPath(rel)));
  tree.children[rel] = names;
  for (const std::string& name : names) {
    std::string child = rel.empty() ? name : rel + "/" + name;
    std::string path = ContainerPath(child);
    if (exclusions.Excludes(path)) {
      tree.excluded.push_back(path);
      continue;
    }
    struct stat st;
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // gone while read
      return Status::Errno(errno, "reading `{}` in the writable layer", path);
    }
    UpperEntry e;
    e.path = child;
    e.kind = FileKindOfMode(st.st_mode);
    e.size = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
    e.rdev_major = major(st.st_rdev);
    e.rdev_minor = minor(st.st_rdev);
    GPUSNAP_ASSIGN_OR_RETURN(e.xattrs, Xattrs(dirfd, name, path));
    tree.entries.push_back(std::move(e));
    if (!S_ISDIR(st.st_mode)) continue;
    UniqueFd sub(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub.valid()) return Status::Errno(errno, "opening directory `{}` in the writable layer", path);
    GPUSNAP_RETURN_IF_ERROR(ScanDir(sub.get(), child, exclusions, tree));
  }
  return Status::Ok();
}

struct ArchiveWriteDeleter {
  void operator()(struct archive* a) const { archive_write_free(a); }
};
struct ArchiveReadDeleter {
  void operator()(struct archive* a) const { archive_read_free(a); }
};
struct EntryDeleter {
  void operator()(struct archive_entry* e) const { archive_entry_free(e); }
};
struct ResolverDeleter {
  void operator()(struct archive_entry_linkresolver* r) const { archive_entry_linkresolver_free(r); }
};

std::string ArchiveError(struct archive* a) {
  const char* s = archive_error_string(a);
  return s != nullptr ? s : "unknown libarchive error";
}

}  // namespace

Result<UpperTree> ScanUpperDir(const std::string& upper_dir, const PathMatcher& exclusions) {
  UniqueFd root(::open(upper_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno(errno, "opening the writable layer `{}`", upper_dir);
  UpperTree tree;
  Status st = ScanDir(root.get(), "", exclusions, tree);
  if (!st.ok()) return st.Wrap(fmt::format("reading the writable layer `{}`", upper_dir));
  return tree;
}

Result<std::vector<std::string>> LowerNames(const std::vector<std::string>& lowers, const std::string& dir,
                                            std::string_view overlay_prefix) {
  std::set<std::string> names, hidden;
  const std::string opaque_attr = std::string(overlay_prefix) + "opaque";
  for (const std::string& layer : lowers) {
    UniqueFd root(::open(layer.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid()) return Status::Errno(errno, "opening the lower layer `{}`", layer);
    UniqueFd d(OpenBeneath(root.get(), dir, O_RDONLY | O_DIRECTORY));
    if (!d.valid()) {
      if (errno == ENOENT) continue;  // this layer does not have it
      if (errno == ENOTDIR || errno == ELOOP || errno == EXDEV) break;  // a file, a whiteout or a link hides the rest
      return Status::Errno(errno, "opening `{}` in the lower layer `{}`", ContainerPath(dir), layer);
    }
    GPUSNAP_ASSIGN_OR_RETURN(std::vector<std::string> here, Names(d.get(), layer + "/" + dir));
    for (const std::string& name : here) {
      struct stat st;
      if (::fstatat(d.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {
        hidden.insert(name);
        continue;
      }
      if (!hidden.count(name)) names.insert(name);
    }
    char value[2] = {};
    ssize_t n = ::fgetxattr(d.get(), opaque_attr.c_str(), value, sizeof value);
    if (n == 1 && value[0] == 'y') break;  // the layers below are hidden here
  }
  return std::vector<std::string>(names.begin(), names.end());
}

Result<DiffWritten> WriteRootfsDiff(const std::string& upper_dir, const UpperTree& tree, const DiffPlan& plan,
                                    const DiffFiles& files) {
  UniqueFd root(::open(upper_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno(errno, "opening the writable layer `{}`", upper_dir);
  UniqueFd out(::open(files.tar_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!out.valid()) return Status::Errno(errno, "creating `{}`", files.tar_path);

  std::unique_ptr<struct archive, ArchiveWriteDeleter> a(archive_write_new());
  std::unique_ptr<struct archive_entry_linkresolver, ResolverDeleter> links(archive_entry_linkresolver_new());
  if (!a || !links) return Status::Error(Code::kInternal, "libarchive: out of memory");
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
      archive_write_set_bytes_in_last_block(a.get(), 1) != ARCHIVE_OK ||
      archive_write_open_fd(a.get(), out.get()) != ARCHIVE_OK)
    return Status::Error(Code::kIoError, "starting `{}`: {}", files.tar_path, ArchiveError(a.get()));
  archive_entry_linkresolver_set_strategy(links.get(), archive_format(a.get()));

  DiffWritten written;
  std::vector<char> buffer(1 << 20);
  for (size_t i : plan.archived) {
    const UpperEntry& u = tree.entries[i];
    const std::string path = ContainerPath(u.path);
    int flags = u.kind == FileKind::kDirectory ? O_RDONLY | O_DIRECTORY
                : u.kind == FileKind::kSymlink ? O_PATH | O_NOFOLLOW
                                               : O_RDONLY | O_NOFOLLOW | O_NONBLOCK;
    UniqueFd fd(OpenBeneath(root.get(), u.path, flags));
    if (!fd.valid()) return Status::Errno(errno, "opening `{}` in the writable layer to capture it", path);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return Status::Errno(errno, "reading `{}`", path);
    if (FileKindOfMode(st.st_mode) != u.kind)
      return Status::Error(Code::kFailedPrecondition, "`{}` changed while it was captured (a {}, now a {})", path,
                           FileKindName(u.kind), FileKindName(FileKindOfMode(st.st_mode)));

    std::unique_ptr<struct archive_entry, EntryDeleter> entry(archive_entry_new());
    archive_entry_set_pathname(entry.get(), u.path.c_str());
    archive_entry_copy_stat(entry.get(), &st);
    if (u.kind == FileKind::kSymlink) {
      std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
      ssize_t n = ::readlinkat(fd.get(), "", target.data(), target.size());
      if (n < 0) return Status::Errno(errno, "reading the symbolic link `{}`", path);
      if (static_cast<size_t>(n) >= target.size())
        return Status::Error(Code::kFailedPrecondition, "`{}` changed while it was captured", path);
      target.resize(static_cast<size_t>(n));
      archive_entry_copy_symlink(entry.get(), target.c_str());
    }
    if (u.kind != FileKind::kRegular) archive_entry_set_size(entry.get(), 0);
    for (const auto& [name, value] : ArchivedXattrs(u.xattrs))
      archive_entry_xattr_add_entry(entry.get(), name.c_str(), value.data(), value.size());

    struct archive_entry* e = entry.get();
    struct archive_entry* sparse = nullptr;
    archive_entry_linkify(links.get(), &e, &sparse);
    if (archive_write_header(a.get(), e) < ARCHIVE_WARN)
      return Status::Error(Code::kIoError, "writing `{}` into `{}`: {}", path, files.tar_path, ArchiveError(a.get()));
    ++written.entries;

    if (u.kind == FileKind::kRegular && archive_entry_size(e) > 0) {
      uint64_t left = static_cast<uint64_t>(archive_entry_size(e));
      while (left > 0) {
        ssize_t n = ::read(fd.get(), buffer.data(), std::min<uint64_t>(left, buffer.size()));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Status::Errno(errno, "reading `{}`", path);
        if (n == 0)
          return Status::Error(Code::kFailedPrecondition, "`{}` changed while it was captured (it shrank)", path);
        if (archive_write_data(a.get(), buffer.data(), static_cast<size_t>(n)) != n)
          return Status::Error(Code::kIoError, "writing `{}` into `{}`: {}", path, files.tar_path,
                               ArchiveError(a.get()));
        left -= static_cast<uint64_t>(n);
        written.data_bytes += static_cast<uint64_t>(n);
      }
      struct stat after;
      if (::fstat(fd.get(), &after) != 0) return Status::Errno(errno, "reading `{}`", path);
      if (after.st_size != st.st_size || after.st_mtim.tv_sec != st.st_mtim.tv_sec ||
          after.st_mtim.tv_nsec != st.st_mtim.tv_nsec)
        return Status::Error(Code::kFailedPrecondition, "`{}` changed while it was captured", path);
    }
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK)
    return Status::Error(Code::kIoError, "finishing `{}`: {}", files.tar_path, ArchiveError(a.get()));
  struct stat tar_st;
  if (::fstat(out.get(), &tar_st) != 0) return Status::Errno(errno, "reading `{}`", files.tar_path);
  written.archive_bytes = static_cast<uint64_t>(tar_st.st_size);

  nlohmann::json deleted = plan.deleted;
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(files.deleted_files_path, deleted.dump(2)));
  return written;
}

Result<std::vector<ArchiveEntry>> ListArchive(const std::string& tar_path) {
  std::unique_ptr<struct archive, ArchiveReadDeleter> a(archive_read_new());
  if (!a) return Status::Error(Code::kInternal, "libarchive: out of memory");
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), tar_path.c_str(), 1 << 16) != ARCHIVE_OK)
    return Status::Error(Code::kCorruption, "`{}` cannot be read as a tar archive: {}", tar_path,
                         ArchiveError(a.get()));
  std::vector<ArchiveEntry> out;
  for (;;) {
    struct archive_entry* e = nullptr;
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    // A header that fails its checksum is ARCHIVE_RETRY: corrupt as well.
    if (r == ARCHIVE_RETRY || r < ARCHIVE_WARN)
      return Status::Error(Code::kCorruption, "`{}` is no intact tar archive (after {} entries): {}", tar_path,
                           out.size(), ArchiveError(a.get()));
    ArchiveEntry entry;
    const char* name = archive_entry_pathname(e);
    entry.path = name != nullptr ? name : "";
    entry.kind = FileKindOfMode(archive_entry_filetype(e));
    if (const char* hard = archive_entry_hardlink(e)) {
      entry.hardlink = true;
      entry.link_target = hard;
    } else if (const char* sym = archive_entry_symlink(e)) {
      entry.link_target = sym;
    }
    out.push_back(std::move(entry));
    if (archive_read_data_skip(a.get()) < ARCHIVE_WARN)
      return Status::Error(Code::kCorruption, "`{}` is no intact tar archive (in `{}`): {}", tar_path,
                           out.back().path, ArchiveError(a.get()));
  }
  return out;
}

}  // namespace gpusnap::rootfs
