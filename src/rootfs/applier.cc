#include "rootfs/applier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <map>

#include <nlohmann/json.hpp>

#include "rootfs/archive_handle.h"
#include "rootfs/beneath.h"
#include "rootfs/diff_writer.h"
#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::rootfs {

namespace {

std::string ParentOf(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

std::string LeafOf(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// What an entry's header says of its inode.
struct Meta {
  uid_t uid = 0;
  gid_t gid = 0;
  mode_t perm = 0;
  struct timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};  // atime, mtime
  std::map<std::string, std::string> xattrs;                      // those ArchivedXattrs keeps
};

Meta MetaOf(struct archive_entry* e) {
  Meta m;
  m.uid = static_cast<uid_t>(archive_entry_uid(e));
  m.gid = static_cast<gid_t>(archive_entry_gid(e));
  m.perm = static_cast<mode_t>(archive_entry_perm(e)) & 07777;
  if (archive_entry_atime_is_set(e)) m.times[0] = {archive_entry_atime(e), archive_entry_atime_nsec(e)};
  if (archive_entry_mtime_is_set(e)) m.times[1] = {archive_entry_mtime(e), archive_entry_mtime_nsec(e)};
  std::map<std::string, std::string> all;
  archive_entry_xattr_reset(e);
  const char* name = nullptr;
  const void* value = nullptr;
  size_t size = 0;
  while (archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK)
    if (name != nullptr) all[name] = std::string(static_cast<const char*>(value), size);
  m.xattrs = ArchivedXattrs(all);
  return m;
}

// A symbolic link or hard link met while reading, made after the pass.
struct Deferred {
  size_t index = 0;
  std::string path;    // normalized
  std::string target;  // a symbolic link's as it is; a hard link's as the archive names it
  Meta meta;
};

struct DirectoryMeta {
  std::string path;
  mode_t perm = 0;
  struct timespec times[2];
};

enum class MissingParent { kMake, kFail, kNothingThere };

// The writes beneath one directory descriptor. Every method names `path`
// (the entry's normalized path) in its errors.
class Writer {
 public:
  explicit Writer(int root) : root_(root) {}

  Status Directory(const std::string& path, const Meta& m) {
    GPUSNAP_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(path, MissingParent::kMake));
    const std::string leaf = LeafOf(path);
    // A directory where the target mounts a volume is the volume's: the
    // archive's copy (the empty directory a runtime made to mount onto in the
    // source) is left out, and nothing goes beneath it.
    GPUSNAP_ASSIGN_OR_RETURN(std::optional<EntryStat> there, StatEntry(parent.get(), leaf, path));
    if (there && there->kind == FileKind::kDirectory && there->mount_point) return Status::Ok();
    GPUSNAP_ASSIGN_OR_RETURN(bool kept, ClearButDirectory(parent.get(), leaf, path));
    // Owner-only until the end: its own mode might forbid writing what goes in it.
    if (!kept && ::mkdirat(parent.get(), leaf.c_str(), 0700) != 0)
      return Status::Errno(errno, "`{}`: making the directory", path);
    UniqueFd fd(OpenBeneath(parent.get(), leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
    if (!fd.valid()) {
      int err = errno;
      return InTheWay(parent.get(), leaf, path, path, err);
    }
    if (::fchown(fd.get(), m.uid, m.gid) != 0) return Status::Errno(errno, "`{}`: setting its owner", path);
    GPUSNAP_RETURN_IF_ERROR(SetXattrs(fd.get(), m, path));
    DirectoryMeta d{path, m.perm, {m.times[0], m.times[1]}};
    directories_.push_back(std::move(d));
    return Status::Ok();
  }

  // Streams the current entry's data from `a` into the file.
  Result<uint64_t> File(const std::string& path, const Meta& m, struct archive* a, struct archive_entry* e) {
    GPUSNAP_ASSIGN_OR_RETURN(UniqueFd parent, RoomFor(path));
    const std::string leaf = LeafOf(path);
    UniqueFd fd(::openat(parent.get(), leaf.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) return Status::Errno(errno, "`{}`: creating the file", path);
    uint64_t written = 0;
    for (;;) {
      const void* block = nullptr;
      size_t size = 0;
      la_int64_t offset = 0;
      int r = archive_read_data_block(a, &block, &size, &offset);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN)
        return Status::Error(Code::kCorruption, "`{}`: its data in the archive is damaged or cut short: {}", path,
                             ArchiveError(a));
      const char* p = static_cast<const char*>(block);
      for (size_t left = size; left > 0;) {
        ssize_t n = ::pwrite(fd.get(), p, left, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Status::Errno(errno, "`{}`: writing its data", path);
        p += n;
        offset += n;
        left -= static_cast<size_t>(n);
      }
      written += size;
    }
    // A hole at the end is no block.
    if (archive_entry_size_is_set(e) && ::ftruncate(fd.get(), static_cast<off_t>(archive_entry_size(e))) != 0)
      return Status::Errno(errno, "`{}`: setting its size", path);
    // The owner first: a change of owner clears set-id bits and file capabilities.
    if (::fchown(fd.get(), m.uid, m.gid) != 0) return Status::Errno(errno, "`{}`: setting its owner", path);
    if (::fchmod(fd.get(), m.perm) != 0) return Status::Errno(errno, "`{}`: setting its mode", path);
    GPUSNAP_RETURN_IF_ERROR(SetXattrs(fd.get(), m, path));
    if (::futimens(fd.get(), m.times) != 0) return Status::Errno(errno, "`{}`: setting its times", path);
    return written;
  }

  Status Symlink(const std::string& path, const std::string& target, const Meta& m) {
    GPUSNAP_ASSIGN_OR_RETURN(UniqueFd parent, RoomFor(path));
    const std::string leaf = LeafOf(path);
    if (::symlinkat(target.c_str(), parent.get(), leaf.c_str()) != 0)
      return Status::Errno(errno, "`{}`: making the symbolic link", path);
    if (::fchownat(parent.get(), leaf.c_str(), m.uid, m.gid, AT_SYMLINK_NOFOLLOW) != 0)
      return Status::Errno(errno, "`{}`: setting its owner", path);
    if (!m.xattrs.empty()) {
      std::string at = "/proc/self/fd/" + std::to_string(parent.get()) + "/" + leaf;
      for (const auto& [name, value] : m.xattrs)
        if (::lsetxattr(at.c_str(), name.c_str(), value.data(), value.size(), 0) != 0)
          return Status::Errno(errno, "`{}`: setting xattr `{}`", path, name);
    }
    if (::utimensat(parent.get(), leaf.c_str(), m.times, AT_SYMLINK_NOFOLLOW) != 0)
      return Status::Errno(errno, "`{}`: setting its times", path);
    return Status::Ok();
  }

  // `target`: the normalized path of the entry it links to.
  Status Hardlink(const std::string& path, const std::string& target) {
    Result<UniqueFd> target_parent = OpenParent(target, MissingParent::kFail);
    if (!target_parent.ok()) return target_parent.status().Wrap(fmt::format("hard link `{}`", path));
    GPUSNAP_ASSIGN_OR_RETURN(UniqueFd parent, RoomFor(path));
    const std::string leaf = LeafOf(path);
    // No AT_SYMLINK_FOLLOW: a link to a symbolic link is a link to the link.
    if (::linkat(target_parent->get(), LeafOf(target).c_str(), parent.get(), leaf.c_str(), 0) != 0)
      return Status::Errno(errno, "`{}`: linking it to `{}`", path, target);
    return Status::Ok();
  }

  // Whether something was there to remove.
  Result<bool> Delete(const std::string& path) {
    GPUSNAP_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(path, MissingParent::kNothingThere));
    if (!parent.valid()) return false;
    const std::string leaf = LeafOf(path);
    GPUSNAP_ASSIGN_OR_RETURN(std::optional<EntryStat> st, StatEntry(parent.get(), leaf, path));
    if (!st) return false;
    GPUSNAP_RETURN_IF_ERROR(Remove(parent.get(), leaf, path, *st));
    return true;
  }

  // Each directory's mode and times, children before parents: after
  // everything made or removed in it, which would move its times.
  Status FinishDirectories() {
    for (auto d = directories_.rbegin(); d != directories_.rend(); ++d) {
      UniqueFd fd(OpenBeneath(root_, d->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
      if (!fd.valid()) {
        if (errno == ENOENT || errno == ENOTDIR) continue;  // a deleted path took it
        return Status::Errno(errno, "`{}`: opening the directory to set its mode and times", d->path);
      }
      if (::fchmod(fd.get(), d->perm) != 0) return Status::Errno(errno, "`{}`: setting its mode", d->path);
      if (::futimens(fd.get(), d->times) != 0) return Status::Errno(errno, "`{}`: setting its times", d->path);
    }
    return Status::Ok();
  }

 private:
  // How a message names `what`, met on the way to `entry` (or `entry` itself).
  static std::string Whose(const std::string& what, const std::string& entry) {
    return what == entry ? fmt::format("`{}`", entry) : fmt::format("`{}`: its parent `{}`", entry, what);
  }

  static Status MountPoint(const std::string& what, const std::string& entry) {
    return Status::Error(Code::kFailedPrecondition,
                         "{} is a mount point (a volume) where the archive is applied; nothing is written into "
                         "another mount",
                         Whose(what, entry));
  }

  // Why `name` in `dir` (at path `what`) could not be opened as a directory
  // on the way to `entry`: `err` explained by what is there.
  static Status InTheWay(int dir, const std::string& name, const std::string& what, const std::string& entry,
                         int err) {
    const std::string whose = Whose(what, entry);
    struct stat st;
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISLNK(st.st_mode)) {
        char target[4096];
        ssize_t n = ::readlinkat(dir, name.c_str(), target, sizeof target - 1);
        std::string to = n >= 0 ? fmt::format(" (to `{}`)", std::string_view(target, static_cast<size_t>(n))) : "";
        return Status::Error(Code::kFailedPrecondition,
                             "{} is a symbolic link{} where the archive is applied; nothing is written through a link",
                             whose, to);
      }
      if (!S_ISDIR(st.st_mode))
        return Status::Error(Code::kFailedPrecondition, "{} is a {} where the archive is applied, not a directory",
                             whose, FileKindName(FileKindOfMode(st.st_mode)));
    }
    if (err == EXDEV) return MountPoint(what, entry);
    return Status::Errno(err, "{}: opening it", whose);
  }

  // The directory that holds `path`, opened beneath the root (O_PATH).
  // With kNothingThere, a parent that is missing or no directory gives an
  // invalid descriptor.
  Result<UniqueFd> OpenParent(const std::string& path, MissingParent missing) {
    const std::string parent = ParentOf(path);
    UniqueFd fd(OpenBeneath(root_, parent, O_PATH | O_DIRECTORY));
    if (fd.valid()) return fd;
    if (parent.empty()) return Status::Errno(errno, "opening the directory the archive is applied to");
    // One name at a time, to make what is missing and to say what is in the way.
    UniqueFd cur(OpenBeneath(root_, "", O_PATH | O_DIRECTORY));
    if (!cur.valid()) return Status::Errno(errno, "opening the directory the archive is applied to");
    for (size_t start = 0; start < parent.size();) {
      size_t slash = parent.find('/', start);
      if (slash == std::string::npos) slash = parent.size();
      const std::string name = parent.substr(start, slash - start);
      const std::string so_far = parent.substr(0, slash);
      start = slash + 1;
      UniqueFd next(OpenBeneath(cur.get(), name, O_PATH | O_DIRECTORY));
      if (!next.valid() && errno == ENOENT && missing == MissingParent::kMake) {
        if (::mkdirat(cur.get(), name.c_str(), 0755) == 0) {
          next.Reset(OpenBeneath(cur.get(), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
          // The umask narrowed it.
          if (next.valid() && ::fchmod(next.get(), 0755) != 0)
            return Status::Errno(errno, "`{}`: making its parent `{}`", path, so_far);
        } else if (errno != EEXIST) {
          return Status::Errno(errno, "`{}`: making its parent `{}`", path, so_far);
        } else {
          next.Reset(OpenBeneath(cur.get(), name, O_PATH | O_DIRECTORY));
        }
      }
      if (!next.valid()) {
        int err = errno;
        // A link gives ELOOP, a mount point EXDEV: those are in the way.
        if (missing == MissingParent::kNothingThere && (err == ENOENT || err == ENOTDIR)) return UniqueFd();
        if (err == ENOENT)
          return Status::Error(Code::kFailedPrecondition, "`{}`: its parent `{}` does not exist", path, so_far);
        return InTheWay(cur.get(), name, so_far, path, err);
      }
      cur = std::move(next);
    }
    return cur;
  }

  // The parent of `path`, made where missing, with what is at `path` removed.
  Result<UniqueFd> RoomFor(const std::string& path) {
    GPUSNAP_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(path, MissingParent::kMake));
    const std::string leaf = LeafOf(path);
    GPUSNAP_ASSIGN_OR_RETURN(std::optional<EntryStat> st, StatEntry(parent.get(), leaf, path));
    if (st) GPUSNAP_RETURN_IF_ERROR(Remove(parent.get(), leaf, path, *st));
    return parent;
  }

  // What is at `leaf` in `parent` removed, unless it is a directory: whether
  // one was kept.
  Result<bool> ClearButDirectory(int parent, const std::string& leaf, const std::string& path) {
    GPUSNAP_ASSIGN_OR_RETURN(std::optional<EntryStat> st, StatEntry(parent, leaf, path));
    if (!st) return false;
    if (st->kind == FileKind::kDirectory && !st->mount_point) return true;
    GPUSNAP_RETURN_IF_ERROR(Remove(parent, leaf, path, *st));
    return false;
  }

  static Status Remove(int parent, const std::string& leaf, const std::string& path, const EntryStat& st) {
    if (st.mount_point) return MountPoint(path, path);
    if (st.kind == FileKind::kDirectory) return RemoveBeneath(parent, leaf, path);
    if (::unlinkat(parent, leaf.c_str(), 0) != 0 && errno != ENOENT)
      return Status::Errno(errno, "`{}`: removing the {} there", path, FileKindName(st.kind));
    return Status::Ok();
  }

  static Status SetXattrs(int fd, const Meta& m, const std::string& path) {
    for (const auto& [name, value] : m.xattrs)
      if (::fsetxattr(fd, name.c_str(), value.data(), value.size(), 0) != 0)
        return Status::Errno(errno, "`{}`: setting xattr `{}`", path, name);
    return Status::Ok();
  }

  int root_;
  std::vector<DirectoryMeta> directories_;
};

}  // namespace

Result<std::vector<std::string>> ReadDeletedFiles(const std::string& path) {
  GPUSNAP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array())
    return Status::Error(Code::kCorruption, "`{}` is not a JSON array of paths", path);
  std::vector<std::string> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string())
      return Status::Error(Code::kCorruption, "`{}`: item {} is a JSON {}, not a path", path, i + 1, j[i].type_name());
    out.push_back(j[i].get<std::string>());
  }
  return out;
}

Result<ExtractionPlan> CheckArchive(const std::string& tar_path, const std::vector<std::string>& deleted_paths,
                                    std::string_view archive_name) {
  Result<std::vector<ArchiveEntry>> entries = ListArchive(tar_path);
  if (!entries.ok()) return entries.status().Wrap(fmt::format("checking `{}`", archive_name));
  ExtractionPlan plan = PlanExtraction(*entries, deleted_paths);
  GPUSNAP_RETURN_IF_ERROR(PlanStatus(plan, archive_name));
  return plan;
}

Result<Applied> ApplyArchive(int dir_fd, const std::string& tar_path, const ExtractionPlan& plan) {
  GPUSNAP_RETURN_IF_ERROR(PlanStatus(plan, tar_path));
  const std::string context = fmt::format("applying `{}`", tar_path);
  auto changed = [&](const std::string& what) {
    return Status::Error(Code::kCorruption, "{}: {}: the archive changed since it was checked", context, what);
  };
  Result<ArchiveReader> opened = OpenTarReader(tar_path);
  if (!opened.ok()) return opened.status().Wrap(context);
  struct archive* a = opened->get();

  // Directories and files as they come, links kept for after the pass; each
  // entry held to the one checked. The plan's order starts with the
  // directories and files in archive order: `next` walks it.
  Writer writer(dir_fd);
  Applied done;
  std::vector<Deferred> symlinks, hardlinks;
  size_t index = 0, next = 0;
  const size_t checked = plan.entries.size();
  if (plan.normalized.size() != checked)
    return Status::Error(Code::kInvalidArgument, "{}: the plan is not one PlanExtraction made", context);
  for (;; ++index) {
    struct archive_entry* e = nullptr;
    int r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF) break;
    if (r == ARCHIVE_RETRY || r < ARCHIVE_WARN)
      return Status::Error(Code::kCorruption, "{}: `{}` is no intact tar archive (after {} entries): {}", context,
                           tar_path, index, ArchiveError(a));
    if (index >= checked) return changed(fmt::format("it holds more than the {} entries checked", checked));
    const ArchiveEntry& expected = plan.entries[index];
    const char* raw = archive_entry_pathname(e);
    const char* hard = archive_entry_hardlink(e);
    const char* symlink = archive_entry_symlink(e);
    ArchiveEntry met;
    met.path = raw != nullptr ? raw : "";
    met.kind = FileKindOfMode(archive_entry_filetype(e));
    met.hardlink = hard != nullptr;
    met.link_target = hard != nullptr ? hard : symlink != nullptr ? symlink : "";
    if (met.path != expected.path)
      return changed(fmt::format("entry {} is `{}`, where the checked archive had `{}`", index + 1, met.path,
                                 expected.path));
    if (met.hardlink != expected.hardlink || (!met.hardlink && met.kind != expected.kind) ||
        met.link_target != expected.link_target)
      return changed(fmt::format("`{}` (entry {}) is not the {} it was", met.path, index + 1,
                                 expected.hardlink ? "hard link" : FileKindName(expected.kind)));
    const std::string& path = plan.normalized[index];
    if (path.empty()) continue;  // the root, left as the target has it
    if (met.hardlink) {
      hardlinks.push_back({index, path, met.link_target, {}});
      continue;
    }
    if (met.kind == FileKind::kSymlink) {
      symlinks.push_back({index, path, met.link_target, MetaOf(e)});
      continue;
    }
    if (next >= plan.order.size() || plan.order[next] != index)
      return Status::Error(Code::kInvalidArgument, "{}: `{}`: the plan's order is not PlanExtraction's", context,
                           path);
    ++next;
    if (met.kind == FileKind::kDirectory) {
      Status st = writer.Directory(path, MetaOf(e));
      if (!st.ok()) return st.Wrap(context);
    } else if (met.kind == FileKind::kRegular) {
      Result<uint64_t> bytes = writer.File(path, MetaOf(e), a, e);
      if (!bytes.ok()) return bytes.status().Wrap(context);
      done.data_bytes += *bytes;
    } else {
      return Status::Error(Code::kInvalidArgument, "{}: `{}` is a {}, which no accepted plan holds", context, path,
                           FileKindName(met.kind));
    }
    ++done.entries;
  }
  if (index != checked) return changed(fmt::format("it holds {} entries, where {} were checked", index, checked));
  for (const std::vector<Deferred>* links : {&symlinks, &hardlinks})
    for (const Deferred& d : *links) {
      if (next >= plan.order.size() || plan.order[next] != d.index)
        return Status::Error(Code::kInvalidArgument, "{}: `{}`: the plan's order is not PlanExtraction's", context,
                             d.path);
      ++next;
    }
  if (next != plan.order.size())
    return Status::Error(Code::kInvalidArgument, "{}: the plan's order is not PlanExtraction's", context);

  for (const Deferred& s : symlinks) {
    Status st = writer.Symlink(s.path, s.target, s.meta);
    if (!st.ok()) return st.Wrap(context);
    ++done.entries;
  }
  for (const Deferred& h : hardlinks) {
    Result<std::string> target = NormalizeArchivePath(h.target);  // accepted by the check: it normalizes
    if (!target.ok()) return target.status().Wrap(context);
    Status st = writer.Hardlink(h.path, *target);
    if (!st.ok()) return st.Wrap(context);
    ++done.entries;
  }
  for (const std::string& d : plan.deletions) {
    Result<bool> removed = writer.Delete(d);
    if (!removed.ok()) return removed.status().Wrap(fmt::format("{}: deleting `/{}`", context, d));
    if (*removed) ++done.deleted;
  }
  Status st = writer.FinishDirectories();
  if (!st.ok()) return st.Wrap(context);
  return done;
}

}  // namespace gpusnap::rootfs
