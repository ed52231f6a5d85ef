#include "rootfs/tree_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "rootfs/archive_handle.h"
#include "rootfs/beneath.h"
#include "util/fd.h"

namespace gpusnap::rootfs {

namespace {

Status ScanDir(int dirfd, const std::string& rel, const TreeOrigin& origin, const PathMatcher& exclusions,
               UpperTree& tree) {
  GPUSNAP_ASSIGN_OR_RETURN(std::vector<std::string> names,
                           DirectoryNames(dirfd, ContainerPathIn(origin.container_root, rel)));
  tree.children[rel] = names;
  for (const std::string& name : names) {
    std::string child = rel.empty() ? name : rel + "/" + name;
    std::string path = ContainerPathIn(origin.container_root, child);
    if (exclusions.Excludes(path)) {
      tree.excluded.push_back(path);
      continue;
    }
    GPUSNAP_ASSIGN_OR_RETURN(std::optional<EntryStat> st, StatEntry(dirfd, name, path));
    if (!st) continue;  // gone while read
    if (st->mount_point)
      return Status::Error(Code::kFailedPrecondition,
                           "`{}` in {} is a mount point: its content is another filesystem's, which a capture does "
                           "not enter; exclude it (or name it as a cache of its own)",
                           path, origin.description);
    UpperEntry e;
    e.path = child;
    e.kind = st->kind;
    e.size = st->size;
    e.rdev_major = st->rdev_major;
    e.rdev_minor = st->rdev_minor;
    GPUSNAP_ASSIGN_OR_RETURN(e.xattrs, EntryXattrs(dirfd, name, path));
    tree.entries.push_back(std::move(e));
    if (st->kind != FileKind::kDirectory) continue;
    UniqueFd sub(OpenBeneath(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
    if (!sub.valid()) return Status::Errno(errno, "opening directory `{}` in {}", path, origin.description);
    GPUSNAP_RETURN_IF_ERROR(ScanDir(sub.get(), child, origin, exclusions, tree));
  }
  return Status::Ok();
}

}  // namespace

Result<UpperTree> ScanTree(int dir_fd, const TreeOrigin& origin, const PathMatcher& exclusions) {
  UpperTree tree;
  GPUSNAP_RETURN_IF_ERROR(ScanDir(dir_fd, "", origin, exclusions, tree));
  return tree;
}

Result<TreeArchiveWritten> WriteTreeArchive(int dir_fd, const TreeOrigin& origin, const UpperTree& tree,
                                            const std::vector<size_t>& archived, const std::string& tar_path) {
  UniqueFd out(::open(tar_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!out.valid()) return Status::Errno(errno, "creating `{}`", tar_path);

  ArchiveWriter a(archive_write_new());
  std::unique_ptr<struct archive_entry_linkresolver, LinkResolverDeleter> links(archive_entry_linkresolver_new());
  if (!a || !links) return Status::Error(Code::kInternal, "libarchive: out of memory");
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
      archive_write_set_bytes_in_last_block(a.get(), 1) != ARCHIVE_OK ||
      archive_write_open_fd(a.get(), out.get()) != ARCHIVE_OK)
    return Status::Error(Code::kIoError, "starting `{}`: {}", tar_path, ArchiveError(a.get()));
  archive_entry_linkresolver_set_strategy(links.get(), archive_format(a.get()));

  TreeArchiveWritten written;
  std::vector<char> buffer(1 << 20);
  for (size_t i : archived) {
    const UpperEntry& u = tree.entries[i];
    const std::string path = ContainerPathIn(origin.container_root, u.path);
    int flags = u.kind == FileKind::kDirectory ? O_RDONLY | O_DIRECTORY
                : u.kind == FileKind::kSymlink ? O_PATH | O_NOFOLLOW
                                               : O_RDONLY | O_NOFOLLOW | O_NONBLOCK;
    UniqueFd fd(OpenBeneath(dir_fd, u.path, flags));
    if (!fd.valid()) return Status::Errno(errno, "opening `{}` in {} to capture it", path, origin.description);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return Status::Errno(errno, "reading `{}`", path);
    if (FileKindOfMode(st.st_mode) != u.kind)
      return Status::Error(Code::kFailedPrecondition, "`{}` changed while it was captured (a {}, now a {})", path,
                           FileKindName(u.kind), FileKindName(FileKindOfMode(st.st_mode)));

    std::unique_ptr<struct archive_entry, ArchiveEntryDeleter> entry(archive_entry_new());
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
      return Status::Error(Code::kIoError, "writing `{}` into `{}`: {}", path, tar_path, ArchiveError(a.get()));
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
          return Status::Error(Code::kIoError, "writing `{}` into `{}`: {}", path, tar_path, ArchiveError(a.get()));
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
    return Status::Error(Code::kIoError, "finishing `{}`: {}", tar_path, ArchiveError(a.get()));
  struct stat tar_st;
  if (::fstat(out.get(), &tar_st) != 0) return Status::Errno(errno, "reading `{}`", tar_path);
  written.archive_bytes = static_cast<uint64_t>(tar_st.st_size);
  return written;
}

}  // namespace gpusnap::rootfs
